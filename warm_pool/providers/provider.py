"""Providers own the machines: they launch, list, stop, start and terminate instances.

Nothing else. What runs on an instance (the worker, its state, its model) is told by
the worker itself in its heartbeats; the controller matches the two by instance id.
After a controller restart, ``instances()`` is the truth about what exists: the EC2
provider reads its tags, the local provider its records in the data dir.

``local`` runs `thaw worker` processes on this machine (the embedded default). They
are not children that die with the controller: a controller restart must leave them
serving. ``ec2`` is in ``warm_pool.providers.ec2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class InstanceState(StrEnum):
    """An instance as its provider sees it (EC2's names; ``exited`` is a local process
    that ended)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    EXITED = "exited"


@dataclass(frozen=True)
class Instance:
    """One machine (or local process) that the provider launched for the cluster."""

    instance_id: str
    # The worker id given at launch (EC2: the thaw:worker-id tag); the worker on the
    # instance heartbeats with both.
    worker_id: str
    shape: str
    launched_at: float
    state: InstanceState
    # Local workers: known at launch. EC2: learnt from the worker's heartbeat.
    control_url: str | None = None
    # Local workers: the exit status once the process ended.
    exit_code: int | None = None
    # Provider details for operators (instance type, subnet, market, pid, ...).
    detail: tuple[tuple[str, str], ...] = ()
    # The leader's term that launched it (warm_pool.fencing; EC2: the thaw:term tag).
    term: int | None = None


class CapacityError(Exception):
    """No capacity for the shape anywhere the pool may launch (every subnet, instance
    type and market tried). The controller backs the shape off."""

    def __init__(self, shape: str, message: str) -> None:
        super().__init__(message)
        self.shape = shape


class Provider(Protocol):
    """Machines for one or more pools (keyed by shape)."""

    kind: str

    async def launch(self, shape: str, worker_id: str, *, term: int | None = None) -> Instance:
        """Start one instance for ``worker_id``, decided in the leader's ``term`` (kept
        with the instance). Idempotent: an instance already launched for this worker id
        is returned instead of a second one. Raises :class:`CapacityError` when no
        capacity is left to try."""
        ...

    async def instances(self) -> list[Instance]:
        """Every instance of this cluster that is not terminated."""
        ...

    async def terminate(self, instance_id: str) -> None: ...

    async def stop(self, instance_id: str) -> None:
        """Stop (not terminate) an instance: its disk stays, no compute cost."""
        ...

    async def start(self, instance_id: str) -> None:
        """Start a stopped instance again; its worker registers as after a launch."""
        ...

    async def close(self) -> None:
        """Release clients; instances are left as they are (a restart adopts them)."""
        ...
