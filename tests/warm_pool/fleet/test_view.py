"""The controller's view of a worker: one pure function of the facts, as a table."""

from __future__ import annotations

import pytest

from thaw.wire import WorkerState, WorkerStatus
from warm_pool.fleet.view import Intent, WorkerFacts, derive_view, view_valid_until
from warm_pool.providers.provider import Instance, InstanceState

S = WorkerState
NOW = 1000.0
BOOT, SILENT = 300.0, 15.0


def inst(state: InstanceState = InstanceState.RUNNING, launched_at: float = NOW - 10,
         exit_code: int | None = None) -> Instance:
    return Instance("i-1", "w1", "gpu", launched_at, state, exit_code=exit_code)


def status(state: WorkerState, assignment_id: str | None = None, model: str | None = None) -> WorkerStatus:
    return WorkerStatus(worker_id="w1", instance_id="i-1", shape="gpu", state=state, control_url="http://w1",
                        model=model, assignment_id=assignment_id, started_at=NOW - 60, state_since=NOW - 5)


def facts(**kw: object) -> WorkerFacts:
    return WorkerFacts("w1", "gpu", **kw)  # type: ignore[arg-type]


CASES = [
    ("launch asked, no instance yet", facts(launch_requested_at=NOW - 1), S.LAUNCHING),
    ("instance, no heartbeat, within boot timeout", facts(instance=inst()), S.STARTING),
    # launched 301 s ago > boot_timeout 300 s
    ("no heartbeat past boot timeout", facts(instance=inst(launched_at=NOW - 301)), S.UNREACHABLE),
    # adopted 10 s ago: silent for less than worker_timeout (15 s), whatever its launch
    ("adopted, launched long ago, waiting for its first heartbeat",
     facts(instance=inst(launched_at=NOW - 3600), adopted_at=NOW - 10), S.STARTING),
    ("adopted and silent past worker_timeout",
     facts(instance=inst(launched_at=NOW - 3600), adopted_at=NOW - 16), S.UNREACHABLE),
    ("local process exited", facts(instance=inst(InstanceState.EXITED, exit_code=-9),
                                   status=status(S.READY, "a1", "m"), heard_at=NOW), S.UNREACHABLE),
    ("stopped instance", facts(instance=inst(InstanceState.STOPPED)), S.STOPPED),
    ("heartbeat says standby", facts(instance=inst(), status=status(S.STANDBY), heard_at=NOW - 1), S.STANDBY),
    # 16 s since the last heartbeat > worker_timeout 15 s
    ("heartbeat too old", facts(instance=inst(), status=status(S.READY, "a1", "m"), heard_at=NOW - 16),
     S.UNREACHABLE),
    ("assign sent, not reflected yet", facts(instance=inst(), status=status(S.STANDBY), heard_at=NOW,
                                             intent=Intent("assign", NOW - 1, "m", "a2")), S.LOADING),
    ("assign reflected: the worker's word", facts(instance=inst(), status=status(S.READY, "a2", "m"),
                                                  heard_at=NOW, intent=Intent("assign", NOW - 1, "m", "a2")),
     S.READY),
    ("assign failed on the worker", facts(instance=inst(), status=status(S.FAILED, "a2", "m"), heard_at=NOW,
                                          intent=Intent("assign", NOW - 1, "m", "a2")), S.FAILED),
    # 16 s > INTENT_TTL_S (15 s): the heartbeat wins again
    ("assign never reflected, expired", facts(instance=inst(), status=status(S.STANDBY), heard_at=NOW,
                                              intent=Intent("assign", NOW - 16, "m", "a2")), S.STANDBY),
    ("release sent", facts(instance=inst(), status=status(S.READY, "a1", "m"), heard_at=NOW,
                           intent=Intent("release", NOW, "m", "a1")), S.DRAINING),
    ("release done", facts(instance=inst(), status=status(S.STANDBY), heard_at=NOW,
                           intent=Intent("release", NOW - 1, "m", "a1")), S.STANDBY),
    ("sleep sent", facts(instance=inst(), status=status(S.READY, "a1", "m"), heard_at=NOW,
                         intent=Intent("sleep", NOW, "m", "a1")), S.ASLEEP),
    ("self-registered worker (no instance)", facts(status=status(S.STANDBY), heard_at=NOW), S.STANDBY),
]


@pytest.mark.parametrize(("name", "f", "expected"), CASES, ids=[c[0] for c in CASES])
def test_derive_view(name: str, f: WorkerFacts, expected: WorkerState) -> None:
    v = derive_view(f, NOW, boot_timeout_s=BOOT, worker_timeout_s=SILENT)
    assert v.state is expected


def test_an_intent_shows_its_model_and_assignment() -> None:
    v = derive_view(facts(instance=inst(), status=status(S.STANDBY), heard_at=NOW,
                          intent=Intent("assign", NOW, "llama", "llama-e1-3")),
                    NOW, boot_timeout_s=BOOT, worker_timeout_s=SILENT)
    assert (v.model, v.assignment_id) == ("llama", "llama-e1-3")


def test_reasons_say_what_happened() -> None:
    exited = derive_view(facts(instance=inst(InstanceState.EXITED, exit_code=137)), NOW,
                         boot_timeout_s=BOOT, worker_timeout_s=SILENT)
    assert exited.error == "worker process exited with status 137"
    late = derive_view(facts(instance=inst(launched_at=NOW - 400)), NOW, boot_timeout_s=BOOT,
                       worker_timeout_s=SILENT)
    assert late.error == "did not register within 300 s of its launch"


@pytest.mark.parametrize(("name", "f", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_view_holds_until_the_first_time_its_rules_compare_with(
        name: str, f: WorkerFacts, expected: WorkerState) -> None:
    # The controller keeps each worker's last view while its facts are the same and
    # that time has not come (warm_pool.fleet.facts): derived anew at any moment before
    # it, the view is the same; past it, at least one rule may answer otherwise.
    v = derive_view(f, NOW, boot_timeout_s=BOOT, worker_timeout_s=SILENT)
    until = view_valid_until(f, v, NOW, boot_timeout_s=BOOT, worker_timeout_s=SILENT)
    if v.state is S.UNREACHABLE:
        assert until < NOW
        return
    assert until > NOW
    for t in (NOW + (until - NOW) * k / 8 for k in range(8)) if until != float("inf") else (NOW + 1e6,):
        assert derive_view(f, t, boot_timeout_s=BOOT, worker_timeout_s=SILENT) == v, t
