"""Provider registration, read by Airflow through the ``apache_airflow_provider`` entry point.

Plain data and the defaults of ``api`` (no imports of hooks or operators), so ``airflow providers list`` stays
cheap. The connection form is declared here (``conn-fields``/``ui-field-behaviour``, the Airflow 3.2+ way); the
hook's ``get_ui_field_behaviour``/``get_connection_form_widgets`` hand the same declaration to Airflow 2.11's
webserver. Its defaults are the hook's own (``api.REQUEST_TIMEOUT_SECONDS``, ``api.RetryPolicy``).
"""

from __future__ import annotations

from airflow_gpumarket import __version__, api

#: The one integration every hook, operator, sensor and trigger of the provider belongs to.
INTEGRATION = "GPU Market"


#: The connection form: read by Airflow 3.2+ from the provider info, by Airflow 2.11 through the hook's methods.
CONNECTION_FORM: dict = {
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "login", "port", "extra"],
        "relabeling": {"host": "Base URL", "password": "API key"},
        "placeholders": {
            "host": "https://api.example.com (or http://127.0.0.1:PORT for the simulator)",
            "password": "API key from the web console",
        },
    },
    "conn-fields": {
        "timeout": {
            "label": "Request timeout (s)",
            "description": "Seconds to wait for each HTTP response.",
            "schema": {"type": ["number", "null"], "default": api.REQUEST_TIMEOUT_SECONDS, "minimum": 1},
        },
        "max_retries": {
            "label": "Max retries",
            "description": "Retries of a failed read, stop or destroy (429, 5xx, connection errors).",
            "schema": {"type": ["integer", "null"], "default": api.RetryPolicy.max_retries, "minimum": 0},
        },
        "retry_min_wait": {
            "label": "First retry wait (s)",
            "description": "Backoff doubles from here, with jitter; a Retry-After header wins.",
            "schema": {"type": ["number", "null"], "default": api.RetryPolicy.min_wait, "minimum": 0},
        },
        "retry_max_wait": {
            "label": "Longest retry wait (s)",
            "schema": {"type": ["number", "null"], "default": api.RetryPolicy.max_wait, "minimum": 0},
        },
        "rate_limit_scale": {
            "label": "Rate limit scale",
            "description": "Creates, destroys and instance lists are paced machine-wide to the published budgets "
            "times this (default 1); 0 paces nothing. The simulator prints the value that fits it.",
            "schema": {"type": ["number", "null"], "default": 1.0, "minimum": 0},
        },
        "ca_bundle": {
            "label": "CA bundle path",
            "description": "Path to a CA bundle for TLS verification (verification is always on).",
            "schema": {"type": ["string", "null"]},
        },
    },
}


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-gpumarket",
        "name": "GPU Market",
        "description": "Rent GPU machines on a GPU marketplace from Airflow: run work through the instance's "
        "onstart script, with destroy guaranteed when anything fails.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "tags": ["service"],
            }
        ],
        "extra-links": ["airflow_gpumarket.ui.links.GpuRentalLink"],
        "plugins": [{"name": "gpumarket", "plugin-class": "airflow_gpumarket.ui.plugin.GpuMarketPlugin"}],
        "config": {
            "gpumarket": {
                "description": "The GPU rentals page in the Airflow UI (Airflow 3.1+), and where tasks reach the "
                "budget ledger.",
                "options": {
                    "ui_connections": {
                        "description": "Comma-separated ids of the connections whose instances the page lists. "
                        "Empty: every connection of type gpumarket in the metadata database, plus "
                        "gpumarket_default when it resolves from an environment variable or a secrets backend.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "gpumarket_default,gpumarket_team_b",
                        "default": "",
                    },
                    "ledger_url": {
                        "description": "The api-server's base URL, where Airflow 3 task processes reach the budget "
                        "ledger (the provider's plugin routes under /gpumarket/ledger). Empty: the host of "
                        "[core] execution_api_server_url, else [api] base_url.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "http://airflow-api-server:8080",
                        "default": "",
                    },
                },
            }
        },
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_gpumarket.hooks.gpumarket"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_gpumarket.operators.create_instance",
                    "airflow_gpumarket.operators.reaper",
                    "airflow_gpumarket.operators.run_job",
                    "airflow_gpumarket.operators.search",
                    "airflow_gpumarket.operators.serverless",
                    "airflow_gpumarket.operators.service",
                    "airflow_gpumarket.operators.spend_report",
                    "airflow_gpumarket.operators.teardown",
                    "airflow_gpumarket.operators.volumes",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_gpumarket.sensors.credit",
                    "airflow_gpumarket.sensors.instances",
                    "airflow_gpumarket.sensors.price_increases",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_gpumarket.triggers.instances",
                    "airflow_gpumarket.triggers.offer_wait",
                    "airflow_gpumarket.triggers.offers",
                    "airflow_gpumarket.triggers.price_increases",
                    "airflow_gpumarket.triggers.services",
                ],
            }
        ],
        "notifications": ["airflow_gpumarket.notifications.credit.GpuMarketLowCreditNotifier"],
        # Airflow 3.2+ imports this function whenever its CLI starts: the commands' own modules load when one runs.
        "cli": ["airflow_gpumarket.commands.definition.get_gpumarket_cli_commands"],
        "task-decorators": [
            {"class-name": "airflow_gpumarket.decorators.gpumarket.gpumarket_task", "name": "gpumarket"},
        ],
        "connection-types": [
            {
                "connection-type": "gpumarket",
                "hook-class-name": "airflow_gpumarket.hooks.gpumarket.GpuMarketHook",
                "hook-name": "GPU Market",
                **CONNECTION_FORM,
            }
        ],
    }
