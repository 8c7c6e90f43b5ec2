"""Reading a fault run's history (``loadtests.netfaults.checker.History``) from where each
part left it: the load client's log (JSON lines, one per request), the activators' usage
ledgers, the state database (terms and provider actions) and the workers' logs (accepted
control calls and assignments)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from activator.ledger import query_usage
from loadtests.netfaults.checker import Accepted, Held, Sent
from warm_pool.db import Db
from warm_pool.fencing import Action, ActionLog, Term


def read_fencing(state_url: str) -> tuple[list[Term], list[Action]]:
    """The terms of leading and the provider actions, from the state database."""
    db = Db.postgres(state_url)
    try:
        log = ActionLog(db, "checker", None)
        return log.terms(), log.actions()
    finally:
        db.close()


def read_sent(path: Path) -> list[Sent]:
    """The load client's log (``loadtests.netfaults.client``)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(Sent(id=d["id"], activator=d["activator"], sent_at=d["sent_at"], ended_at=d.get("ended_at"),
                            outcome=d["outcome"], status=d.get("status"), kind=d.get("kind"),
                            shaped=d.get("shaped", True)))
    return out


def read_ledgers(paths: Iterable[Path]) -> Counter[str]:
    """How many records hold each request id, over the activators' local ledgers."""
    counts: Counter[str] = Counter()
    for p in paths:
        if p.exists():
            counts.update(str(r["request_id"]) for r in query_usage(p))
    return counts


def read_worker_log(path: Path, worker_id: str) -> tuple[list[Accepted], list[Held]]:
    """A worker's accepted control calls (``control_accepted``, with the term they carried)
    and the assignments it held (``worker_state``: from loading to standby or failed),
    from its JSON log (``--log-format json``: each line's ISO ``timestamp``)."""
    accepted: list[Accepted] = []
    held: list[Held] = []
    current: tuple[str, float] | None = None
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        event, stamp = e.get("event"), e.get("timestamp")
        at = datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else None
        if event == "control_accepted" and at is not None:
            accepted.append(Accepted(worker_id, float(at), e.get("term"), str(e.get("path"))))
        elif event == "worker_state" and at is not None:
            aid = e.get("assignment_id")
            if current is not None and aid and aid != current[0]:
                # Another assignment with no release between: the first was never let go.
                held.append(Held(worker_id, current[0], current[1], None))
                current = None
            elif current is not None and (aid != current[0] or e.get("state") in ("standby", "failed")):
                held.append(Held(worker_id, current[0], current[1], float(at)))
                current = None
            if current is None and aid and e.get("state") in ("loading", "ready"):
                current = (str(aid), float(at))
    if current is not None:
        held.append(Held(worker_id, current[0], current[1], None))
    return accepted, held
