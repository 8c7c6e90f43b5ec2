"""Every message between Thaw's services, in one place.

Worker ↔ controller (assign, release, sleep, the worker's status and heartbeat),
activator ↔ controller (activity reports, demand, cold-start records, the route
table) and what operators read (pool status, events). The worker, the controller and
the activator import these models; nothing on the wire is an unchecked dict.

No message carries a secret: workers take object-store credentials from their own
environment, and the cluster token travels only in the ``Authorization`` header.

One piece: every message between the services is defined here and only here (one
definition per fact), so a change to the wire is one diff.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from thaw.config import (
    Autoscaling,
    EngineArgs,
    Lora,
    Model,
    Name,
    Prewarm,
    Pricing,
    RateLimits,
    S3Uri,
    Tenant,
)

Id = Annotated[str, Field(min_length=1, max_length=200)]


class WorkerState(StrEnum):
    """A worker's state. The first seven are what a worker reports about itself
    (derived in ``worker.state``); the last three only the controller derives, from
    what its provider and the heartbeats tell it (``warm_pool.fleet.view``)."""

    STARTING = "starting"  # no engine host has finished its imports yet
    STANDBY = "standby"  # engine host imported, waiting for a model
    LOADING = "loading"  # an assignment is being launched / loaded
    READY = "ready"  # the engine answers /health: serving
    DRAINING = "draining"  # a release is in progress (drain, then stop the engine)
    ASLEEP = "asleep"  # the engine holds the model asleep (vLLM sleep mode); a wake serves it again
    FAILED = "failed"  # the last assignment failed; a release clears it
    LAUNCHING = "launching"  # controller: the provider is starting the instance
    STOPPED = "stopped"  # controller: the instance is stopped (EC2), nothing runs on it
    UNREACHABLE = "unreachable"  # controller: no heartbeat in time, or the process ended


REPORTED_STATES = frozenset({
    WorkerState.STARTING, WorkerState.STANDBY, WorkerState.LOADING, WorkerState.READY,
    WorkerState.DRAINING, WorkerState.ASLEEP, WorkerState.FAILED,
})


class _Msg(BaseModel):
    # A misspelt field is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


# Where a request's replica got the model from, fastest first: it was serving already
# (hot), it was asleep and woken, an adapter was loaded into an engine of its base that
# was serving already (adapter), its weights were swapped into an engine built before
# the request (swap), an engine was built beside others on a worker already serving
# (packed), a standby built an engine and read the weights from its host-memory cache,
# its disk cache or the store (s3), or a new instance had to be launched first.
Tier = Literal["hot", "asleep", "adapter", "swap", "packed", "host", "disk", "s3", "launch"]
TIERS: tuple[Tier, ...] = ("hot", "asleep", "adapter", "swap", "packed", "host", "disk", "s3", "launch")
# Why a model failed to start, from the type of the exception behind it (never from its
# text): its weights did not match their manifest (a checksum, a malformed file, an
# object changed since the push), the store could not give them (not found, refused,
# unreachable), the worker's memory, or anything else in the engine. Or, of a model
# and never of a worker's load: "capacity", its requests wait at zero and its pool can
# give it no instance (at max_instances, and no idle replica of another model can be
# taken: warm_pool.policy.evict); activators answer them 503 at once while it holds.
FailureKind = Literal["weights_integrity", "store", "memory", "engine", "capacity"]
# Where a load read its weights: a worker's cache tiers, the store, or a local
# directory (a model not in the store: tests, `thaw snapshot build`).
LoadSource = Literal["host", "disk", "s3", "local"]


# -- every refusal of the controller's and the workers' APIs -----------------------------


class ErrorReply(_Msg):
    """A refusal: 401 without the cluster token, 422 for a malformed request, 503 from a
    controller that follows, and each endpoint's own (404, 409...). ``problems``: a 422's field errors, one a line (the
    worker's); ``state``: a worker's state that refused the call (409)."""

    error: str
    problems: list[str] | None = None
    state: WorkerState | None = None
    # A follower's 503: where the leading controller is (also in X-Thaw-Leader).
    leader: str | None = None


# -- controller → worker ---------------------------------------------------------------



class LeaderView(_Msg):
    """``GET /v1/leader`` on any controller: which one leads (several share one database)."""

    controller: str            # the one answering
    url: str                   # where it is reached
    leading: bool
    leader_url: str | None     # None: nobody holds the lease now
    term: int | None           # the leader's term, as this one last read it

class AssignRequest(_Msg):
    assignment_id: Id
    model: Name
    uri: S3Uri
    served_model_name: Id
    max_model_len: PositiveInt
    engine: EngineArgs = EngineArgs()
    # Restore the engine's compile caches from a snapshot before the launch and capture
    # them after it (compiled mode only; see snapshotter). False: the engine starts cold.
    snapshots: bool = True
    # Start the engine with vLLM's sleep mode, so that it can be put to sleep when idle
    # (the asleep tier, GPU only) and woken by the next assignment of the same model.
    sleep_mode: bool = False
    # The model's engine class as the controller computed it (thaw.engine_class). A
    # worker holding a built engine swaps the weights in only when its own computation
    # from the model's config.json agrees; otherwise it builds an engine as usual.
    engine_class: str | None = None
    # The memory this engine will hold (thaw.fit.engine_memory), for a worker that packs
    # engines: it refuses one that does not fit beside those it runs. None: not counted.
    memory_bytes: NonNegativeInt | None = None
    # POST /engines only: the id the new engine takes (as a worker of its own; the
    # controller names it, so a retried call is recognised).
    engine_id: Id | None = None
    # The model's revision in the controller's registry; the worker reports it back, so
    # a controller (a restarted one too) knows which replicas a roll must replace.
    revision: PositiveInt | None = None
    # Placed for batch work on a standby the pool holds anyway: the worker keeps an
    # engine host standing by beside it, and an assignment that is not for batch takes
    # the worker at once (the batch engine is killed, its requests cut and run again).
    batch: bool = False


class PrebuildRequest(_Msg):
    """Build an engine for ``model`` while standing by (``pools[].prebuild``): a later
    assignment of any model of its engine class swaps its weights in."""

    model: Name
    uri: S3Uri
    served_model_name: Id
    max_model_len: PositiveInt
    engine: EngineArgs = EngineArgs()
    engine_class: str
    snapshots: bool = True


class AdapterRequest(_Msg):
    """``POST /adapters``: load a LoRA adapter (``models[].base``) into the engine serving
    its base; requests name it by ``served_model_name``."""

    model: Name
    uri: S3Uri
    served_model_name: Id


class AdapterUnload(_Msg):
    """``POST /adapters/unload``: stop routing to the adapter, drain it, unload it."""

    model: Name


class ReleaseRequest(_Msg):
    # None: whatever is assigned now.
    assignment_id: str | None = None
    drain_timeout_s: NonNegativeFloat = 30.0


class SleepRequest(_Msg):
    # None: whatever is assigned now.
    assignment_id: str | None = None
    drain_timeout_s: NonNegativeFloat = 30.0
    # vLLM sleep level: 1 keeps the weights in host memory (a wake-up copies them back);
    # 2 drops them (a wake-up must reload). The asleep tier uses 1.
    level: Annotated[int, Field(ge=1, le=2)] = 1


# -- worker → controller ---------------------------------------------------------------


class Phases(_Msg):
    """Epoch seconds of each milestone of the current assignment (None: not reached)."""

    assigned: float | None = None
    snapshot_restored: float | None = None
    weights_loaded: float | None = None
    engine_ready: float | None = None
    # When this assignment woke the engine from sleep instead of loading it (None: loaded).
    woken: float | None = None


class SnapshotView(_Msg):
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


class LoadView(_Msg):
    """How the current assignment got its weights (from the engine's loader)."""

    # The slowest source any byte came from ("asleep": woken, nothing was read).
    tier: Literal["asleep", "host", "disk", "s3", "local"]
    # The weights were swapped into an engine built before the assignment.
    swap: bool = False
    # The loader's time and bytes (None: a loader that does not report them).
    seconds: float | None = None
    bytes: int | None = None
    # Bytes per source.
    sources: dict[str, int] = {}
    # A swap's steps in the engine host (pause_s, weights_s and within it verify_s,
    # prefix_cache_s, frontend_s, total_s: worker.engine_host.swap_server), so a slow one says
    # where its time went; and how many tensors it checked against the manifest.
    steps_s: dict[str, float] = {}
    tensors_verified: int | None = None


class CachedWeights(_Msg):
    """Weights of one model a worker holds locally (``bytes`` of ``total_bytes``)."""

    uri: str
    tier: Literal["host", "disk"]
    bytes: NonNegativeInt
    total_bytes: NonNegativeInt


class PrebuiltView(_Msg):
    """An engine a worker keeps across assignments (``pools[].prebuild``)."""

    engine_class: str
    # The model whose weights the engine holds now (the one it was built for, or the
    # last one swapped in).
    model: str
    # building: the engine is being built (no swap yet); ready: a swap can start now.
    state: Literal["building", "ready"]
    built_at: float | None = None
    # Each step of its last park in seconds (``prefix_cache_s``, ``total_s``); None when
    # it was never parked (built ahead, nothing served since).
    park_steps_s: dict[str, float] | None = None


class AdapterView(_Msg):
    """A LoRA adapter in a worker's engine."""

    model: str
    served_model_name: str
    # loading: being fetched and loaded; ready: requests may name it; unloading: draining
    # then unloaded (no new requests); failed: it could not be loaded (``error``).
    state: Literal["loading", "ready", "unloading", "failed"]
    since: float
    # When its load was asked for (its cold start's start on the worker).
    requested_at: float
    error: str | None = None


class WorkerStatus(_Msg):
    """What a worker says about itself: its ``GET /state``, every control call's answer,
    and the body of its heartbeat to the controller."""

    worker_id: Id
    # The provider's id of the machine (EC2 instance id; local: the provider's record).
    instance_id: Id
    shape: Name
    state: WorkerState
    # Where the controller reaches this worker's control API (advertised address).
    control_url: str
    model: str | None = None
    assignment_id: str | None = None
    # The registry revision of the model its assignment named (AssignRequest.revision).
    revision: PositiveInt | None = None
    # Its assignment is batch work (AssignRequest.batch): another assignment takes it.
    batch: bool = False
    served_model_name: str | None = None
    # Base URL of the engine's OpenAI server (no /v1), only while ready.
    engine_url: str | None = None
    started_at: float
    state_since: float
    # The worker's count of the statuses it has given since it started (0: not counted).
    # A heartbeat sent before the answer to a control call can arrive after it: the
    # controller takes no status older (lower) than the one it holds from the same start.
    seq: NonNegativeInt = 0
    phases: Phases = Phases()
    # The current assignment's snapshot restore (and capture); None without an assignment.
    snapshot: SnapshotView | None = None
    error: str | None = None
    # What kind of failure ``error`` is (with it).
    failure_kind: FailureKind | None = None
    in_flight: int | None = None
    # The current assignment's load (None: not loaded yet, or no assignment).
    load: LoadView | None = None
    # What this worker has cached, per model and tier.
    cached: list[CachedWeights] = []
    # Bytes per second this worker's recent loads read from each source.
    load_bytes_per_s: dict[str, float] = {}
    # The engine it keeps across assignments, if any.
    prebuilt: PrebuiltView | None = None
    # The memory its current assignment's engine holds (None: no assignment, or not
    # counted), and on a worker that packs engines, what they may hold together.
    memory_bytes: NonNegativeInt | None = None
    capacity_bytes: NonNegativeInt | None = None
    # A packed engine: the worker whose instance (and process) it runs in. Its own
    # control API is under that worker's (``control_url`` says where).
    host_worker_id: str | None = None
    # The packed engines this worker runs now (their worker ids).
    engines: list[str] = []
    # LoRA adapters in its engine.
    adapters: list[AdapterView] = []


class HeartbeatReply(_Msg):
    # Changes when the controller restarts (the worker logs it).
    controller_epoch: str
    # How often the controller wants heartbeats.
    interval_s: float
    # The leader's term among several controllers (None: it leads alone): the worker
    # refuses control calls of older terms (worker/fence.py).
    term: int | None = None


# -- activator → controller ------------------------------------------------------------


# TTFTs one report carries at most (a sample: the p90 needs no more).
MAX_TTFT_SAMPLES = 256


class ModelActivityReport(_Msg):
    queued: NonNegativeInt = 0
    in_flight: NonNegativeInt = 0
    last_request_at: float | None = None
    # Requests this activator has accepted for the model since it started (a counter:
    # the controller takes the differences, so a lost report loses nothing).
    arrivals: NonNegativeInt = 0
    # First-byte latencies of hot requests since the last report (seconds).
    ttft_s: Annotated[list[NonNegativeFloat], Field(max_length=MAX_TTFT_SAMPLES)] = []


class ActivityReport(_Msg):
    activator_id: Id
    models: dict[str, ModelActivityReport]


# Models one demand signal may name.
MAX_DEMAND_MODELS = 1000


class DemandSignal(_Msg):
    """``POST /v1/demand``: requests wait for these models at zero. An activator sends
    the models that came to wait while its last signal was on its way in one (a burst
    of a thousand models was a thousand requests to the controller)."""

    models: Annotated[list[str], Field(min_length=1, max_length=MAX_DEMAND_MODELS)]
    # The W3C traceparent of a request waiting for the model, by model (traced ones
    # only): the controller's spans of the start it makes join that request's trace.
    traces: Annotated[dict[str, Annotated[str, Field(max_length=55)]],
                      Field(max_length=MAX_DEMAND_MODELS)] = {}


class DemandReply(_Msg):
    """The answer to a demand signal: the models signalled, and those the controller does
    not serve (removed meanwhile, or never deployed)."""

    accepted: int
    unknown: list[str] = []


class ColdStartRecord(_Msg):
    model: str
    request_id: str
    at: float
    total_s: float
    phases_s: dict[str, float]
    woken: bool = False
    # Where the replica got the model from (never "hot": a cold start is not).
    tier: Tier | None = None
    # Where its weights came from (host, disk, s3), also for a swap.
    weights_from: LoadSource | None = None
    # The engine loader's time reading the weights (None: not reported).
    load_s: float | None = None
    # A swap's steps (thaw.wire.LoadView.steps_s); empty for other tiers.
    swap_steps_s: dict[str, float] = {}


# -- controller → activator: the route table -------------------------------------------


class ReplicaRoute(_Msg):
    worker_id: str
    url: str
    served_model_name: str
    assignment_id: str | None
    phases: Phases = Phases()
    load: LoadView | None = None
    # When the worker's agent started (a later start than a request's: launched for it).
    worker_started_at: float | None = None
    # An engine packed beside others on a worker that was serving already.
    packed: bool = False
    # A LoRA adapter in an engine of its base (``served_model_name`` is the adapter's;
    # ``phases`` are its load's: asked for, loaded), and when that engine became ready.
    adapter: bool = False
    base_ready_at: float | None = None
    # The model's registry revision this replica serves (None: not known).
    revision: PositiveInt | None = None
    # Placed for batch work (WorkerStatus.batch): batch may take all its slots.
    batch: bool = False


class ModelRoute(_Msg):
    served_name: str
    replicas: list[ReplicaRoute] = []
    loading: NonNegativeInt = 0
    failures: NonNegativeInt = 0
    error: str | None = None
    # The kind of the last failure (what a tenant is told of it is chosen by kind).
    failure_kind: FailureKind | None = None
    backoff_until: float | None = None


class RouteTable(_Msg):
    """Ready replicas per model. ``version`` grows within one controller ``epoch``; a
    restarted controller has a new epoch, so watchers take its first table whatever
    its version.

    A delta (``base_version`` set; ``GET /v1/routes?delta=true`` from a watcher that
    holds a recent version) is the table at ``version`` as changes to the table at
    ``base_version`` of the same epoch: ``models`` holds only the models whose route
    changed in any field since then, ``removed`` the models gone; the scalars are
    whole. ``merged`` applies one (docs/REQUEST_PATH.md, "The route feed")."""

    epoch: str
    version: int
    models: dict[str, ModelRoute]
    # Activators heard from lately (each takes this share of a limit when the shared
    # limits store is out of reach), and the version of the API key table.
    activators: PositiveInt = 1
    keys_version: NonNegativeInt = 0
    # The version of the catalog (the models and tenants in force, ``GET /v1/catalog``).
    catalog_version: NonNegativeInt = 0
    # A delta: the version of this epoch it applies to (None: the whole table), and the
    # models it removes.
    base_version: NonNegativeInt | None = None
    removed: list[str] = []

    def body(self) -> str:
        """Its JSON as ``GET /v1/routes`` answers it: a whole table without the delta's
        fields, so an activator from before deltas (its table forbids unknown fields)
        reads it still."""
        return self.model_dump_json(exclude={"base_version", "removed"} if self.base_version is None else None)

    def merged(self, update: RouteTable) -> RouteTable | None:
        """The whole table ``update`` makes of this one: ``update`` itself when whole; a
        delta applied when it is made from this very table (epoch and version), else
        None (the holder asks for the whole table)."""
        if update.base_version is None:
            return update
        if update.epoch != self.epoch or update.base_version != self.version or self.base_version is not None:
            return None
        models = {**self.models, **update.models}
        for name in update.removed:
            models.pop(name, None)
        return update.model_copy(update={"models": models, "base_version": None, "removed": []})


# -- controller → operators ------------------------------------------------------------


class WorkerRow(_Msg):
    """One worker in ``thaw pool status --json`` (exactly these keys)."""

    id: str
    instance_id: str | None
    control_url: str | None
    state: WorkerState
    model: str | None
    age_s: float


class WorkerDetail(_Msg):
    """What else the controller knows of a worker (``/v1/state``'s ``worker_details``)."""

    id: str
    shape: str
    assignment_id: str | None
    engine_url: str | None
    error: str | None
    last_heartbeat_s_ago: float | None
    provider_state: str | None
    # The current assignment's load, and the weights the worker holds locally.
    load: LoadView | None = None
    cached: list[CachedWeights] = []
    # The engine it keeps across assignments (pools[].prebuild).
    prebuilt: PrebuiltView | None = None
    # A packed engine: the worker it runs in; the memory its engine holds; on a worker
    # that packs, what its engines may hold together.
    host_worker_id: str | None = None
    memory_bytes: int | None = None
    capacity_bytes: int | None = None
    adapters: list[AdapterView] = []
    # Its assignment is batch work on a standby lent to batch (an online assignment takes it).
    batch: bool = False


class ShapeRow(_Msg):
    shape: str
    provider: str
    counts: dict[str, int]
    standby_min: int
    standby_max: int
    max_instances: int
    budget_usd_per_hour: float | None
    spend_usd_per_hour: float
    # The standby sizer's target now, what the budgets granted of it, and the rest.
    standby_target: int | None = None
    standby_granted: int | None = None
    budget_shortfall: int = 0
    # Standbys lent to batch work now, and the share of standby instance-time lent to
    # batch since the controller started (None: no standby time yet).
    standby_lent_to_batch: int = 0
    standby_batch_share: float | None = None
    # Launches paused after capacity errors (epoch seconds), and why.
    backoff_until: float | None = None
    backoff_reason: str | None = None
    provider_status: dict[str, Any] = {}


class ModelRow(_Msg):
    name: str
    served_name: str
    replicas: dict[str, int]
    queued: int
    in_flight: int
    last_request_at: float | None
    error: str | None
    backoff_until: float | None
    last_cold_start: ColdStartRecord | None
    # Its engine class (thaw.engine_class) as the controller computed it from the
    # model's config.json and engine settings; None until read (or unreadable).
    engine_class: str | None = None


class BatchQueue(_Msg):
    """Batch work at the controller: batches by status, and the lines of batches not
    yet ended by state (pending: queued; leased: running; done; refused: answered with
    an error status; failed)."""

    batches: dict[str, int] = {}
    lines: dict[str, int] = {}


class PoolStatus(_Msg):
    now: float
    controller_epoch: str
    # False until the controller has waited for heartbeats after its start (it decides
    # nothing before that).
    adopted: bool
    shapes: list[ShapeRow]
    models: list[ModelRow]
    workers: list[WorkerRow]
    worker_details: list[WorkerDetail]
    batch: BatchQueue = BatchQueue()


class PoolEvent(_Msg):
    """A decision the controller carried out, with its reason and the inputs behind it."""

    at: float
    kind: str
    reason: str
    worker_id: str | None = None
    model: str | None = None
    shape: str | None = None
    outcome: str = "started"
    inputs: dict[str, Any] = {}
    # The decision log (``/v1/events?history=true``): which controller, in which leader
    # term, recorded it (None in the answering controller's own recent events).
    controller: str | None = None
    term: int | None = None


class PoolEvents(_Msg):
    events: list[PoolEvent]


# -- operators → controller: budgets at run time -----------------------------------------


class BudgetChange(_Msg):
    """``PUT /v1/pool/budget``: change one pool's standby band or budget, or the budget
    across all pools. Fields left out keep their value."""

    shape: str | None = None
    standby_min: NonNegativeInt | None = None
    standby_max: NonNegativeInt | None = None
    usd_per_hour: NonNegativeFloat | None = None
    total_usd_per_hour: NonNegativeFloat | None = None


class PoolBudget(_Msg):
    shape: str
    standby_min: int
    standby_max: int
    max_instances: int
    usd_per_hour: float | None
    # "config", or "run time" once an operator changed it (persisted across restarts).
    source: str


class BudgetView(_Msg):
    total_usd_per_hour: float | None
    total_source: str
    pools: list[PoolBudget]


# -- operators → controller: its clock, stepped (controller.stepped_clock) ------------------


class ClockView(_Msg):
    """``GET /v1/pool/clock``: the controller's time (Unix seconds, UTC) and the steps
    taken so far."""

    now: float
    # Whether POST /v1/pool/clock may step it (controller.stepped_clock).
    steppable: bool
    stepped_s: float
    # The longest one step may be (0 when it is not steppable).
    largest_step_s: float


class ClockStep(_Msg):
    """``POST /v1/pool/clock``: move the controller's clock forward."""

    advance_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]


# -- operators → controller → activators: API keys ---------------------------------------


class ApiKey(_Msg):
    """One key of the table: its sha256 (hex), never the key."""

    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str
    label: str | None = None
    # The key's first characters, to recognise it in listings ('' for a config key).
    prefix: str
    created_at: float
    revoked_at: float | None = None


class KeyTable(_Msg):
    """``GET /v1/keys``: every key added or revoked at run time; ``version`` moves on
    every change (the route table carries it, so activators know when to fetch)."""

    version: NonNegativeInt
    keys: list[ApiKey]


class NewKey(_Msg):
    """``POST /v1/keys``."""

    tenant: str = Field(min_length=1, max_length=63)
    label: str | None = Field(None, max_length=200)


class NewKeyReply(_Msg):
    # The key itself: the only time anyone sees it.
    key: str
    row: ApiKey


class AdminKey(_Msg):
    """A key for the controller's model and tenant API (``/v1/admin/``) in place of the
    cluster token: its sha256 (hex), never the key."""

    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    label: str | None = None
    prefix: str
    created_at: float
    revoked_at: float | None = None


class AdminKeys(_Msg):
    """``GET /v1/keys/admin``."""

    keys: list[AdminKey]


class NewAdminKey(_Msg):
    """``POST /v1/keys/admin``."""

    label: str | None = Field(None, max_length=200)


class NewAdminKeyReply(_Msg):
    # The key itself: the only time anyone sees it.
    key: str
    row: AdminKey


class RevokeKey(_Msg):
    """``POST /v1/keys/revoke``: the key, its sha256 ('sha256:<hex>' or hex), or its
    listed prefix."""

    key: str = Field(min_length=1, max_length=200)


class RevokeReply(_Msg):
    revoked: PositiveInt
    version: NonNegativeInt


# -- operators → controller → activators: the models and tenants in force ----------------


class ModelSpec(_Msg):
    """A model's settings as a deploy or an update gives them (``thaw models deploy``,
    ``/v1/admin/models``): the fields of a config file's ``models[]`` entry but its name.
    An update gives only what changes; nested settings (engine, autoscaling, lora) merge
    field by field."""

    uri: S3Uri | None = None
    shape: Name | None = None
    served_name: str | None = Field(None, min_length=1, max_length=200)
    max_context_tokens: PositiveInt | None = None
    tenant: Name | None = None
    base: Name | None = None
    adapter_uri: S3Uri | None = None
    engine: EngineArgs | None = None
    autoscaling: Autoscaling | None = None
    lora: Lora | None = None
    pricing: Pricing | None = None
    # Replaces the whole schedule ([] clears it).
    prewarm: list[Prewarm] | None = None

    def fields(self) -> dict[str, Any]:
        """What the caller set, nested settings only as far as they were set."""
        return self.model_dump(mode="json", exclude_unset=True)


class ModelDeploy(_Msg):
    """``POST /v1/admin/models``: a new model (409 when the name is in use)."""

    name: Name
    spec: ModelSpec
    note: str | None = Field(None, max_length=500)


class ModelUpdate(_Msg):
    """``PATCH /v1/admin/models/{name}``: a new revision from the current one with
    ``spec``'s fields changed; ``revision`` is the one the change was based on (409 when
    another change came first)."""

    revision: PositiveInt
    spec: ModelSpec
    note: str | None = Field(None, max_length=500)


class ModelRollback(_Msg):
    """``POST /v1/admin/models/{name}/rollback``: a new revision with the settings of
    revision ``to`` (default: the one before the current)."""

    to: PositiveInt | None = None
    revision: PositiveInt | None = None
    note: str | None = Field(None, max_length=500)


RevisionChange = Literal["deploy", "update", "rollback", "import"]


class ModelRevision(_Msg):
    """One immutable revision of a model: its settings, its weights as they were when it
    was made (the manifest's sha256 and size), who made it and how."""

    model: Name
    revision: PositiveInt
    # The config entry of the model at this revision (``thaw.config.Model``'s fields,
    # as given: an adapter's shape and engine are its base's when resolved).
    spec: dict[str, Any]
    weights_sha256: str | None = None
    weights_bytes: NonNegativeInt | None = None
    created_at: float
    who: str
    change: RevisionChange
    # rollback: the revision whose settings it took.
    from_revision: PositiveInt | None = None
    note: str | None = None


class ModelRecord(_Msg):
    """A model of the registry: its current revision (None once removed) and history."""

    name: Name
    revision: PositiveInt | None
    removed_at: float | None = None
    removed_by: str | None = None
    revisions: list[ModelRevision]


class ModelRecords(_Msg):
    """``GET /v1/admin/models``."""

    version: NonNegativeInt
    models: list[ModelRecord]


class TenantCreate(_Msg):
    """``POST /v1/admin/tenants``: a new tenant (its keys: ``thaw tenants keys add``)."""

    name: Name
    # Model names, or ["*"] for every model (a tenant's private models are its own anyway).
    allowed_models: list[Name | Literal["*"]] = Field(default_factory=lambda: ["*"])
    limits: RateLimits = RateLimits()


class TenantChange(_Msg):
    """``PATCH /v1/admin/tenants/{name}``: what changes; limits merge field by field
    (give 0 to lift one)."""

    allowed_models: list[Name | Literal["*"]] | None = None
    limits: dict[Literal["requests_per_minute", "tokens_per_minute", "max_concurrent_requests"],
                 NonNegativeInt] | None = None


class TenantRecord(_Msg):
    name: Name
    allowed_models: list[str]
    limits: RateLimits
    # The sha256 of the keys the config file gave it (run-time keys: GET /v1/keys).
    config_key_hashes: list[str] = Field(default_factory=list)
    changed_at: float
    who: str
    removed_at: float | None = None


class TenantRecords(_Msg):
    """``GET /v1/admin/tenants``."""

    version: NonNegativeInt
    tenants: list[TenantRecord]


class ModelEntry(ModelSpec):
    """A model as ``thaw apply``'s file declares it (a config file's ``models[]`` entry)."""

    name: Name


class ApplyRequest(_Msg):
    """``POST /v1/admin/apply``: make the registry hold exactly these models and tenants.
    A section left out (None) is not touched."""

    models: list[ModelEntry] | None = None
    tenants: list[Tenant] | None = None
    dry_run: bool = False
    note: str | None = Field(None, max_length=500)


class PlannedChange(_Msg):
    kind: Literal["model", "tenant"]
    name: str
    action: Literal["deploy", "update", "remove", "create", "change"]
    # A model's revision this change makes (None: a removal, a tenant, or a dry run).
    revision: PositiveInt | None = None
    # What differs: field -> [now, then] (a whole entry on deploy or create).
    fields: dict[str, list[Any]] = Field(default_factory=dict)


class ApplyReply(_Msg):
    changes: list[PlannedChange]
    applied: bool
    version: NonNegativeInt


class Catalog(_Msg):
    """``GET /v1/catalog``: the models and tenants in force, as activators serve them;
    ``version`` moves on every change (the route table carries it). The models' order
    means nothing (a model is known by its name).

    A delta (``base_version`` set; ``GET /v1/catalog?since=V&delta=true`` from a watcher
    that holds a recent version) is the catalog at ``version`` as changes to the one at
    ``base_version``: ``models`` holds only the models changed since then (each whole, as
    it is now), ``removed`` the models gone; ``tenants`` are whole (they are few).
    ``merged`` applies one (docs/REQUEST_PATH.md, "The catalog feed")."""

    version: NonNegativeInt
    models: list[Model]
    tenants: list[Tenant]
    # A delta: the version it applies to (None: the whole catalog), and the models it removes.
    base_version: NonNegativeInt | None = None
    removed: list[str] = []

    def body(self) -> bytes:
        """Its JSON as ``GET /v1/catalog`` answers it: a whole catalog without the delta's
        fields, so an activator from before deltas (its catalog forbids unknown fields)
        reads it still."""
        return self.model_dump_json(exclude={"base_version", "removed"} if self.base_version is None
                                    else None).encode()

    def merged(self, update: Catalog) -> Catalog | None:
        """The whole catalog ``update`` makes of this one: ``update`` itself when whole; a
        delta applied when it is made from this very version, else None (the holder asks
        for the whole catalog). A model changed keeps its place, a new one comes last."""
        if update.base_version is None:
            return update
        if update.base_version != self.version or self.base_version is not None:
            return None
        models = {m.name: m for m in self.models}
        models.update((m.name, m) for m in update.models)
        for name in update.removed:
            models.pop(name, None)
        return update.model_copy(update={"models": list(models.values()), "base_version": None, "removed": []})


# -- the Files API's index (activators -> the controller) --------------------------------

# OpenAI's purposes for files Thaw keeps: tenants upload batch input; batch output and
# error files are written by the batch runner.
FilePurpose = Literal["batch", "batch_output"]
# A file id, as the activators make them ("file-" and a uuid4's hex).
FILE_ID = r"file-[A-Za-z0-9]{8,64}"


class NewFile(_Msg):
    """``POST /v1/files`` (controller): an activator stored a tenant's upload at ``key``
    (in the object store's bucket) and asks the controller to index it."""

    id: Annotated[str, Field(pattern=f"^{FILE_ID}$")]
    tenant: Name
    filename: Annotated[str, Field(min_length=1, max_length=512)]
    purpose: FilePurpose
    # Bounded so that a database's 64-bit integer holds them.
    bytes: Annotated[int, Field(ge=0, le=2**53)]
    lines: Annotated[int, Field(ge=0, le=2**53)]
    key: Annotated[str, Field(min_length=1, max_length=1024)]


class FileRecord(NewFile):
    created_at: float


class FileList(_Msg):
    data: list[FileRecord]
    has_more: bool


# -- the Batches API (activators -> the controller) --------------------------------------

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]
BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions"]
BATCH_ENDPOINTS: tuple[str, ...] = get_args(BatchEndpoint)


