"""The controller's view of each worker, derived by one pure function from facts.

Nothing assigns a worker's state in the controller. It records what it learns — what
the provider says of the instance, the worker's last heartbeat (or answer to a control
call), the control call it has just made (an *intent* the worker has not yet
reflected) — and :func:`derive_view` computes the state the policy sees, as
``worker.state.derive_state`` does on the worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from thaw.wire import WorkerState, WorkerStatus
from warm_pool.policy.decide import WorkerView
from warm_pool.providers.provider import Instance, InstanceState

# An intent the worker has not reflected after this long no longer counts: the next
# heartbeat is the truth again (a call that failed clears its intent at once).
INTENT_TTL_S = 15.0


@dataclass(frozen=True)
class Intent:
    """A control call the controller made and the worker may not have reflected yet."""

    kind: Literal["assign", "release", "sleep", "stop", "start", "prebuild", "adapter_load", "adapter_unload"]
    at: float
    model: str | None
    assignment_id: str | None
    # prebuild: the engine class asked for.
    engine_class: str | None = None
    # assign: the memory the engine will hold (counted before the worker says so), and
    # the model's registry revision it was asked for.
    memory_bytes: int = 0
    revision: int | None = None
    # assign: batch work (AssignRequest.batch).
    batch: bool = False


@dataclass(frozen=True)
class WorkerFacts:
    """Independent observations of one worker; each changes in one place
    (:meth:`warm_pool.fleet.facts.FleetFacts.observe`)."""

    worker_id: str
    shape: str
    # A launch was asked of the provider and has not answered yet.
    launch_requested_at: float | None = None
    # What the provider says of the machine (None: launching, or a worker that
    # registered itself on a local pool).
    instance: Instance | None = None
    # The worker's last word about itself (heartbeat or answer to a call), and when.
    status: WorkerStatus | None = None
    heard_at: float | None = None
    intent: Intent | None = None
    # When a restarted controller found this instance at the provider.
    adopted_at: float | None = None
    # When a stopped instance was started again (its boot timeout counts from then).
    restarted_at: float | None = None
    # A packed engine: the worker it runs in (it has no instance of its own).
    host: str | None = None
    # Adapter loads and unloads asked of it (``model`` names the adapter), each shown
    # until its status reflects it or INTENT_TTL_S passes; several may be under way.
    adapter_intents: tuple[Intent, ...] = ()


def adapter_states(status: WorkerStatus | None, intents: tuple[Intent, ...], now: float) -> tuple[tuple[str, str], ...]:
    """The adapters a worker's engine holds, with those asked for and not yet reflected
    (a load shows as loading, an unload as unloading), so no decision repeats them."""
    states = {a.model: a.state for a in status.adapters} if status is not None else {}
    for i in intents:
        if now - i.at >= INTENT_TTL_S or i.model is None:
            continue
        if i.kind == "adapter_load" and i.model not in states:
            states[i.model] = "loading"
        elif i.kind == "adapter_unload" and states.get(i.model) in ("loading", "ready"):
            states[i.model] = "unloading"
    return tuple(sorted(states.items()))


def reflects(status: WorkerStatus, intent: Intent) -> bool:
    """Whether the worker's status already shows the effect of ``intent``."""
    if intent.kind == "assign":
        return status.assignment_id == intent.assignment_id
    if intent.kind == "release":
        return status.assignment_id != intent.assignment_id or status.state is WorkerState.DRAINING
    if intent.kind == "sleep":
        return status.assignment_id != intent.assignment_id or status.state is WorkerState.ASLEEP
    if intent.kind == "prebuild":
        return status.prebuilt is not None or status.state is not WorkerState.STANDBY
    return False  # stop and start are reflected by the provider, not the worker


