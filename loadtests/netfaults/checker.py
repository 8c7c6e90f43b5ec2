"""The history checker of a fault run: what every part recorded, read at the end, and
the proof that nothing was lost, doubled or done by a deposed leader. Pure: the readers
are in ``loadtests.netfaults.history``.

The record (:class:`History`): each request as the load client saw it (:class:`Sent`),
how many times the usage ledgers hold each request id, the terms of leading and the
provider actions (``warm_pool.fencing``: each written under its term), the provider's
instances with the term that launched them, the workers' accepted control calls and
their assignments, and the faults with when each began and was healed. Every time is
seconds since the epoch on one clock (the processes share a kernel; the database's clock
is that machine's too).

The checks (:func:`check`):
- **lost**: a request that never ended, or ended in an error that is not OpenAI-shaped;
- **unmetered** and **duplicated**: a completed request the ledgers do not hold, or any
  request they hold twice;
- **stale**: a provider action written under a term after a newer term began, an
  instance whose launch no action of its term recorded, a worker's accepted call of a
  term after a newer one began;
- **overlaps**: a worker holding two assignments at once;
- **double launches**: two instances, or two completed launches, for one decision.
Per fault: the requests sent while it lasted (and until the next began), the errors by
kind, the findings, the takeover (the first new term after it began) and the time from
its healing until every request completes again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from warm_pool.fencing import Action, Term


@dataclass(frozen=True)
class Sent:
    """One request as the client saw it end (``outcome`` ``none``: it never did)."""

    id: str  # its x-request-id, unique per request
    activator: str
    sent_at: float
    ended_at: float | None
    outcome: Literal["complete", "error", "none"]
    status: int | None = None  # HTTP status of an error answer
    kind: str | None = None  # the error's type (OpenAI ``error.type``, or ``connection``...)
    shaped: bool = True  # an error answered with OpenAI's error object (or SSE error event)


@dataclass(frozen=True)
class Fault:
    name: str
    began_at: float
    healed_at: float


@dataclass(frozen=True)
class Launched:
    """An instance the provider has (or had), with the term that launched it."""

    worker_id: str
    instance_id: str
    term: int | None


@dataclass(frozen=True)
class Accepted:
    """A control call a worker accepted (and acted on)."""

    worker_id: str
    at: float
    term: int | None
    kind: str


@dataclass(frozen=True)
class Held:
    """An assignment a worker held, from its start to its end (None: still held)."""

    worker_id: str
    assignment_id: str
    began_at: float
    ended_at: float | None


@dataclass
class History:
    sent: list[Sent]
    ledger: Counter[str]  # request id -> records holding it, over every activator's ledger
    terms: list[Term]
    actions: list[Action]
    faults: list[Fault]
    instances: list[Launched] = field(default_factory=list)
    accepted: list[Accepted] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """One fault's line."""

    fault: str
    requests: int
    errors: dict[str, int]  # kind -> count
    lost: int
    duplicated: int
    stale: int
    takeover_s: float | None  # from the fault to the first new term (None: none began)
    whole_after_s: float | None  # from its healing until every request completes (None: never)
    p50_s: float | None = None  # the complete requests' latency, send to end of stream
    max_s: float | None = None


@dataclass
class Report:
    rows: list[Row]
    lost: list[str]  # request ids
    unmetered: list[str]
    duplicated: list[str]
    stale: list[str]  # what took effect, in words
    overlaps: list[str]
    double_launches: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unmetered or self.duplicated or self.stale or self.overlaps
                    or self.double_launches)

    def table(self) -> str:
        """One line per fault, then the totals."""
        head = (f"{'fault':<28} {'requests':>8} {'lost':>5} {'dup':>4} {'stale':>5} {'takeover':>9} {'whole':>7} "
                f"{'p50':>6} {'max':>6}  errors")
        lines = [head]
        for r in self.rows:
            errs = ", ".join(f"{k}={n}" for k, n in sorted(r.errors.items())) or "-"
            lines.append(f"{r.fault:<28} {r.requests:>8} {r.lost:>5} {r.duplicated:>4} {r.stale:>5} "
                         f"{_s(r.takeover_s):>9} {_s(r.whole_after_s):>7} {_s(r.p50_s):>6} {_s(r.max_s):>6}  {errs}")
        lines.append(f"lost {len(self.lost)}, unmetered {len(self.unmetered)}, duplicated {len(self.duplicated)}, "
                     f"stale {len(self.stale)}, overlapping assignments {len(self.overlaps)}, "
                     f"double launches {len(self.double_launches)}")
        return "\n".join(lines)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s" if x < 1 else f"{x:.1f}s"


def newer_term_began(terms: Sequence[Term], term: int | None, at: float) -> Term | None:
    """The first term newer than ``term`` that began at or before ``at`` (None: ``term``
    still led then, or had no successor yet). A None term (one controller alone) is
    never deposed."""
    if term is None:
        return None
    return next((t for t in sorted(terms, key=lambda t: t.term) if t.term > term and t.began_at <= at), None)


