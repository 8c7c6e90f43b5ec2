"""A worker's status (``worker.status``): one pure function of its facts and state.
What belongs to an assignment shows only with one; the engine's URL only while ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.parts import assignment, settings
from thaw.wire import WorkerState, WorkerStatus
from worker.state import Facts, Prebuilt, derive_state
from worker.status import prebuilt_view, worker_status

URL = "http://10.0.0.7:8123"


def status(tmp_path: Path, f: Facts) -> WorkerStatus:
    return worker_status(settings(tmp_path, instance_id="i-1"), f, derive_state(f), started_at=1.0,
                         state_since=2.0, engine_url=URL, cached=[], load_bytes_per_s={"s3": 5.0}, engines=["p1"],
                         adapters=[])


def test_standing_by_shows_no_assignment_and_no_engine(tmp_path: Path) -> None:
    st = status(tmp_path, Facts(host_running=True, host_imported=True))
    assert (st.state, st.worker_id, st.instance_id, st.started_at, st.state_since) == (
        WorkerState.STANDBY, "w1", "i-1", 1.0, 2.0)
    assert (st.model, st.assignment_id, st.engine_url, st.batch, st.load, st.prebuilt) == (
        None, None, None, False, None, None)
    assert st.phases.assigned is None and st.load_bytes_per_s == {"s3": 5.0} and st.engines == ["p1"]


@pytest.mark.parametrize(("ready_at", "state", "url"), [
    (None, WorkerState.LOADING, None),  # no route to an engine that does not answer yet
    (105.0, WorkerState.READY, URL),
])
def test_the_engine_url_shows_only_while_ready(tmp_path: Path, ready_at: float | None, state: WorkerState,
                                               url: str | None) -> None:
    f = Facts(host_running=True, host_imported=True, assignment=assignment(), launched_at=101.0,
              engine_ready_at=ready_at)
    st = status(tmp_path, f)
    assert (st.state, st.engine_url, st.model, st.assignment_id) == (state, url, "demo", "a1")
    assert (st.phases.assigned, st.phases.engine_ready) == (100.0, ready_at)


@pytest.mark.parametrize(("failure", "kind", "shown"), [
    ("engine exited", "memory", "memory"),
    ("engine exited", "no-such-kind", "engine"),  # an engine host's word we do not know
    ("engine exited", None, "engine"),
    (None, "memory", None),  # a kind without a failure says nothing
])
def test_the_failure_kind_is_one_the_wire_knows(tmp_path: Path, failure: str | None, kind: str | None,
                                                shown: str | None) -> None:
    st = status(tmp_path, Facts(assignment=assignment(), failure=failure, failure_kind=kind))
    assert (st.error, st.failure_kind) == (failure, shown)


def test_a_kept_engine_is_building_until_built() -> None:
    building = Prebuilt("llama-c1", "v", "base", "s3://thaw/models/base", 8123)
    view = prebuilt_view(building)
    assert view is not None and (view.state, view.built_at, view.park_steps_s) == ("building", None, None)
    parked = Prebuilt("llama-c1", "v", "demo", "s3://thaw/models/demo", 8123, built_at=50.0,
                      park_steps_s={"total_s": 0.2})
    view = prebuilt_view(parked)
    assert view is not None and (view.state, view.model, view.park_steps_s) == ("ready", "demo", {"total_s": 0.2})
    assert prebuilt_view(None) is None