def derive_view(f: WorkerFacts, now: float, *, boot_timeout_s: float, worker_timeout_s: float) -> WorkerView:
    """The worker's state for these facts.

    Precedence: the provider's word on the machine (an exited process, a stopped
    instance) wins; then a worker never heard from is ``launching`` or ``starting``
    until its boot timeout; a worker silent for ``worker_timeout_s`` is
    ``unreachable``; a control call not yet reflected shows its effect (``loading``,
    ``draining``, ``asleep``), so the next decision does not repeat it; else the
    worker's own report.
    """
    inst, st = f.instance, f.status
    # What the worker last said it holds (its disk and host memory outlive any state).
    cached = tuple(st.cached) if st is not None else ()
    rates = tuple(sorted(st.load_bytes_per_s.items())) if st is not None else ()
    # The engine it keeps across assignments; one asked for and not yet reflected is
    # shown as building, so the next decision does not ask again.
    built = st.prebuilt if st is not None else None
    i = f.intent
    if built is None and i is not None and i.kind == "prebuild" and now - i.at < INTENT_TTL_S \
            and not (st is not None and reflects(st, i)):
        prebuilt: tuple[str | None, bool] = (i.engine_class, False)
    else:
        prebuilt = (built.engine_class, built.state == "ready") if built is not None else (None, False)

    def view(state: WorkerState, model: str | None = None, assignment_id: str | None = None,
             error: str | None = None, since: float | None = None, memory: int | None = None) -> WorkerView:
        served = st is not None and st.assignment_id == assignment_id and st.phases.engine_ready is not None
        if memory is None:
            memory = (st.memory_bytes or 0) if st is not None and st.assignment_id is not None else 0
        # The revision its assignment serves: the worker's word, else the call's.
        revision = (st.revision if st is not None and assignment_id is not None and st.assignment_id == assignment_id
                    else i.revision if i is not None and assignment_id is not None and i.assignment_id == assignment_id
                    else None)
        # Batch work (preempted by any other assignment): the worker's word, else the call's.
        batch = (st.batch if st is not None and assignment_id is not None and st.assignment_id == assignment_id
                 else i.batch if i is not None and assignment_id is not None and i.assignment_id == assignment_id
                 else False)
        return WorkerView(f.worker_id, f.shape, state, model, assignment_id, error, since, cached, rates, served,
                          *prebuilt, host=f.host, memory_bytes=memory, revision=revision, batch=batch,
                          capacity_bytes=(st.capacity_bytes or 0) if st is not None else 0,
                          adapters=adapter_states(st, f.adapter_intents, now) if state is WorkerState.READY else (),
                          failure_kind=st.failure_kind if st is not None and state is WorkerState.FAILED else None)

    fresh = i is not None and now - i.at < INTENT_TTL_S
    if f.host is not None and (st is None or f.heard_at is None):
        # A packed engine asked for and not heard from yet: loading while the call is
        # fresh; one that never reports is gone (its worker never started it).
        if i is not None and i.kind == "assign" and fresh:
            return view(WorkerState.LOADING, i.model, i.assignment_id, memory=i.memory_bytes)
        return view(WorkerState.UNREACHABLE, error="the packed engine never reported")

    last_model = st.model if st else None
    last_assignment = st.assignment_id if st else None
    if inst is None and f.launch_requested_at is not None:
        return view(WorkerState.LAUNCHING)
    if i is not None and inst is not None and now - i.at < INTENT_TTL_S:
        # Asked of the provider: shown until the provider's listing says it happened.
        if i.kind == "stop" and inst.state not in (InstanceState.STOPPING, InstanceState.STOPPED):
            return view(WorkerState.STOPPED)
        if i.kind == "start" and inst.state in (InstanceState.STOPPING, InstanceState.STOPPED):
            return view(WorkerState.STARTING)
    if inst is not None and inst.state is InstanceState.EXITED:
        code = "unknown" if inst.exit_code is None else inst.exit_code
        return view(WorkerState.UNREACHABLE, last_model, last_assignment, f"worker process exited with status {code}")
    if inst is not None and inst.state in (InstanceState.STOPPED, InstanceState.STOPPING):
        return view(WorkerState.STOPPED)
    if st is None or f.heard_at is None:
        started = inst.launched_at if inst is not None else now
        if f.restarted_at is not None:
            started = max(started, f.restarted_at)
        deadline = max(started + boot_timeout_s, (f.adopted_at or 0.0) + worker_timeout_s)
        if now > deadline:
            return view(WorkerState.UNREACHABLE, error=f"did not register within {boot_timeout_s:g} s of its launch")
        return view(WorkerState.STARTING)
    if now - f.heard_at > worker_timeout_s:
        return view(WorkerState.UNREACHABLE, st.model, st.assignment_id,
                    f"no heartbeat for {now - f.heard_at:.0f} s")
    if i is not None and i.kind in ("assign", "release", "sleep") and now - i.at < INTENT_TTL_S \
            and not reflects(st, i):
        if i.kind == "assign":
            return view(WorkerState.LOADING, i.model, i.assignment_id, memory=i.memory_bytes or None)
        if i.kind == "release":
            return view(WorkerState.DRAINING)
        return view(WorkerState.ASLEEP, i.model, i.assignment_id, since=i.at)
    return view(st.state, st.model, st.assignment_id, st.error, st.state_since)


def view_valid_until(f: WorkerFacts, v: WorkerView, now: float, *, boot_timeout_s: float,
                     worker_timeout_s: float) -> float:
    """Until when :func:`derive_view` gives ``v`` (derived at ``now``) for the same facts:
    the first of the times after ``now`` its rules compare the time with (a call's intent
    going stale, an adapter intent's, a boot deadline, a heartbeat's timeout; each
    answers one way before it and the other after), a hair early. An unreachable
    worker's view names how long it has been silent: derived anew each time."""
    if v.state is WorkerState.UNREACHABLE:
        return -math.inf
    times = [x.at + INTENT_TTL_S for x in (f.intent, *f.adapter_intents) if x is not None]
    if f.heard_at is not None:
        times.append(f.heard_at + worker_timeout_s)
    else:
        started = f.instance.launched_at if f.instance is not None else math.inf
        if f.restarted_at is not None:
            started = max(started, f.restarted_at)
        times.append(max(started + boot_timeout_s, (f.adopted_at or 0.0) + worker_timeout_s))
    return min((t for t in times if t > now), default=math.inf) - 1e-6


def count_states(states: Iterable[WorkerState | str | None]) -> dict[str, int]:
    """How many of each state (a worker's, or an adapter's as :meth:`WorkerView.adapter`
    gives it), keyed by its name."""
    out: dict[str, int] = {}
    for s in states:
        key = s.value if isinstance(s, WorkerState) else str(s)
        out[key] = out.get(key, 0) + 1
    return out
