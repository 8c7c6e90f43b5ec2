"""The agent's refusals, which its API answers with a status (``worker.api``).

Their own module: the agent and its parts (``worker.sleep``, ``worker.release``, ...)
raise them, and none of those parts imports the agent."""

from __future__ import annotations

from thaw.wire import WorkerState


class Conflict(Exception):
    """The request does not fit the worker's current state (HTTP 409)."""

    def __init__(self, message: str, state: WorkerState) -> None:
        super().__init__(message)
        self.state = state


class Refused(Exception):
    """A request this worker will never carry out, whatever its state (HTTP 403):
    e.g. a model URI outside the store prefixes its config allows."""
