"""`thaw pool status` as text: a worker that packs shows its packed engines under it, with
the memory each holds and what the worker holds of its capacity."""

from __future__ import annotations

from thaw.cli.status import render_pool
from thaw.units import GiB


def test_packed_engines_are_listed_under_their_worker_with_their_memory() -> None:
    state = {
        "now": 100.0, "controller_epoch": "e1", "adopted": True, "shapes": [], "models": [],
        "workers": [
            {"id": "w-1", "instance_id": "i-1", "control_url": "http://w-1", "state": "ready", "model": "demo",
             "age_s": 50},
            {"id": "w-2", "instance_id": "i-2", "control_url": "http://w-2", "state": "standby", "model": None,
             "age_s": 20},
            {"id": "w-1.tuned-1", "instance_id": "i-1", "control_url": "http://w-1/engines/w-1.tuned-1",
             "state": "ready", "model": "tuned", "age_s": 5},
        ],
        "worker_details": [
            {"id": "w-1", "shape": "cpu", "capacity_bytes": 12 * GiB, "memory_bytes": 3 * GiB},
            {"id": "w-2", "shape": "cpu"},
            {"id": "w-1.tuned-1", "shape": "cpu", "host_worker_id": "w-1", "memory_bytes": 2 * GiB},
        ],
    }
    lines = render_pool(state).splitlines()
    at = {line.split()[0 if not line.strip().startswith("+") else 1]: i for i, line in enumerate(lines)
          if line.strip() and line.strip().split()[0] in ("w-1", "w-2", "+")}
    assert at["w-1"] < at["w-1.tuned-1"] < at["w-2"]  # under its worker, not a worker of its own
    assert "memory: 5.0 GiB of 12.0 GiB held by 2 engine(s) (its own 3.0 GiB)" in lines[at["w-1"] + 1]
    assert lines[at["w-1.tuned-1"]].strip().startswith("+ w-1.tuned-1")
    assert lines[at["w-1.tuned-1"]].endswith("2.0 GiB")


def test_adapters_are_listed_with_their_state_and_a_failure_with_its_reason() -> None:
    state = {
        "now": 100.0, "controller_epoch": "e1", "adopted": True, "shapes": [], "models": [],
        "workers": [{"id": "w-1", "instance_id": "i-1", "control_url": "http://w-1", "state": "ready",
                     "model": "demo", "age_s": 50}],
        "worker_details": [{"id": "w-1", "shape": "cpu", "adapters": [
            {"model": "a1", "served_model_name": "a1", "state": "ready", "since": 90.0, "requested_at": 89.0},
            {"model": "a2", "served_model_name": "a2", "state": "failed", "since": 95.0, "requested_at": 94.0,
             "error": "FetchError: no thaw-manifest.json"}]}],
    }
    text = render_pool(state)
    assert "adapters: a1 (ready), a2 (failed)" in text
    assert "a2 failed: FetchError: no thaw-manifest.json" in text


def test_the_batch_queue_is_shown_with_its_lines_and_the_standby_time_lent() -> None:
    base = {"now": 100.0, "controller_epoch": "e1", "adopted": True, "models": [], "workers": [],
            "worker_details": []}
    shape = {"shape": "cpu", "provider": "local", "counts": {"standby": 1, "ready": 1}, "standby_min": 1,
             "standby_max": 2, "max_instances": 4, "budget_usd_per_hour": None, "spend_usd_per_hour": 0.0,
             "standby_lent_to_batch": 1, "standby_batch_share": 0.25}
    text = render_pool({**base, "shapes": [shape], "batch": {
        "batches": {"in_progress": 2, "completed": 5}, "lines": {"pending": 30, "leased": 4, "done": 12, "refused": 2, "failed": 1}}})
    assert "batch: 1 standby lent now; 25% of standby time since start" in text
    assert "batch: 2 in_progress; lines 30 queued, 4 running, 12 done, 3 failed" in text
    # Nothing running: no batch line (ended batches are history, in thaw batches ls).
    assert "lines" not in render_pool({**base, "shapes": [], "batch": {"batches": {"completed": 5}, "lines": {}}})