class NewBatch(_Msg):
    """``POST /v1/batches`` (controller): a tenant's batch over one of its files."""

    tenant: Name
    input_file_id: Annotated[str, Field(pattern=f"^{FILE_ID}$")]
    endpoint: BatchEndpoint
    completion_window: Literal["24h"] = "24h"
    # OpenAI's bounds: 16 pairs, keys up to 64 characters, values up to 512.
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None,
                        Field(max_length=16)] = None


class BatchLineError(_Msg):
    """A line of the input that did not run, or the reason a whole batch failed."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchCounts(_Msg):
    total: NonNegativeInt = 0
    completed: NonNegativeInt = 0
    failed: NonNegativeInt = 0


class BatchRecord(_Msg):
    id: str
    tenant: Name
    input_file_id: str
    endpoint: BatchEndpoint
    completion_window: str
    metadata: dict[str, str] | None = None
    status: BatchStatus
    created_at: float
    expires_at: float
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    # Why the whole batch failed (validating found no JSONL, the input file is gone).
    errors: list[BatchLineError] = []
    request_counts: BatchCounts = BatchCounts()


class BatchList(_Msg):
    data: list[BatchRecord]
    has_more: bool


class LeasedLine(_Msg):
    """A batch request handed to an activator to run (until ``lease_until``)."""

    batch_id: str
    tenant: Name
    line: Annotated[int, Field(ge=1, le=2**31)]
    custom_id: str
    model: Name
    endpoint: BatchEndpoint
    body: dict[str, Any]
    lease_until: float


class LineRef(_Msg):
    batch_id: Annotated[str, Field(min_length=1, max_length=100)]
    line: Annotated[int, Field(ge=1, le=2**31)]


class LeaseLines(_Msg):
    """``POST /v1/batch-lines/lease``: an activator asks for up to ``n`` batch requests for
    ``models`` (those it has room on), to answer within ``lease_s``, and renews its leases
    on the lines it is running (``running``) for as long again."""

    owner: Annotated[str, Field(min_length=1, max_length=200)]
    models: list[Name] = []
    n: Annotated[int, Field(ge=0, le=1000)] = 0
    lease_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    running: Annotated[list[LineRef], Field(max_length=100_000)] = []


class LeasedLines(_Msg):
    lines: list[LeasedLine]


class LineResult(_Msg):
    """A batch request's answer (``response``: ``status_code``, ``request_id``, ``body``)
    or why it had none (``error``: ``code``, ``message``)."""

    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class LineResultReply(_Msg):
    # False: the line had its result already (run twice); this one was not kept.
    kept: bool


class ReleaseLine(_Msg):
    owner: Annotated[str, Field(min_length=1, max_length=200)]
    # The run failed without an answer (else it was cut for online traffic): why.
    failure: Annotated[str, Field(max_length=2000)] | None = None


# -- stored responses (OpenAI's Responses API; activator.conversations.responses, warm_pool.conversations.store)

RESPONSE_ID = r"resp_[A-Za-z0-9]{8,64}"
CONVERSATION_ID = r"conv_[A-Za-z0-9]{8,64}"


class StoredItem(BaseModel):
    """An item as stored (OpenAI's shape, kept as given): it has an id."""

    model_config = ConfigDict(extra="allow")

    id: Annotated[str, Field(min_length=1, max_length=100)]


class ResponseObject(BaseModel):
    """A Response object as stored (OpenAI's shape, kept as given)."""

    model_config = ConfigDict(extra="allow")

    id: Annotated[str, Field(pattern=f"^{RESPONSE_ID}$")]
    previous_response_id: Annotated[str, Field(pattern=f"^{RESPONSE_ID}$")] | None = None
    output: list[StoredItem] = []


class StoredResponse(_Msg):
    """``POST /v1/stored-responses``: an activator keeps a response (``response`` the
    Response object it answered, with its id and ``previous_response_id``) and the
    input items of its turn, before its client sees the end."""

    tenant: Name
    response: ResponseObject
    input_items: list[StoredItem] = []
    # The replica that served it (the next turn is routed to the same prefix cache).
    replica: Annotated[str, Field(max_length=300)] | None = None
    # The conversation the turn belongs to: its items and output are added to it.
    conversation: Annotated[str, Field(pattern=f"^{CONVERSATION_ID}$")] | None = None


class ItemPage(_Msg):
    """Items in order (a turn's history, a response's input items, a page of a
    conversation), whether more follow, and the replica that served the last turn."""

    items: list[dict[str, Any]]
    has_more: bool = False
    replica: str | None = None


class NewConversation(_Msg):
    """``POST /v1/stored-conversations``."""

    tenant: Name
    id: Annotated[str, Field(pattern=f"^{CONVERSATION_ID}$")]
    metadata: dict[str, str] = {}
    items: Annotated[list[StoredItem], Field(max_length=20)] = []


class ConversationPatch(_Msg):
    metadata: dict[str, str]


class NewItems(_Msg):
    items: Annotated[list[StoredItem], Field(min_length=1, max_length=20)]
