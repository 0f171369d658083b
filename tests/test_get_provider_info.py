"""Provider registration: get_provider_info() is valid for Airflow and matches the hook."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path

import airflow
import jsonschema
import pytest

from airflow_gpumarket import __version__
from airflow_gpumarket.get_provider_info import get_provider_info
from airflow_gpumarket.hooks.connection import settings_from_connection
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

AIRFLOW_DIR = Path(airflow.__file__).parent


def _gpumarket_connection_type(info: dict) -> dict:
    (conn_type,) = [c for c in info["connection-types"] if c["connection-type"] == "gpumarket"]
    return conn_type


def test_provider_info_validates_against_airflow_provider_info_schema():
    schema = json.loads((AIRFLOW_DIR / "provider_info.schema.json").read_text())

    jsonschema.validate(get_provider_info(), schema)


def test_connection_types_validate_against_airflow_provider_yaml_schema():
    """provider_info.schema.json does not describe conn-fields/ui-field-behaviour; provider.yaml's schema does."""
    schema = json.loads((AIRFLOW_DIR / "provider.yaml.schema.json").read_text())

    jsonschema.validate(get_provider_info()["connection-types"], schema["properties"]["connection-types"])


def test_provider_info_names_package_and_version():
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-gpumarket"
    assert info["versions"][0] == __version__
    assert info["name"] and info["description"]


def test_provider_info_names_the_hook_class_which_is_importable():
    conn_type = _gpumarket_connection_type(get_provider_info())
    module_name, _, class_name = conn_type["hook-class-name"].rpartition(".")

    hook_class = getattr(importlib.import_module(module_name), class_name)

    assert hook_class is GpuMarketHook
    assert hook_class.conn_type == conn_type["connection-type"]
    assert hook_class.hook_name == conn_type["hook-name"]


def test_provider_info_hook_modules_are_importable():
    modules = [m for h in get_provider_info()["hooks"] for m in h["python-modules"]]
    assert "airflow_gpumarket.hooks.gpumarket" in modules
    for module in modules:
        importlib.import_module(module)


def test_entry_point_points_at_get_provider_info():
    (ep,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_gpumarket")]
    assert ep.load() is get_provider_info


class _RecordingExtra(Mapping):
    """An empty extras mapping that records every name the hook looks up."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return default

    def __getitem__(self, key):
        self.read.add(key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_conn_fields_keys_match_what_the_hook_reads():
    extra = _RecordingExtra()

    settings_from_connection("gpumarket_default", "https://api.example.com", None, "key", extra)

    conn_fields = set(_gpumarket_connection_type(get_provider_info())["conn-fields"])
    assert set(extra.read) == conn_fields


@pytest.mark.parametrize("name", ["timeout", "max_retries", "retry_min_wait", "retry_max_wait"])
def test_conn_field_defaults_match_the_hook_defaults(name):
    field = _gpumarket_connection_type(get_provider_info())["conn-fields"][name]
    settings = settings_from_connection("c", "https://api.example.com", None, "key", {})
    actual = {
        "timeout": settings.timeout,
        "max_retries": settings.retry.max_retries,
        "retry_min_wait": settings.retry.min_wait,
        "retry_max_wait": settings.retry.max_wait,
    }[name]

    assert field["schema"]["default"] == actual


def test_ui_field_behaviour_labels_host_and_password():
    behaviour = _gpumarket_connection_type(get_provider_info())["ui-field-behaviour"]
    assert behaviour["relabeling"] == {"host": "Base URL", "password": "API key"}
    assert "host" not in behaviour["hidden-fields"]
    assert "password" not in behaviour["hidden-fields"]


def test_every_module_list_names_the_one_declared_integration():
    info = get_provider_info()
    declared = {i["integration-name"] for i in info["integrations"]}
    used = {entry["integration-name"] for kind in ("hooks", "operators", "sensors", "triggers") for entry in info[kind]}
    assert declared == used == {"GPU Market"}


def test_connection_form_reaches_airflow_from_one_declaration_on_2_11_and_3():
    """Airflow 3.2+ reads the form from the provider info; Airflow 2.11 asks the hook's own methods, which hand it
    the same declaration (2.11's webserver takes only integer, string, password and boolean fields)."""
    from airflow.providers_manager import ProvidersManager

    from airflow_gpumarket.get_provider_info import CONNECTION_FORM

    manager = ProvidersManager()
    behaviour = manager.field_behaviours["gpumarket"]
    declared = CONNECTION_FORM["ui-field-behaviour"]
    assert behaviour["hidden_fields"] == declared["hidden-fields"]
    assert behaviour["relabeling"] == {"host": "Base URL", "password": "API key"}
    assert behaviour["placeholders"] == declared["placeholders"]
    extras = {name for name in manager.connection_form_widgets if name.startswith("extra__gpumarket__")}
    assert extras == {f"extra__gpumarket__{name}" for name in CONNECTION_FORM["conn-fields"]}


def _public_classes(package: str, suffix: str) -> set[str]:
    """The modules of ``package`` that define a public ``GpuMarket...<suffix>`` class (base classes left out)."""
    found = set()
    for path in sorted((Path(__file__).resolve().parent.parent / package.replace(".", "/")).glob("*.py")):
        text = path.read_text()
        if any(
            line.startswith("class GpuMarket")
            and line.split("(")[0].endswith(suffix)
            and "Base" not in line.split("(")[0]
            for line in text.splitlines()
        ):
            found.add(f"{package}.{path.stem}")
    return found


@pytest.mark.parametrize(
    ("kind", "package", "suffix"),
    [("operators", "airflow_gpumarket.operators", "Operator"), ("sensors", "airflow_gpumarket.sensors", "Sensor")],
)
def test_every_operator_and_sensor_module_is_registered_and_importable(kind, package, suffix):
    registered = {m for entry in get_provider_info()[kind] for m in entry["python-modules"]}
    assert registered == _public_classes(package, suffix)
    for module in registered:
        importlib.import_module(module)


def test_every_notifier_is_registered_by_its_class_which_is_an_airflow_notifier():
    from airflow_gpumarket._compat import BaseNotifier

    registered = get_provider_info()["notifications"]
    assert {path.rpartition(".")[0] for path in registered} == _public_classes(
        "airflow_gpumarket.notifications", "Notifier"
    )
    for path in registered:
        module, _, name = path.rpartition(".")
        assert issubclass(getattr(importlib.import_module(module), name), BaseNotifier)


def test_airflows_example_dag_discovery_imports_the_provider_and_finds_no_example_dags(monkeypatch):
    manager = pytest.importorskip("airflow.dag_processing.bundles.manager")
    discover = getattr(manager, "_add_provider_example_dags_to_bundle", None)
    if discover is None:
        pytest.skip("this Airflow discovers no example DAGs of providers")
    failures: list[tuple] = []
    monkeypatch.setattr(manager.log, "exception", lambda *args, **kwargs: failures.append(args))
    bundles: list = []
    discover(bundles)
    assert [args for args in failures if "gpumarket" in str(args)] == []
    assert [bundle.name for bundle in bundles if "gpumarket" in bundle.name] == []
