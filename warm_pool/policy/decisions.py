"""The controller's decisions, and the one place each is told apart from the others.

A decision is data: what the policy (``warm_pool.policy.decide.decide``) wants done to one
worker, engine or pool. Two executors carry them out: the controller's actuator
(``warm_pool.fleet.actuator``: control calls and provider calls) and the simulator
(``simulator.effects``: the same effects on its model of a fleet). Each implements
:class:`Executor`, one method per decision type, and hands every decision to
:func:`carry_out`, whose ``match`` ends in ``assert_never``: a decision type added to
:data:`Decision` fails the type check (mypy) until :func:`carry_out` has its case and
both executors its method (``tests/warm_pool/policy/test_decisions.py`` runs mypy to show it).

Pure: dataclasses and the dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, assert_never

AssignReason = Literal["demand", "scale_up", "prewarm", "min_replicas", "roll", "batch"]


@dataclass(frozen=True)
class Assign:
    worker_id: str
    model: str
    assignment_id: str
    reason: AssignReason = "demand"
    # Where the worker is expected to load the model from, and in how long (a standby
    # placed by what it holds; None for a wake).
    # Informational: not part of the decision's identity.
    tier: str | None = field(default=None, compare=False)
    expected_load_s: float | None = field(default=None, compare=False)
    # Batch work on a standby (warm_pool.policy.batch): any other assignment takes it.
    batch: bool = False


# Why a replica (or an asleep or failed worker) is let go. "evicted": an idle replica
# (nothing in flight or queued, held only by its keep-alive) given up for a model whose
# requests wait at zero in a pool that can add no instance (warm_pool.policy.evict).
ReleaseReason = Literal["idle", "failed", "excess", "asleep_expired", "reclaimed", "budget", "removed", "rolled",
                        "evicted"]


@dataclass(frozen=True)
class Release:
    worker_id: str
    model: str | None
    reason: ReleaseReason
    # An eviction's inputs, for the decision log: the waiting model it makes room for and
    # how long the evicted model had been idle (None: never used). Informational: not
    # part of the decision's identity.
    for_model: str | None = field(default=None, compare=False)
    idle_s: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Sleep:
    """Put an idle replica to sleep (vLLM sleep mode): it keeps the model, off the GPU."""

    worker_id: str
    model: str


@dataclass(frozen=True)
class Stop:
    """Stop an idle standby instance (EC2): kept as stopped standby, storage cost only."""

    worker_id: str
    reason: Literal["excess_standby"]


@dataclass(frozen=True)
class Start:
    """Start a stopped standby instance again (it stands by again in about a minute)."""

    worker_id: str
    reason: Literal["standby"]


@dataclass(frozen=True)
class Prebuild:
    """Have a standby build an engine of ``model``'s engine class before any request."""

    worker_id: str
    model: str
    engine_class: str


@dataclass(frozen=True)
class Pack:
    """Start an engine of ``model`` beside the ones a serving worker runs
    (``pools[].pack``): the engine becomes a replica of its own, ``engine_id``."""

    worker_id: str
    model: str
    assignment_id: str
    engine_id: str
    memory_bytes: int
    reason: AssignReason = "demand"
    tier: str = field(default="packed", compare=False)


@dataclass(frozen=True)
class LoadAdapter:
    """Load adapter ``model`` into the engine of its base that ``worker_id`` serves."""

    worker_id: str
    model: str
    reason: AssignReason = "demand"
    tier: str = field(default="adapter", compare=False)


@dataclass(frozen=True)
class UnloadAdapter:
    worker_id: str
    model: str
    reason: Literal["idle", "excess", "failed", "removed"]


@dataclass(frozen=True)
class Launch:
    shape: str
    reason: Literal["standby", "demand", "batch"]


@dataclass(frozen=True)
class Terminate:
    worker_id: str
    reason: Literal["unreachable", "excess_standby", "excess_stopped"]


Decision = Assign | Release | Sleep | Launch | Terminate | Stop | Start | Prebuild | Pack | LoadAdapter | UnloadAdapter


Ctx = TypeVar("Ctx", contravariant=True)


class Executor(Protocol[Ctx]):
    """Carries out each kind of decision; ``ctx`` is what the executor needs beside the
    decision (the actuator: the tick's snapshot and time; the simulator: its clock)."""

    def assign(self, d: Assign, ctx: Ctx) -> None: ...
    def release(self, d: Release, ctx: Ctx) -> None: ...
    def sleep(self, d: Sleep, ctx: Ctx) -> None: ...
    def launch(self, d: Launch, ctx: Ctx) -> None: ...
    def terminate(self, d: Terminate, ctx: Ctx) -> None: ...
    def stop(self, d: Stop, ctx: Ctx) -> None: ...
    def start(self, d: Start, ctx: Ctx) -> None: ...
    def prebuild(self, d: Prebuild, ctx: Ctx) -> None: ...
    def pack(self, d: Pack, ctx: Ctx) -> None: ...
    def load_adapter(self, d: LoadAdapter, ctx: Ctx) -> None: ...
    def unload_adapter(self, d: UnloadAdapter, ctx: Ctx) -> None: ...


def carry_out(d: Decision, to: Executor[Ctx], ctx: Ctx) -> None:
    """Hand ``d`` to the method of ``to`` for its type."""
    match d:
        case Assign():
            to.assign(d, ctx)
        case Release():
            to.release(d, ctx)
        case Sleep():
            to.sleep(d, ctx)
        case Launch():
            to.launch(d, ctx)
        case Terminate():
            to.terminate(d, ctx)
        case Stop():
            to.stop(d, ctx)
        case Start():
            to.start(d, ctx)
        case Prebuild():
            to.prebuild(d, ctx)
        case Pack():
            to.pack(d, ctx)
        case LoadAdapter():
            to.load_adapter(d, ctx)
        case UnloadAdapter():
            to.unload_adapter(d, ctx)
        case _:
            assert_never(d)
