"""The history checker (loadtests/netfaults/checker.py): each finding it must make, on
histories built here, and a deliberately unfenced action of a deposed leader, written
to a real PostgreSQL and read back as a fault run's history is, reported as stale."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

from loadtests.netfaults.checker import (
    Accepted,
    Fault,
    Held,
    History,
    Launched,
    Sent,
    check,
    newer_term_began,
    whole_after,
)
from loadtests.netfaults.history import read_fencing, read_worker_log
from warm_pool.db import Db
from warm_pool.fencing import Action, ActionLog, Deposed, LeaseFence, Term
from warm_pool.leader import LeaseStore
from warm_pool.persist import ControllerStore

TERMS = [Term(1, "a", "http://a", 100.0), Term(2, "b", "http://b", 200.0)]


def ok(rid: str, at: float) -> Sent:
    return Sent(rid, "act-1", at, at + 0.5, "complete")


def action(term: int, at: float, kind: str = "launch", worker: str = "w-1", outcome: str | None = "done") -> Action:
    return Action(uuid.uuid4().hex, "a" if term == 1 else "b", term, at, kind, worker, None, "cpu", outcome, at + 1)


def history(**kw: object) -> History:
    base: dict[str, object] = {"sent": [], "ledger": Counter(), "terms": TERMS, "actions": [], "faults": []}
    return History(**{**base, **kw})  # type: ignore[arg-type]


def test_a_clean_history_passes() -> None:
    sent = [ok(f"r{i}", 150.0 + i) for i in range(5)]
    h = history(sent=sent, ledger=Counter(s.id for s in sent), actions=[action(1, 150.0), action(2, 250.0, "terminate")],
                instances=[Launched("w-1", "i-1", 1)], accepted=[Accepted("w-1", 190.0, 1, "assign")],
                held=[Held("w-1", "x", 150.0, 160.0), Held("w-1", "y", 160.0, None)])
    report = check(h, end_at=300.0)
    assert report.ok, report


def test_lost_unmetered_and_duplicated_requests_are_found() -> None:
    sent = [ok("done", 150.0), ok("unmetered", 151.0),
            Sent("never-ended", "act-1", 152.0, None, "none"),
            Sent("bare-error", "act-2", 153.0, 154.0, "error", 502, "connection", shaped=False),
            Sent("clean-error", "act-2", 155.0, 156.0, "error", 503, "service_unavailable", shaped=True)]
    report = check(history(sent=sent, ledger=Counter({"done": 2, "clean-error": 1})), end_at=300.0)
    assert report.lost == ["never-ended", "bare-error"]
    assert report.unmetered == ["unmetered"]
    assert report.duplicated == ["done"]
    assert not report.ok


def test_actions_of_a_deposed_term_are_stale() -> None:
    h = history(actions=[action(1, 199.0), action(1, 201.0, worker="w-2")],
                instances=[Launched("w-1", "i-1", 1), Launched("w-3", "i-3", 2)],
                accepted=[Accepted("w-1", 199.5, 1, "assign"), Accepted("w-1", 200.5, 1, "release")])
    report = check(h, end_at=300.0)
    assert len(report.stale) == 3, report.stale
    assert "launch of w-2 by a in term 1" in report.stale[0] and "term 2 began" in report.stale[0]
    assert "w-3 launched in term 2 with no action recorded" in report.stale[1]
    assert "release accepted by w-1 in term 1" in report.stale[2]
    # One controller leading alone has no term: never deposed.
    assert newer_term_began(TERMS, None, 1e9) is None


def test_two_assignments_at_once_and_two_launches_for_one_decision_are_found() -> None:
    h = history(held=[Held("w-1", "x", 10.0, 20.0), Held("w-1", "y", 15.0, 30.0), Held("w-2", "z", 10.0, None),
                      Held("w-2", "q", 40.0, None)],
                instances=[Launched("w-1", "i-1", 1), Launched("w-1", "i-2", 1)],
                actions=[action(1, 150.0), action(1, 151.0)])
    report = check(h, end_at=300.0)
    assert len(report.overlaps) == 2
    assert report.double_launches == ["2 instances for w-1", "2 completed launches for w-1"]


def test_each_fault_gets_its_line_with_takeover_and_recovery() -> None:
    failing = Sent("f1", "act-1", 205.0, 206.0, "error", 503, "service_unavailable")
    sent = [ok("a1", 190.0), failing, ok("a2", 207.0), ok("b1", 260.0)]
    h = history(sent=sent, ledger=Counter(s.id for s in sent if s.outcome == "complete"),
                faults=[Fault("leader cut from postgres", 195.0, 204.0), Fault("activator cut", 250.0, 255.0)])
    report = check(h, end_at=300.0)
    first, second = report.rows
    assert (first.fault, first.requests, first.errors, first.lost) == ("leader cut from postgres", 2,
                                                                      {"service_unavailable": 1}, 0)
    assert first.takeover_s == 5.0  # term 2 began at 200
    assert first.whole_after_s == 3.0  # from 204 until a2 at 207, after the last failure
    assert second.takeover_s is None and second.whole_after_s == 0.0
    assert "leader cut from postgres" in report.table() and "service_unavailable=1" in report.table()
    # A run whose last request failed was never whole again.
    assert whole_after([failing], 204.0, 300.0) is None


def test_an_unfenced_action_of_a_deposed_leader_is_reported(postgres_url: str) -> None:
    # A leader deposed (its lease expired and taken with term 2) that writes a launch with
    # its fence left out, as a bug would: the checker, reading the database, reports it.
    db = Db.postgres(postgres_url)
    ControllerStore(db)
    leases = LeaseStore(Db.postgres(postgres_url))
    assert leases.claim("a", "http://a", 30.0)[1]
    fenced_a = ActionLog(Db.postgres(postgres_url), "a", LeaseFence("a", lambda: 1))
    fenced_a.begin(1, "launch", worker_id="w-1", shape="cpu")
    with db.write(fenced=False) as tx:
        tx.execute("UPDATE controller_lease SET expires_at = 0")
    assert leases.claim("b", "http://b", 30.0)[1]
    try:
        fenced_a.begin(1, "launch", worker_id="w-2", shape="cpu")
        raise AssertionError("the fence let a deposed term act")
    except Deposed:
        pass
    terms, actions = read_fencing(postgres_url)
    assert check(history(terms=terms, actions=actions), end_at=1e10).ok

    unfenced_a = ActionLog(Db.postgres(postgres_url), "a", None)  # the injected bug
    unfenced_a.begin(1, "launch", worker_id="w-3", shape="cpu")
    terms, actions = read_fencing(postgres_url)
    report = check(history(terms=terms, actions=actions), end_at=1e10)
    assert not report.ok
    assert len(report.stale) == 1 and "launch of w-3 by a in term 1" in report.stale[0], report.stale


def test_a_workers_log_gives_its_accepted_calls_and_assignments(tmp_path: Path) -> None:
    # Its JSON log as the worker writes it: an assignment held from loading until it is
    # back to standby; one that follows another with no release between overlaps it.
    def line(event: str, second: int, **kw: object) -> str:
        return json.dumps({"event": event, "timestamp": f"2026-12-07T00:00:{second:02d}.000000Z", **kw})

    log = tmp_path / "w1.log"
    log.write_text("\n".join([
        "not json", line("control_accepted", 1, path="/assign", term=3),
        line("worker_state", 1, state="loading", assignment_id="a"),
        line("worker_state", 3, state="ready", assignment_id="a"),
        line("worker_state", 5, state="draining", assignment_id="a"),
        line("worker_state", 6, state="starting", assignment_id=None),
        line("worker_state", 8, state="standby", assignment_id=None),
        line("worker_state", 9, state="loading", assignment_id="b"),
        line("worker_state", 10, state="loading", assignment_id="c"),
    ]) + "\n")
    accepted, held = read_worker_log(log, "w1")
    base = 1796601600.0  # 2026-12-07T00:00:00Z
    assert accepted == [Accepted("w1", base + 1, 3, "/assign")]
    assert held == [Held("w1", "a", base + 1, base + 6), Held("w1", "b", base + 9, None),
                    Held("w1", "c", base + 10, None)]
    assert len(check(history(held=held), end_at=base + 60).overlaps) == 1
