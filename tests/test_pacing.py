"""The list budget shared by the processes of one machine (``airflow_gpumarket.pacing``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from airflow_gpumarket import pacing

INTERVAL = 10.0  # slots are only booked here, never waited for: the clock barely moves during a test

BOOK_FIVE = """
import json, sys, time
from airflow_gpumarket.pacing import SharedPacer
pacer = SharedPacer("https://gpu.example", "key-1", "list_instances")
print(json.dumps([time.time() + pacer.book(float(sys.argv[1])) for _ in range(5)]))
"""


def test_processes_of_one_machine_that_share_a_key_book_one_budget_between_them(tmp_path, monkeypatch):
    """Two processes booking at once: ten slots, each one interval after the one before, whoever booked it."""
    import json

    monkeypatch.setenv(pacing.PACING_DIR_ENV, str(tmp_path))
    runs = [
        subprocess.Popen([sys.executable, "-c", BOOK_FIVE, str(INTERVAL)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    slots = sorted(slot for run in runs for slot in json.loads(run.communicate(timeout=60)[0]))
    gaps = [later - earlier for earlier, later in zip(slots, slots[1:], strict=False)]
    assert len(slots) == 10 and all(INTERVAL - 0.5 < gap < INTERVAL + 0.5 for gap in gaps), gaps


def test_another_key_or_server_has_a_budget_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv(pacing.PACING_DIR_ENV, str(tmp_path))
    first = pacing.SharedPacer("https://gpu.example", "key-1", "list_instances")
    assert first.book(INTERVAL) == 0
    assert first.book(INTERVAL) > INTERVAL - 1
    assert pacing.SharedPacer("https://gpu.example", "key-2", "list_instances").book(INTERVAL) == 0
    assert pacing.SharedPacer("https://other.example", "key-1", "list_instances").book(INTERVAL) == 0
    assert pacing.SharedPacer("https://gpu.example", "key-1", "destroy_instance").book(INTERVAL) == 0


def test_the_slot_file_never_shows_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv(pacing.PACING_DIR_ENV, str(tmp_path))
    pacing.SharedPacer("https://gpu.example", "secret-key-value", "list_instances").book(INTERVAL)
    (path,) = tmp_path.iterdir()
    assert "secret" not in path.name and "secret" not in path.read_text()


def test_a_folder_that_cannot_be_written_falls_back_to_pacing_this_process_alone(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(pacing.PACING_DIR_ENV, str(blocker / "pacing"))
    pacer = pacing.SharedPacer("https://gpu.example", "key-1", "list_instances")
    assert pacer.book(INTERVAL) == 0 and not pacer.shared
    assert pacer.book(INTERVAL) == pytest.approx(INTERVAL, abs=0.5)


def test_a_slot_booked_under_a_clock_far_ahead_is_not_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv(pacing.PACING_DIR_ENV, str(tmp_path))
    pacer = pacing.SharedPacer("https://gpu.example", "key-1", "list_instances")
    pacer.book(INTERVAL)
    (path,) = tmp_path.iterdir()
    path.write_text(f"{time.time() + 86_400:.6f}")  # a clock that was set back a day since
    assert pacer.book(INTERVAL) == 0
