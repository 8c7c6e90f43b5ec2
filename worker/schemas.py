"""The control API's bodies (the pool manager is coded against these shapes)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, SecretStr

from thaw.config import EngineArgs, Name, S3Uri
from thaw.objstore import S3Endpoint


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreSpec(_Body):
    """How this worker reaches the object store for this assignment."""

    endpoint_url: str | None = None
    access_key: str
    # SecretStr: never printed in logs or reprs.
    secret_key: SecretStr
    region: str = "us-east-1"

    def endpoint(self) -> S3Endpoint:
        return S3Endpoint(self.endpoint_url, self.access_key, self.secret_key.get_secret_value(), self.region)


class AssignRequest(_Body):
    assignment_id: Annotated[str, Field(min_length=1, max_length=200)]
    model: Name
    uri: S3Uri
    served_model_name: Annotated[str, Field(min_length=1, max_length=200)]
    max_model_len: PositiveInt
    engine: EngineArgs = EngineArgs()
    store: StoreSpec
    # Restore the engine's compile caches from a snapshot before the launch and capture
    # them after it (compiled mode only; see snapshotter). False: the engine starts cold.
    snapshots: bool = True
    # Start the engine with vLLM's sleep mode, so that it can be put to sleep when idle
    # (the asleep tier, GPU only) and woken by the next assignment of the same model.
    sleep_mode: bool = False


class ReleaseRequest(_Body):
    # None: whatever is assigned now.
    assignment_id: str | None = None
    drain_timeout_s: NonNegativeFloat = 30.0


class SleepRequest(_Body):
    # None: whatever is assigned now.
    assignment_id: str | None = None
    drain_timeout_s: NonNegativeFloat = 30.0
    # vLLM sleep level: 1 keeps the weights in host memory (a wake-up copies them back);
    # 2 drops them (a wake-up must reload). The asleep tier uses 1.
    level: Annotated[int, Field(ge=1, le=2)] = 1


class Phases(BaseModel):
    """Epoch seconds of each milestone of the current assignment (None: not reached)."""

    assigned: float | None = None
    snapshot_restored: float | None = None
    weights_loaded: float | None = None
    engine_ready: float | None = None
    # When this assignment woke the engine from sleep instead of loading it (None: loaded).
    woken: float | None = None


class SnapshotView(BaseModel):
    """The current assignment's engine snapshot (see ``worker.state.SnapshotFacts``)."""

    fingerprint: str | None
    # restoring | restored | local | missing | skipped_mismatch | skipped_corrupt |
    # skipped_error | disabled
    status: str
    seconds: float | None
    bytes: int | None
    reason: str | None
    compiled_kernels: int | None
    # running | uploaded | exists | empty | failed (None: no capture for this start)
    capture: str | None


class StateBody(BaseModel):
    worker_id: str
    shape: str
    state: str
    model: str | None
    assignment_id: str | None
    served_model_name: str | None
    # Base URL of the engine's OpenAI server (no /v1), only while ready.
    engine_url: str | None
    started_at: float
    state_since: float
    phases: Phases
    # The current assignment's snapshot restore (and capture); None without an assignment.
    snapshot: SnapshotView | None = None
    error: str | None
    in_flight: int | None