def stale_acts(h: History) -> list[str]:
    out = []
    for a in h.actions:
        if (newer := newer_term_began(h.terms, a.term, a.at)) is not None:
            out.append(f"{a.kind} of {a.worker_id} by {a.controller} in term {a.term} at {a.at:.3f}, "
                       f"after term {newer.term} began at {newer.began_at:.3f}")
    recorded = {(a.term, a.worker_id) for a in h.actions if a.kind == "launch"}
    for i in h.instances:
        if i.term is not None and (i.term, i.worker_id) not in recorded:
            out.append(f"instance {i.instance_id} of {i.worker_id} launched in term {i.term} with no action recorded")
    for c in h.accepted:
        if (newer := newer_term_began(h.terms, c.term, c.at)) is not None:
            out.append(f"{c.kind} accepted by {c.worker_id} in term {c.term} at {c.at:.3f}, "
                       f"after term {newer.term} began at {newer.began_at:.3f}")
    return out


def overlapping(held: Iterable[Held]) -> list[str]:
    out = []
    by_worker: dict[str, list[Held]] = {}
    for x in held:
        by_worker.setdefault(x.worker_id, []).append(x)
    for worker, xs in by_worker.items():
        xs.sort(key=lambda x: x.began_at)
        for prev, nxt in zip(xs, xs[1:], strict=False):
            if prev.ended_at is None or prev.ended_at > nxt.began_at:
                out.append(f"{worker} held {prev.assignment_id} and {nxt.assignment_id} at once "
                           f"(from {nxt.began_at:.3f})")
    return out


def double_launches(h: History) -> list[str]:
    out = []
    for wid, n in Counter(i.worker_id for i in h.instances).items():
        if n > 1:
            out.append(f"{n} instances for {wid}")
    done = Counter(a.worker_id for a in h.actions if a.kind == "launch" and a.outcome == "done")
    out += [f"{n} completed launches for {wid}" for wid, n in done.items() if n > 1]
    return out


def is_lost(s: Sent) -> bool:
    return s.outcome == "none" or (s.outcome == "error" and not s.shaped)


def whole_after(sent: Sequence[Sent], healed_at: float, until: float) -> float | None:
    """Seconds from ``healed_at`` until the first request from which every one sent
    before ``until`` completed (0: none failed after the healing; None: the last failed)."""
    window = sorted((s for s in sent if s.sent_at < until), key=lambda s: s.sent_at)
    failed = [s for s in window if s.sent_at >= healed_at and s.outcome != "complete"]
    if not failed:
        return 0.0
    last = failed[-1]
    after = [s for s in window if s.sent_at > last.sent_at]
    return after[0].sent_at - healed_at if after else None


def latency(sent: Sequence[Sent]) -> dict[str, float | None]:
    """The median and the longest time from send to end of the complete requests."""
    took = sorted(s.ended_at - s.sent_at for s in sent if s.outcome == "complete" and s.ended_at is not None)
    if not took:
        return {"p50_s": None, "max_s": None}
    return {"p50_s": took[len(took) // 2], "max_s": took[-1]}


def check(h: History, end_at: float) -> Report:
    """The report of ``h``, a run that ended at ``end_at``."""
    lost = [s.id for s in h.sent if is_lost(s)]
    unmetered = [s.id for s in h.sent if s.outcome == "complete" and h.ledger[s.id] == 0]
    duplicated = [rid for rid, n in h.ledger.items() if n > 1]
    stale = stale_acts(h)
    rows = []
    faults = sorted(h.faults, key=lambda f: f.began_at)
    for k, f in enumerate(faults):
        until = faults[k + 1].began_at if k + 1 < len(faults) else end_at
        mine = [s for s in h.sent if f.began_at <= s.sent_at < until]
        took = next((t for t in sorted(h.terms, key=lambda t: t.term) if t.began_at >= f.began_at), None)
        rows.append(Row(
            fault=f.name, requests=len(mine),
            errors=dict(Counter(s.kind or "unknown" for s in mine if s.outcome != "complete")),
            lost=sum(is_lost(s) for s in mine), duplicated=sum(h.ledger[s.id] > 1 for s in mine),
            stale=sum(1 for a in h.actions if f.began_at <= a.at < until and newer_term_began(h.terms, a.term, a.at))
            + sum(1 for c in h.accepted if f.began_at <= c.at < until and newer_term_began(h.terms, c.term, c.at)),
            takeover_s=took.began_at - f.began_at if took is not None and took.began_at < until else None,
            whole_after_s=whole_after(mine, f.healed_at, until), **latency(mine)))
    return Report(rows=rows, lost=lost, unmetered=unmetered, duplicated=duplicated, stale=stale,
                  overlaps=overlapping(h.held), double_launches=double_launches(h))
