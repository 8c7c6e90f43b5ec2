"""The one config file: object store, models, instance shapes, pools, tenants.

Every consumer reads resolved values from these models; defaults are resolved here,
once. Units are in field names (``_s``, ``_gib``, ``_usd``). A bad file fails at start
with one line per problem naming the field (see :func:`format_errors`).

One piece: the whole config schema, each field defined once with its validation, so the
docs, the CLI and every service read the same definition.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from thaw.s3uri import BUCKET_PATTERN, S3UriError, check_allowed, check_uri, split_uri

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
# A plain s3://bucket/seg/... URI: no other scheme, no ./.. or empty segments, no
# backslashes or percent-encoding (thaw.s3uri.check_uri says which).
# /openapi.json shows a pattern every URI it matches passes (no dots in the bucket, no
# segment starting with one); check_uri itself admits a little more.
S3_URI_SCHEMA_PATTERN = r"^s3://[a-z0-9][a-z0-9-]{1,61}[a-z0-9](/[A-Za-z0-9_-][A-Za-z0-9._-]*)*/?$"
S3Uri = Annotated[str, AfterValidator(check_uri), Field(json_schema_extra={"pattern": S3_URI_SCHEMA_PATTERN})]
Sha256Hex = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]

DEFAULT_CONFIG_PATH = Path("examples/thaw.yaml")


class _Strict(BaseModel):
    # A typo in a key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Credentials(_Strict):
    """Where the S3 access key comes from: the environment, a file, generated, or the
    AWS default chain.

    ``generated`` is for the embedded store: `thaw store up` creates a key pair once
    and keeps it under the data directory. ``role``: boto3's default chain (on EC2, the
    instance profile's role; what the CloudFormation stack's services use).
    """

    # env, file, generated (embedded store only) or role (boto3's default chain).
    source: Literal["env", "file", "generated", "role"] = "generated"
    # With source env: the environment variables that hold the key pair.
    access_key_env: str = "AWS_ACCESS_KEY_ID"
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    # JSON file with {"access_key": ..., "secret_key": ...}; relative to the data dir.
    file: Path | None = None

    @model_validator(mode="after")
    def _file_needed(self) -> Credentials:
        if self.source == "file" and self.file is None:
            raise ValueError("source 'file' needs 'file' (a JSON file with access_key and secret_key)")
        return self


class EmbeddedStore(_Strict):
    """SeaweedFS started by Thaw on loopback (`thaw store up`, `thaw up`)."""

    # The S3 port on 127.0.0.1, and how long Thaw waits for the store to answer at
    # start.
    s3_port: Annotated[int, Field(ge=1, le=65535)] = 8333
    startup_timeout_s: PositiveFloat = 60.0


class ObjectStore(_Strict):
    # embedded: SeaweedFS that Thaw runs on loopback; s3: AWS S3 or any S3-compatible
    # endpoint.
    kind: Literal["embedded", "s3"] = "embedded"
    # Required for kind 's3' with a non-AWS endpoint; for 'embedded' it is derived.
    endpoint_url: str | None = None
    # The store's region (AWS), and the bucket that holds models, usage and files.
    region: str = "us-east-1"
    bucket: Annotated[str, Field(pattern=BUCKET_PATTERN)] = "thaw"
    # Where the access key comes from, and the embedded store's settings.
    credentials: Credentials = Credentials()
    embedded: EmbeddedStore = EmbeddedStore()
    # Where models may be: every models[].uri, and every URI a worker is assigned, must
    # be one of these or under it (whole segments: s3://b/models does not admit
    # s3://b/models-evil). Each names the bucket above. Default: the whole bucket.
    allowed_prefixes: list[S3Uri] = Field(default_factory=lambda: ["s3://thaw/"], min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _default_prefixes(cls, data: Any) -> Any:
        # The default follows the bucket; resolved here once, so consumers read one list.
        if isinstance(data, dict) and data.get("allowed_prefixes") is None:
            bucket = data.get("bucket", "thaw")
            if isinstance(bucket, str) and re.match(BUCKET_PATTERN, bucket):
                data = {**data, "allowed_prefixes": [f"s3://{bucket}/"]}
        return data

    @model_validator(mode="after")
    def _endpoint(self) -> ObjectStore:
        if self.kind == "embedded" and self.endpoint_url is not None:
            raise ValueError("endpoint_url is derived for kind 'embedded'; set embedded.s3_port instead")
        if self.kind == "s3" and self.credentials.source == "generated":
            raise ValueError("credentials.source 'generated' only applies to kind 'embedded'")
        for p in self.allowed_prefixes:
            if split_uri(p)[0] != self.bucket:
                raise ValueError(f"allowed_prefixes: {p!r} is not in the bucket {self.bucket!r}")
        return self

    def check_model_uri(self, uri: str) -> str:
        """``uri`` if it is inside ``allowed_prefixes``, else :class:`~thaw.s3uri.S3UriError`."""
        return check_allowed(uri, self.allowed_prefixes)

    @property
    def resolved_endpoint_url(self) -> str | None:
        if self.kind == "embedded":
            return f"http://127.0.0.1:{self.embedded.s3_port}"
        return self.endpoint_url


class KeepAliveHistogram(_Strict):
    """The learned keep-alive policy (``keep_alive: histogram``, ``warm_pool.policy.keepalive``):
    per model, a histogram of its idle intervals, blended with every model's while it
    has few of its own, decides how long an idle model keeps its replica and whether to
    let it go and bring one back just before the next request, at the least expected
    idle replica time plus cold starts priced in replica-seconds."""

    # Width of one bin, and the longest idle interval the histogram holds; longer ones
    # are out of range (counted, with their total length).
    bin_s: PositiveFloat = 60.0
    range_s: PositiveFloat = 4 * 3600.0
    # What one cold start is worth, in idle replica-seconds. None: the model's
    # idle_grace_s (a fixed timeout of T is the best blind policy at a price of T).
    cold_start_price_s: PositiveFloat | None = None
    # The price of a cold start that swaps weights into an engine built ahead (the
    # model is in its pool's prebuild list), or loads an adapter into a serving base,
    # as a fraction of the price above: they cost seconds, not a launch.
    swap_price_factor: Annotated[float, Field(gt=0, le=1)] = 0.25
    adapter_price_factor: Annotated[float, Field(gt=0, le=1)] = 0.05
    # Every model's intervals pooled are the prior: a model with n of its own counts
    # the pool as max(prior_samples - n, prior_floor) intervals. The floor keeps some
    # weight on gaps longer than any the model has had yet.
    prior_samples: NonNegativeFloat = 10.0
    prior_floor: NonNegativeFloat = 1.0
    # In the pool, one model's intervals count as this many at most (spread over its
    # histogram): without it a busy model's thousands of short gaps are every sparse
    # model's prior. None: each interval counts once.
    prior_model_weight: PositiveFloat | None = 10.0
    # A model's own intervals are spread over the bins near them before the pool is
    # blended in: each as a log-normal around its length, of width smoothing x s x
    # n^-smoothing_exponent (natural-log units; n the model's intervals, s the spread of
    # their logs). A sparse model's few scattered gaps then do not read as a cluster
    # worth a pre-warm; a regular model, or one with many, keeps its detail. 0: the
    # counts as they are. Silverman's rule has an exponent of 0.2, for gaps from one
    # hump; with two (a cron between bursts) their spread is wide and 0.2 smeared the
    # cron's cluster however many intervals showed it (docs/notes/keepalive-research.md).
    smoothing: NonNegativeFloat = 1.0
    smoothing_exponent: NonNegativeFloat = 0.35
    # How far the learned window may stray from the fixed timeout at the same price
    # (learning-augmented ski rental: Purohit, Svitkina and Kumar, NeurIPS 2018). With
    # trust t > 0 a replica held from the idle start is kept at least t x price seconds,
    # none is held past price / t (from its pre-warm, if any), and no pre-warm is asked
    # for before t x price. A window that holds from the idle start then costs at most
    # 1 + 1/t times the best possible on any gap, however wrong the histogram; one that
    # pre-warms lets the replica go at once, so a request before the pre-warm is a cold
    # start whatever trust says. 0: the histogram alone; 1: the fixed timeout (no
    # pre-warm).
    trust: Annotated[float, Field(ge=0, le=1)] = 0.7
    # Pre-warm: release at once and ask for a replica this long before the predicted
    # next request (loading takes time). False: never pre-warm.
    prewarm: bool = True
    prewarm_lead_s: NonNegativeFloat = 60.0
    # Traffic that repeats by the time of day or of the week: each idle interval is also
    # counted in the slot of the period (UTC; period_slots slots) it began in, and a
    # window is judged on the intervals that began in its own slot, blended with all of
    # the model's while the slot has few (as the pooled prior is blended in). So an idle
    # start after hours can let the replica go at once and pre-warm for the morning,
    # where range_s reaches it. "off": every interval alike.
    periodic: Literal["off", "day", "week"] = "off"
    period_slots: Annotated[int, Field(ge=1, le=672)] = 24

    @model_validator(mode="after")
    def _order(self) -> KeepAliveHistogram:
        if self.bin_s > self.range_s:
            raise ValueError(f"bin_s ({self.bin_s:g}) must not exceed range_s ({self.range_s:g})")
        return self

    def period_s(self) -> float | None:
        """The length of the period ``periodic`` names (None: off)."""
        return {"off": None, "day": 86_400.0, "week": 604_800.0}[self.periodic]


class Autoscaling(_Strict):
    # Replicas kept whatever the traffic (0: scale to zero), and the most it may have.
    min_replicas: NonNegativeInt = 0
    max_replicas: PositiveInt = 1
    # In-flight requests per replica the autoscaler aims for.
    target_concurrency: PositiveFloat = 8.0
    # With no request for this long, replicas above min_replicas are released.
    idle_grace_s: NonNegativeFloat = 300.0
    # How long a request waits in the cold queue for a replica before a 503.
    activation_timeout_s: PositiveFloat = 120.0
    # Bound on the cold queue; beyond it requests get 429.
    max_queue_length: PositiveInt = 256
    # Requests one replica gets at a time; beyond it requests wait in the model's fair
    # queue (round-robin across tenants), which also counts as demand for scaling up.
    max_concurrency_per_replica: PositiveInt = 64
    # GPU only. An idle replica is put to sleep (vLLM sleep mode level 1: weights moved
    # to host memory, KV cache dropped, the instance kept) instead of released, and the
    # next request wakes it rather than loading the model again. It stays asleep this
    # long, then is released. 0: off (release at once). Asleep instances count toward
    # the pool's max_instances and budget, not its standby targets; another model that
    # finds no standby takes one (reloading) rather than launch an instance.
    asleep_ttl_s: NonNegativeFloat = 0.0
    # Demand over the stable window decides the replica count; over the panic window,
    # demand at least panic_threshold x what the current replicas handle at
    # target_concurrency scales up at once.
    stable_window_s: PositiveFloat = 60.0
    panic_window_s: PositiveFloat = 6.0
    panic_threshold: Annotated[float, Field(ge=1.0)] = 2.0
    # Outside panic, a higher count waits this long; a lower one this long, and then
    # goes down one replica at a time.
    upscale_delay_s: NonNegativeFloat = 0.0
    downscale_delay_s: NonNegativeFloat = 30.0
    # One step up is at most this factor of the current replicas (at least one more).
    max_scale_up_rate: Annotated[float, Field(gt=1.0)] = 2.0
    # TTFT p90 over the stable window above this adds a replica even when concurrency
    # is under target. None: no TTFT target.
    ttft_slo_s: PositiveFloat | None = None
    # fixed: release the last replica after idle_grace_s. histogram: the learned
    # policy (keep_alive_histogram), fixed until any model has had an idle interval.
    keep_alive: Literal["fixed", "histogram"] = "fixed"
    keep_alive_histogram: KeepAliveHistogram = KeepAliveHistogram()

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas ({self.max_replicas})"
            )
        if self.panic_window_s > self.stable_window_s:
            raise ValueError(f"panic_window_s ({self.panic_window_s:g}) must not exceed stable_window_s "
                             f"({self.stable_window_s:g})")
        return self


class EngineArgs(_Strict):
    """Engine settings Thaw understands; anything else goes in ``extra`` verbatim."""

    # The weights' dtype in the engine (auto: as the checkpoint's config says).
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    # True: no compiling or CUDA graphs (starts fastest); False: compiled (faster once
    # up).
    enforce_eager: bool = False
    # None: the shape's gpu_count (one engine spans every GPU of its instance).
    tensor_parallel_size: PositiveInt | None = None
    # GPU only: the share of the device the engine may take (weights and KV cache).
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    # CPU engines only: KV-cache size (VLLM_CPU_KVCACHE_SPACE).
    cpu_kvcache_gib: PositiveFloat = 1.0
    # Chosen by measurement (docs/BENCHMARKS.md): Thaw's loader beat runai at every size tried.
    load_format: Literal["runai_streamer", "thaw", "safetensors"] = "thaw"
    # Restore/capture compile-cache snapshots for this model (compiled mode only).
    snapshots: bool = True
    # Other vLLM engine arguments, passed through as they are.
    extra: dict[str, Any] = Field(default_factory=dict)


class Lora(_Strict):
    """LoRA adapters served on a base model's engines (vLLM's ``--enable-lora``)."""

    # Adapters one engine holds at once (a request for another waits for a slot).
    max_loras: PositiveInt = 4
    # The largest adapter rank the engine accepts (its LoRA buffers are sized by it).
    max_lora_rank: Annotated[int, Field(ge=1, le=512)] = 16


class Pricing(_Strict):
    """What a model's use costs its tenant (``thaw usage`` prices records with the
    revision that answered them)."""

    # USD per million tokens: prompt tokens (less those read from the prefix cache),
    # cached prompt tokens (None: as prompt tokens), completion tokens.
    prompt_usd_per_mtok: NonNegativeFloat = 0.0
    cached_usd_per_mtok: NonNegativeFloat | None = None
    completion_usd_per_mtok: NonNegativeFloat = 0.0
    # USD per GPU-second of the replicas' time the tenant's requests used (split by tokens).
    usd_per_gpu_second: NonNegativeFloat = 0.0


class Prewarm(_Strict):
    """Known traffic (``models[].prewarm``): from each time ``cron`` fires (UTC, five
    fields: ``thaw.cron``) for ``for_s`` seconds the model keeps at least ``replicas``
    (within ``max_replicas``), whatever its traffic."""

    # When the window opens: five cron fields, UTC.
    cron: str
    # Replicas held through the window, and how long it lasts.
    replicas: PositiveInt = 1
    for_s: Annotated[float, Field(gt=0, le=7 * 86400)]

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        from thaw.cron import parse

        parse(v)  # CronError is a ValueError: reported on the field
        return v


class Model(_Strict):
    # The model's name in the registry, `thaw models` and usage.
    name: Name
    # The model's files in the store; for an adapter, its adapter_uri (filled in).
    uri: S3Uri
    # What clients put in `model`; defaults to `name`.
    served_name: str | None = None
    # The longest prompt plus completion (vLLM's max_model_len); longer requests get
    # 400.
    max_context_tokens: PositiveInt = 2048
    # The shapes[].name its replicas run on.
    shape: Name
    engine: EngineArgs = EngineArgs()
    # Replicas, scale to zero, the cold queue and keep-alive.
    autoscaling: Autoscaling = Autoscaling()
    # `thaw up` builds the demo model and pushes it to `uri` when the store has none there.
    demo_if_missing: bool = False
    # A LoRA adapter served on the engines of ``base`` (another model of the config, not
    # an adapter): its files (PEFT layout, pushed with `thaw push`) at ``adapter_uri``.
    # Its shape, context and engine are its base's; its endpoint, limits, usage and idle
    # grace are its own.
    base: Name | None = None
    adapter_uri: S3Uri | None = None
    # On a base model: the adapters its engines may hold (default when it has adapters).
    lora: Lora | None = None
    # A tenant's private model: listed and callable only with that tenant's keys. None:
    # every tenant whose allowed_models admit it.
    tenant: Name | None = None
    # Its prices (None: not billed).
    pricing: Pricing | None = None
    # Scheduled pre-warm: replicas held through declared windows of known traffic.
    prewarm: list[Prewarm] = Field(default_factory=list)

    @property
    def resolved_served_name(self) -> str:
        return self.served_name or self.name

    @property
    def is_adapter(self) -> bool:
        return self.base is not None


class WeightCache(_Strict):
    """A worker's cache of model weights on its local disk (``shapes[].cache``).

    Filled as a model streams from the store (no second download), checked against the
    model's manifest, least recently used evicted within ``max_gib``. On AWS ``dir`` is
    the instance-store NVMe that ``infra/worker-bootstrap.sh`` mounts.
    """

    # Relative to the data directory. Workers of one machine share it.
    dir: Path
    # The cache's budget on disk; least recently used models are evicted beyond it.
    max_gib: PositiveFloat
    # Check every file a load reads (from the store or a cache) against the sha256 in
    # the model's manifest. Costs CPU (hashing every byte); without it a cached file is
    # checked by size and header only.
    verify_sha256: bool = True
    # A swap checks every tensor it hands the engine against the manifest (name, dtype,
    # shape, CRC-32), and then skips the sha256 of the worker's memory copy, checked
    # when it was filled. Off: a swap from that copy hashes every file (verify_sha256)
    # and proves only that every parameter was filled.
    verify_tensors: bool = True


class InstanceShape(_Strict):
    # What pools[].shape and models[].shape refer to.
    name: Name
    gpu_type: str = Field(description="e.g. 'h100-80gb', or 'cpu' for the embedded CPU engine")
    # GPUs per instance (0 for gpu_type cpu) and the memory of one.
    gpu_count: NonNegativeInt
    gpu_memory_gib: NonNegativeFloat = 0.0
    # The instance's memory, and what it costs an hour (sizes budgets and usage).
    host_memory_gib: PositiveFloat
    price_per_hour_usd: NonNegativeFloat
    # An instance of this shape that has not registered (heartbeat) this long after its
    # launch is terminated and replaced.
    boot_timeout_s: PositiveFloat = 600.0
    # How long a new standby of this shape usually takes to stand by (launch, boot,
    # runtime imports): the standby sizer covers the cold starts of that long.
    boot_s: PositiveFloat = 60.0
    # Local copies of model weights: on disk (None: none), and in host memory (a tmpfs,
    # /dev/shm) up to this many GiB, which keeps the last model a worker served while it
    # stands by (0: none).
    cache: WeightCache | None = None
    host_cache_gib: NonNegativeFloat = 0.0
    # CPU shapes: start the engine with the system's tcmalloc preloaded (as vLLM's CPU
    # backend asks; worker.allocator says why a swap needs it). Where the machine lacks
    # it the worker logs so and runs on glibc's malloc. Ignored on GPU shapes.
    engine_tcmalloc: bool = True

    @model_validator(mode="after")
    def _gpu(self) -> InstanceShape:
        if self.gpu_type != "cpu" and self.gpu_count == 0:
            raise ValueError(f"gpu_type {self.gpu_type!r} needs gpu_count >= 1 (use gpu_type 'cpu' for none)")
        if self.gpu_count > 0 and self.gpu_memory_gib <= 0:
            raise ValueError("gpu_memory_gib must be > 0 when gpu_count >= 1")
        if self.host_cache_gib >= self.host_memory_gib:
            raise ValueError(f"host_cache_gib ({self.host_cache_gib:g}) must be less than host_memory_gib "
                             f"({self.host_memory_gib:g})")
        return self


class Ec2Pool(_Strict):
    """Where and how the ``ec2`` provider launches a pool's instances."""

    # The AWS region the instances run in.
    region: Annotated[str, Field(min_length=1)]
    # Launch template name, or its id (lt-...). It carries the AMI, the instance profile
    # (the worker's role), security groups and disks; Thaw adds the rest.
    launch_template: Annotated[str, Field(min_length=1)]
    launch_template_version: str = "$Default"
    # Tried in order on a capacity error, for each instance type in turn.
    subnets: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    instance_types: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    # on-demand or spot instances.
    market: Literal["on-demand", "spot"] = "on-demand"
    # With market spot: when no spot capacity is left anywhere, launch on-demand.
    spot_fallback_to_on_demand: bool = True
    # The EC2 API endpoint; None: AWS's for the region (set for a VPC endpoint or tests).
    endpoint_url: str | None = None
    # The port `thaw worker` listens on for the controller on these instances.
    worker_port: Annotated[int, Field(ge=1, le=65535)] = 8200
    # Extra seconds between retries after a launch found no capacity anywhere:
    # backoff_base_s, doubled per consecutive failure, capped at backoff_max_s.
    backoff_base_s: PositiveFloat = 30.0
    backoff_max_s: PositiveFloat = 600.0


class Pool(_Strict):
    # The shapes[].name whose instances this pool holds (one pool per shape).
    shape: Name
    # local: worker processes on this machine; ec2: instances Thaw launches; static:
    # workers started elsewhere that register themselves (nothing launched or ended).
    provider: Literal["local", "ec2", "static"] = "local"
    # Required with provider 'ec2'.
    ec2: Ec2Pool | None = None
    # Bounds on the standby target: idle instances ready for the next cold start.
    standby_min: NonNegativeInt = 1
    standby_max: NonNegativeInt = 1
    # Caps on the whole pool for this shape (standby + serving).
    max_instances: PositiveInt = 4
    # Standby plus asleep spend of this pool never exceeds this (serving replicas of
    # models with traffic are never released for it).
    budget_usd_per_hour: NonNegativeFloat | None = None
    # The standby target follows cold starts per minute x the shape's boot time, plus
    # this many, between standby_min and standby_max; it rises at once and falls only
    # after standby_hold_s below the lower watermark.
    standby_margin: NonNegativeFloat = 0.0
    standby_hold_s: NonNegativeFloat = 300.0
    # EC2 only: instances kept stopped (storage cost only), started before launching
    # new ones when the running standby runs low.
    stopped_standby_min: NonNegativeInt = 0
    stopped_standby_max: NonNegativeInt = 0
    # Models whose engine class this pool's standbys build before any request (one class
    # per standby): a cold start of any model of such a class swaps its weights into a
    # built engine instead of building one. Models of this pool's shape.
    prebuild: list[Name] = Field(default_factory=list)
    # Several engines on one worker: a model goes into the free room of a worker already
    # serving (tier "packed") before it takes a standby, when its engine fits beside the
    # ones there (thaw.fit.engine_memory: on a GPU each engine's gpu_memory_utilization is
    # its share of the device; on the CPU its weights, cpu_kvcache_gib and processes).
    pack: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> Pool:
        if self.standby_min > self.standby_max:
            raise ValueError(
                f"standby_min ({self.standby_min}) must not exceed standby_max ({self.standby_max})"
            )
        if self.standby_max > self.max_instances:
            raise ValueError(
                f"standby_max ({self.standby_max}) must not exceed max_instances ({self.max_instances})"
            )
        if self.stopped_standby_min > self.stopped_standby_max:
            raise ValueError(f"stopped_standby_min ({self.stopped_standby_min}) must not exceed "
                             f"stopped_standby_max ({self.stopped_standby_max})")
        if self.stopped_standby_max > 0 and self.provider != "ec2":
            raise ValueError("stopped standby instances need provider 'ec2' (only EC2 can stop an instance)")
        if self.provider == "ec2" and self.ec2 is None:
            raise ValueError("provider 'ec2' needs an 'ec2' section (region, launch_template, subnets, "
                             "instance_types)")
        if self.provider != "ec2" and self.ec2 is not None:
            raise ValueError(f"an 'ec2' section needs provider 'ec2' (this pool's provider is {self.provider!r})")
        return self


class RateLimits(_Strict):
    # Per tenant and model (null: no limit): requests a minute, tokens a minute (prompt
    # plus max_tokens, reconciled with the real usage) and requests at once. Over one:
    # 429 with Retry-After.
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    max_concurrent_requests: PositiveInt | None = None


class Tenant(_Strict):
    # The tenant's name in keys, limits and usage.
    name: Name
    # Keys are stored only as hashes: "sha256:<hex>" of the key (see hash_api_key). May be
    # empty: keys added at run time (`thaw tenants keys add`) live in the controller's table.
    api_key_hashes: list[Sha256Hex] = Field(default_factory=list)
    # Model names, or ["*"] for every model.
    allowed_models: list[str] = Field(default_factory=lambda: ["*"])
    # Rate limits, per tenant and model.
    limits: RateLimits = RateLimits()


class FailedAuthThrottle(_Strict):
    """Requests with a missing or invalid API key, per client address and activator
    process: a token bucket of ``burst`` refilled at ``refill_per_s``; beyond it, 429.
    A valid key is never throttled."""

    # 401s one address may get before its next bad key gets 429.
    burst: PositiveInt = 20
    # How fast that allowance comes back, per second.
    refill_per_s: PositiveFloat = 1.0
    # Addresses tracked at once; the least recently seen is forgotten first.
    max_addresses: PositiveInt = 10_000


class Server(_Strict):
    # Where the activator (the OpenAI-compatible API) listens.
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    # A larger request body gets 413.
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    # Request headers beyond these get 431 (activator/bounds.py). Far beyond (over four
    # times max_header_bytes) the connection itself refuses them (thaw/serve.py).
    max_header_count: PositiveInt = 100
    max_header_bytes: PositiveInt = 16 * 1024
    max_header_line_bytes: PositiveInt = 8 * 1024
    # A JSON body nested deeper, or with a longer string (in characters), gets 400.
    max_json_depth: PositiveInt = 32
    max_json_string_chars: PositiveInt = 1024 * 1024
    # From a connection's first byte (or a request's) to the end of its headers; then
    # the connection is closed. From the end of the headers to the end of the body; then 408.
    header_timeout_s: PositiveFloat = 10.0
    body_timeout_s: PositiveFloat = 30.0
    failed_auth: FailedAuthThrottle = FailedAuthThrottle()
    # The activator's reads from replicas. A streamed answer whose replica is silent this
    # long (before its headers or first chunk, between two chunks: a stalled link or
    # engine) is cut: before its first byte the request goes to another replica, after
    # it the client gets an error event. A whole (not streamed) answer comes at its end,
    # so its replica may be silent up to upstream_timeout_s.
    upstream_stream_idle_s: PositiveFloat = 60.0
    upstream_timeout_s: PositiveFloat = 600.0
    # A streamed completion still held for a cold start after this long is answered 200
    # at once and sent an SSE comment line (ignored by OpenAI clients) this often until
    # its first token: the phase, and the time left when this activator has seen the
    # model start before. Proxies with an idle limit (an AWS ALB's is 60 s) keep its
    # connection. 0: no comments (the status waits for the first token, as for a
    # request answered whole). docs/REQUEST_PATH.md, "Held for a cold start".
    held_progress_interval_s: NonNegativeFloat = 15.0
    # A replica that failed before its first byte (refused, dropped or stalled) gets no
    # requests from this activator for this long (or until a route table drops it).
    replica_ejection_s: PositiveFloat = 10.0


class Cluster(_Strict):
    """What the controller, activators and workers of one deployment share."""

    # Tags instances (thaw:cluster) and names the deployment; one controller per name.
    name: Name = "thaw"
    # The bearer token every control-plane call carries. None: read the SSM parameter
    # below, else generated on first start into <data_dir>/cluster-token (mode 0600), so
    # services on one machine share it.
    token: SecretStr | None = None
    # Name or ARN of a Secrets Manager secret holding the token (AWS deployments; the
    # CloudFormation stack generates it), or the name of an SSM SecureString parameter.
    token_secret: str | None = None
    token_ssm_parameter: str | None = None
    # Workers report their state this often (and at once on every change).
    heartbeat_interval_s: PositiveFloat = 2.0
    # A worker not heard from for this long is unreachable (then replaced).
    worker_timeout_s: PositiveFloat = 15.0
    # EC2 workers: the config file they run with (uploaded by the operator; fetched at
    # boot with the instance role), and the pip requirement that installs Thaw there.
    worker_config_uri: S3Uri | None = None
    # The pip requirement that installs Thaw on EC2 workers (with worker_config_uri
    # above).
    worker_package: str | None = None

    @model_validator(mode="after")
    def _one_token_source(self) -> Cluster:
        if self.token_secret and self.token_ssm_parameter:
            raise ValueError("give token_secret (Secrets Manager) or token_ssm_parameter (SSM), not both")
        return self


class ControllerConfig(_Strict):
    """`thaw controller`: where it listens, and how the others reach it."""

    # Where the controller listens.
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8100
    # How activators and workers reach it; None: http://{host}:{port}.
    url: str | None = None
    # Several controllers sharing one PostgreSQL (state.backend postgres): each one's
    # URL. One leads; the others wait and answer with where the leader is, and every
    # client (activators, workers, `thaw`) follows the leader. Empty: [url].
    urls: list[Annotated[str, Field(pattern=r"^https?://\S+$")]] = []
    # The leader's lease: it renews it every lease_s / 6; a follower takes it over
    # once it has gone unrenewed for lease_s. None: 1.5 heartbeat intervals (so a
    # takeover starts within two).
    lease_s: PositiveFloat | None = None
    # For tests and rehearsals of a schedule, never for serving: `thaw pool clock
    # --advance S` (POST /v1/pool/clock, the cluster token) moves this controller's clock
    # forward (warm_pool.clock). Everything it times is on that clock, so a step is time
    # that passed at once.
    stepped_clock: bool = False

    @property
    def resolved_url(self) -> str:
        return (self.url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def resolved_urls(self) -> list[str]:
        """Every controller's URL, the leader among them (clients try them in order)."""
        return [u.rstrip("/") for u in self.urls] or [self.resolved_url]


class LedgerConfig(_Strict):
    # SQLite file (WAL); relative paths are under data_dir.
    path: Path = Path("usage.db")
    # Extra wait for more records before a commit; records that queued while the
    # previous commit ran always share the next one (one fsync).
    group_window_ms: NonNegativeFloat = 0.0
    # Ship sealed segments of the ledger to the object store (object_store.bucket), so
    # that `thaw usage` and /v1/usage cover every activator. Serving never waits on it.
    ship: bool = True
    # How often sealed segments are shipped, and the most records one segment holds.
    ship_interval_s: PositiveFloat = 10.0
    ship_max_records: PositiveInt = 5000
    # Segments go to <ship_prefix><activator-id>/<first-id>-<last-id>.jsonl.gz.
    ship_prefix: Annotated[str, Field(pattern=r"^([A-Za-z0-9._-]+/)+$")] = "usage/"


class BatchConfig(_Strict):
    """OpenAI's Files and Batches API on the activators (``/v1/files``, ``/v1/batches``)."""

    # Uploaded files go to <files_prefix><tenant>/<file id> in object_store.bucket; the
    # controller keeps what each holds (its owner, name, size) in the state database.
    files_prefix: Annotated[str, Field(pattern=r"^([A-Za-z0-9._-]+/)+$")] = "files/"
    # OpenAI's bounds for a batch input file.
    max_file_bytes: PositiveInt = 200 * 1024 * 1024
    max_file_lines: PositiveInt = 50_000
    # How long an upload's body may take (server.body_timeout_s bounds every other body).
    upload_timeout_s: PositiveFloat = 600.0
    # Batch requests take at most this share of a model's replica slots (on one
    # activator), and only slots no online request waits for; an online request that
    # finds every slot taken cuts one at once.
    max_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    # How often an activator looks for room and leases lines, and how long a lease lasts:
    # the activator renews it every lease_s / 3 while the line runs, so a line whose
    # activator died (or whose lease reply a dying controller never sent) runs again
    # about lease_s later.
    poll_interval_s: PositiveFloat = 1.0
    lease_s: Annotated[float, Field(ge=3, le=3600)] = 30.0
    # What a batch line costs, as a share of the model's prices (OpenAI's: half).
    price_factor: Annotated[float, Field(ge=0)] = 0.5
    # Batch runs on standbys the pools hold anyway (and on room replicas leave). This
    # spend per hour buys instances beyond the standby band for batch (0: none).
    max_usd_per_hour: NonNegativeFloat = 0.0


class ResponsesConfig(_Strict):
    """OpenAI's Responses API on the activators (``/v1/responses``): stored responses
    (``store: true``, the default) are kept in the controller's state database this long,
    then deleted."""

    # Stored responses older than this are deleted.
    retention_days: PositiveFloat = 30.0


class LimitsConfig(_Strict):
    """Where tenants' rate limits are counted: in each activator (``local``: limits are
    per activator), or in Redis, shared by every activator of the cluster."""

    # local: each activator counts alone; redis: every activator counts in one Redis.
    backend: Literal["local", "redis"] = "local"
    # redis://[user:password@]host:port/db, rediss:// (TLS) or unix:///path/to/socket.
    url: str | None = None
    # Every key starts with this; by default "thaw:<cluster.name>:limits", so clusters
    # may share one Redis.
    key_prefix: Annotated[str, Field(min_length=1)] = "thaw:thaw:limits"
    # Budget of one Redis call on the request path; past it, the request is decided by
    # this activator's share of the limits (degraded mode) and Redis is probed again
    # every retry_interval_s.
    timeout_ms: PositiveFloat = 100.0
    retry_interval_s: PositiveFloat = 1.0
    # A concurrency slot expires this long after its activator last refreshed it (every
    # lease_ttl_s / 3 while its request runs), so an activator that dies frees its slots.
    lease_ttl_s: Annotated[float, Field(ge=1.0)] = 30.0

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, v: str | None) -> str | None:
        # The URL may hold a password: the message does not repeat it.
        if v is not None and not re.match(r"^(redis|rediss|unix)://\S+$", v):
            raise ValueError("use redis://host:port/db, rediss://host:port/db (TLS) or unix:///path/to/socket")
        return v

    @model_validator(mode="after")
    def _url(self) -> LimitsConfig:
        if self.backend == "redis" and self.url is None:
            raise ValueError("backend 'redis' needs 'url' (redis://host:6379/0, rediss:// or unix://)")
        if self.backend == "local" and self.url is not None:
            raise ValueError("'url' is only used with backend 'redis'")
        return self


class StateConfig(_Strict):
    """Where the controller keeps what it must not lose: the model registry (every
    revision) and the tenants. ``sqlite``: a file under ``data_dir/controller``;
    ``postgres``: a PostgreSQL database (on AWS, RDS or Aurora), which several
    controllers may share."""

    # sqlite: one file under data_dir/controller; postgres: a database several
    # controllers may share.
    backend: Literal["sqlite", "postgres"] = "sqlite"
    # postgres: postgresql://USER@HOST:PORT/DB (a password from ${VAR}, $PGPASSWORD or ~/.pgpass).
    url: str | None = None

    @model_validator(mode="after")
    def _url(self) -> StateConfig:
        if self.backend == "postgres" and not (self.url or "").startswith(("postgresql://", "postgres://")):
            raise ValueError("backend postgres needs url: postgresql://USER@HOST:PORT/DB")
        if self.backend == "sqlite" and self.url is not None:
            raise ValueError("url is for backend postgres (sqlite keeps its file under data_dir)")
        return self


class _ModelIndex:
    """A config's models by name and served name, and the adapters of each base: a
    lookup costs the same with 10,000 models as with 10 (built once per models list)."""

    def __init__(self, models: list[Model]) -> None:
        self.models = models
        self.by_name: dict[str, Model] = {}
        self.adapters: dict[str, list[Model]] = {}
        for m in models:
            # The first model in order whose name or served name it is, as a scan finds.
            self.by_name.setdefault(m.name, m)
            self.by_name.setdefault(m.resolved_served_name, m)
            if m.base is not None:
                self.adapters.setdefault(m.base, []).append(m)


# The indexes of the last few models lists, by the list's id (each entry holds its list,
# so the id is not reused while the entry lives). A config is frozen: its list never
# changes; a copy with other models has another list.
_INDEXES: OrderedDict[int, _ModelIndex] = OrderedDict()
_INDEXES_KEPT = 16


def _models_index(models: list[Model]) -> _ModelIndex:
    index = _INDEXES.get(id(models))
    if index is None or index.models is not models:
        index = _INDEXES[id(models)] = _ModelIndex(models)
        while len(_INDEXES) > _INDEXES_KEPT:
            _INDEXES.popitem(last=False)
    return index


# -- the rules that relate models to each other and to the rest of the config -----------
# Each is defined once: ThawConfig's validators apply them to the whole file, and the
# registry (warm_pool.registry.in_force) to what one change of a model touches, so a
# deploy among 10,000 models is not a validation of 10,000.


def engine_entry(m: Any, gpus: Mapping[Any, int]) -> Any:
    """A ``models[]`` entry whose engine spans its shape's GPUs (``gpus``: each shape's
    ``gpu_count``) unless it says otherwise: resolved here once, so every consumer reads
    one number."""
    if isinstance(m, dict) and m.get("shape") in gpus and isinstance(m.get("engine", {}), dict):
        engine: dict[str, Any] = m.get("engine", {})
        if engine.get("tensor_parallel_size") is None:
            return {**m, "engine": {**engine, "tensor_parallel_size": max(gpus[m["shape"]], 1)}}
    return m


def adapter_entry(m: Any, i: int, entry_of: Callable[[Any], Any]) -> Any:
    """``models[i]`` as the config reads it (``entry_of``: another entry by name, None
    when there is none). An adapter's files are its ``uri``; its shape, context and engine
    its base's, filled in here so every consumer reads one place (a different value is an
    error of :func:`check_references`)."""
    if not isinstance(m, dict) or m.get("base") is None:
        return m
    base = entry_of(m["base"])
    what = f"models[{i}] ({m.get('name')})"
    # Said here: the fields left out would otherwise read as merely missing.
    if not isinstance(base, dict):
        raise ValueError(f"{what}: base {m['base']!r} is not a model of the config")
    if base.get("base") is not None:
        raise ValueError(f"{what}: base {m['base']!r} is an adapter itself; name its base")
    if m.get("adapter_uri") is None:
        raise ValueError(f"{what}: an adapter needs adapter_uri (its files)")
    m = {**m}
    m.setdefault("uri", m["adapter_uri"])
    for key in ("shape", "max_context_tokens", "engine"):
        if key in base:
            m.setdefault(key, base[key])
    return m


def check_unique_names(items: Sequence[Any]) -> None:
    """Shapes, models and tenants by ``name``, pools by ``shape``: each at most once."""
    key = "shape" if items and isinstance(items[0], Pool) else "name"
    seen: set[str] = set()
    for item in items:
        value = getattr(item, key)
        if value in seen:
            raise ValueError(f"duplicate {key} {value!r}")
        seen.add(value)


@dataclass(frozen=True)
class ModelIndex:
    """The models of a config as the rules look them up."""

    by_name: Mapping[str, Model]
    # Each served name -> the first model (in the config's order) that answers to it.
    served: Mapping[str, str]

    @classmethod
    def of(cls, models: Sequence[Model]) -> ModelIndex:
        # Reversed: of two models with one served name, the first is written last.
        return cls({m.name: m for m in models}, {m.resolved_served_name: m.name for m in reversed(models)})


def check_references(cfg: ThawConfig, index: ModelIndex, models: Iterable[tuple[int, Model]]) -> None:
    """Raise ``ValueError`` for the first rule that ``models`` (``(i, models[i])`` of
    ``cfg``, in order) break against the rest of ``cfg``, or that its pools or tenants
    break (``index``: ``cfg.models``'). Each rule goes over every model given before the
    next rule, as the whole file is checked: a change checked with only the models it
    touches fails with the message the whole file would."""
    checked = list(models)
    shapes = {s.name: s for s in cfg.shapes}
    for i, m in checked:
        if m.shape not in shapes:
            raise ValueError(
                f"models[{i}] ({m.name}): shape {m.shape!r} is not declared; declared: {sorted(shapes)}"
            )
    for i, p in enumerate(cfg.pools):
        _check_pool(i, p, cfg, shapes, index)
    for i, m in checked:
        _check_engine(i, m, shapes.get(m.shape))
    for i, m in checked:
        _check_adapter(i, m, index.by_name)
    for i, m in checked:
        try:
            cfg.object_store.check_model_uri(m.uri)
        except S3UriError as exc:
            raise ValueError(f"models[{i}] ({m.name}): uri {exc}") from None
    for _, m in checked:
        other = index.served[m.resolved_served_name]
        if other != m.name:
            raise ValueError(f"models {other!r} and {m.name!r} share the served name {m.resolved_served_name!r}")
    tenants = {t.name for t in cfg.tenants}
    for i, m in checked:
        if m.tenant is not None and m.tenant not in tenants:
            raise ValueError(f"models[{i}] ({m.name}): tenant {m.tenant!r} is not declared; declared: "
                             f"{sorted(tenants)}")
    for i, t in enumerate(cfg.tenants):
        unknown = [a for a in t.allowed_models if a != "*" and a not in index.by_name]
        if unknown:
            raise ValueError(f"tenants[{i}] ({t.name}): allowed_models names unknown models {unknown}")


def _check_pool(i: int, p: Pool, cfg: ThawConfig, shapes: Mapping[str, InstanceShape], index: ModelIndex) -> None:
    if p.shape not in shapes:
        raise ValueError(f"pools[{i}]: shape {p.shape!r} is not declared; declared: {sorted(shapes)}")
    wrong = [n for n in p.prebuild if (m := index.by_name.get(n)) is None or m.shape != p.shape]
    if wrong:
        on_shape = sorted(m.name for m in cfg.models if m.shape == p.shape)
        raise ValueError(
            f"pools[{i}] ({p.shape}): prebuild names {wrong}, which are not models of shape "
            f"{p.shape!r}; models of that shape: {on_shape}"
        )
    if len(set(p.prebuild)) != len(p.prebuild):
        raise ValueError(f"pools[{i}] ({p.shape}): prebuild names a model twice: {p.prebuild}")
    if p.pack and p.prebuild:
        raise ValueError(f"pools[{i}] ({p.shape}): pack and prebuild together are not supported yet "
                         "(a kept engine's memory is not counted in the fit); choose one")
    if p.provider == "ec2" and cfg.controller.url is None and not cfg.controller.urls:
        raise ValueError(
            f"pools[{i}] (ec2): set controller.url to the address its instances reach the "
            "controller at (their workers register there)"
        )


def _check_engine(i: int, m: Model, shape: InstanceShape | None) -> None:
    tp = m.engine.tensor_parallel_size or 1
    if shape is not None and shape.gpu_count > 0 and tp > shape.gpu_count:
        raise ValueError(
            f"models[{i}] ({m.name}): engine.tensor_parallel_size {tp} needs {tp} GPUs; shape "
            f"{m.shape!r} has {shape.gpu_count}"
        )
    if m.autoscaling.asleep_ttl_s > 0 and shape is not None and shape.gpu_count == 0:
        raise ValueError(
            f"models[{i}] ({m.name}): autoscaling.asleep_ttl_s needs vLLM's sleep mode, which needs a "
            f"GPU; shape {m.shape!r} has none (set asleep_ttl_s to 0)"
        )


def _check_adapter(i: int, m: Model, by_name: Mapping[str, Model]) -> None:
    if m.base is None:
        if m.adapter_uri is not None:
            raise ValueError(f"models[{i}] ({m.name}): adapter_uri needs base (the model it adapts)")
        return
    base = by_name.get(m.base)
    if base is None or base.base is not None:
        raise ValueError(f"models[{i}] ({m.name}): base {m.base!r} is not a model of the config"
                         if base is None else
                         f"models[{i}] ({m.name}): base {m.base!r} is an adapter itself; name its base")
    if m.adapter_uri is None or m.uri != m.adapter_uri:
        raise ValueError(f"models[{i}] ({m.name}): an adapter needs adapter_uri (its files), "
                         "and no uri of its own")
    for key in ("shape", "max_context_tokens", "engine"):
        if getattr(m, key) != getattr(base, key):
            raise ValueError(f"models[{i}] ({m.name}): an adapter's {key} is its base's "
                             f"({m.base}); leave it out")
    if m.lora is not None or m.autoscaling.asleep_ttl_s > 0 or m.prewarm:
        raise ValueError(f"models[{i}] ({m.name}): an adapter has no lora settings, asleep tier or "
                         "prewarm schedule of its own (set them on its base)")


class TelemetryConfig(_Strict):
    """OpenTelemetry traces (docs/guide/monitoring.md, "Traces"): off unless an
    endpoint is given. No span carries a prompt's or an answer's text (the conventions'
    opt-in gen_ai.input.messages and output.messages are not offered)."""

    # The OTLP/HTTP endpoint spans are sent to, e.g. http://collector:4318 (its
    # /v1/traces path is added). None: no spans are made at all.
    otlp_endpoint: Annotated[str, Field(pattern=r"^https?://\S+$")] | None = None
    # Headers sent with each export (a collector's API key).
    otlp_headers: dict[str, str] = {}
    # The share of hot, successful requests traced. A cold start, a failure and a
    # request whose caller sent a sampled W3C traceparent are always traced.
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01


class ThawConfig(_Strict):
    # Where Thaw keeps its state (store data, credentials, the cluster token, ledgers).
    # A relative data_dir is under the directory `thaw` runs in (load_config); the
    # other relative paths in the file (caches, the ledger, credential files) are under
    # data_dir.
    data_dir: Path = Path(".thaw")
    # How much the services log (JSON lines on stderr).
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # The activator: where it listens, bounds on requests, its reads from replicas.
    server: Server = Server()
    cluster: Cluster = Cluster()
    controller: ControllerConfig = ControllerConfig()
    # Usage records: each activator's SQLite ledger, shipped to the store.
    ledger: LedgerConfig = LedgerConfig()
    batch: BatchConfig = BatchConfig()
    responses: ResponsesConfig = ResponsesConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    limits: LimitsConfig = LimitsConfig()
    state: StateConfig = StateConfig()
    # Where model weights, usage segments and uploaded files live.
    object_store: ObjectStore = ObjectStore()
    # Instance shapes: what a worker runs on, and what it costs.
    shapes: list[InstanceShape] = Field(min_length=1)
    # Warm pools: standby instances kept per shape, within a budget.
    pools: list[Pool] = Field(default_factory=list)
    # The seed of a new cluster's model registry (afterwards: `thaw models ...`).
    models: list[Model] = Field(default_factory=list)
    # The seed of a new cluster's tenants (afterwards: `thaw tenants ...`).
    tenants: list[Tenant] = Field(default_factory=list)
    # Standby plus asleep spend across every pool never exceeds this.
    budget_usd_per_hour: NonNegativeFloat | None = None

    @model_validator(mode="before")
    @classmethod
    def _adapters(cls, data: Any) -> Any:
        """An adapter's files are its ``uri``; its shape, context and engine its base's
        (:func:`adapter_entry`)."""
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            return data
        by_name = {m.get("name"): m for m in data["models"] if isinstance(m, dict)}
        return {**data, "models": [adapter_entry(m, i, by_name.get) for i, m in enumerate(data["models"])]}

    @model_validator(mode="before")
    @classmethod
    def _tensor_parallel(cls, data: Any) -> Any:
        """A model's engine spans its shape's GPUs unless its engine says otherwise
        (:func:`engine_entry`). Pydantic runs the ``before`` validators last one first:
        this one before ``_adapters``, so an adapter takes its base's engine resolved."""
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            return data
        gpus: dict[Any, int] = {s.get("name"): s["gpu_count"] for s in data.get("shapes") or []
                                if isinstance(s, dict) and isinstance(s.get("gpu_count"), int)}
        return {**data, "models": [engine_entry(m, gpus) for m in data["models"]]}

    @model_validator(mode="before")
    @classmethod
    def _limits_prefix(cls, data: Any) -> Any:
        """Limits' keys are namespaced by the cluster unless ``limits.key_prefix`` says otherwise."""
        if not isinstance(data, dict) or not isinstance(data.get("limits", {}), dict):
            return data
        limits: dict[str, Any] = data.get("limits") or {}
        if limits.get("key_prefix") is None:
            cluster = data.get("cluster")
            name = cluster.get("name", "thaw") if isinstance(cluster, dict) else getattr(cluster, "name", "thaw")
            data = {**data, "limits": {**limits, "key_prefix": f"thaw:{name}:limits"}}
        return data

    @field_validator("shapes", "pools", "models", "tenants")
    @classmethod
    def _unique_names(cls, items: list[Any]) -> list[Any]:
        check_unique_names(items)
        return items

    @model_validator(mode="after")
    def _references(self) -> ThawConfig:
        if len(self.controller.urls) > 1 and self.state.backend != "postgres":
            raise ValueError("controller.urls names several controllers: they share their state and elect a "
                             "leader in PostgreSQL (state: {backend: postgres, url: ...})")
        check_references(self, ModelIndex.of(self.models), enumerate(self.models))
        return self

    def activator_dir(self, activator_id: str) -> Path:
        """What one activator keeps on its own disk: its ledger, the keys it was sent."""
        return self.data_dir / "activators" / activator_id

    def ledger_path_for(self, activator_id: str) -> Path:
        """The activator's own ledger (an absolute ``ledger.path`` is taken as is: one
        activator per machine)."""
        return self.ledger.path if self.ledger.path.is_absolute() else self.activator_dir(activator_id) / self.ledger.path

    def pool(self, shape: str) -> Pool | None:
        return next((p for p in self.pools if p.shape == shape), None)

    def shape(self, name: str) -> InstanceShape | None:
        return next((s for s in self.shapes if s.name == name), None)

    def adapters_of(self, base: str) -> list[Model]:
        """The adapters served on ``base``'s engines."""
        return list(_models_index(self.models).adapters.get(base, ()))

    def engine_model(self, m: Model) -> Model:
        """The model whose engine serves ``m``: its base for an adapter, else itself."""
        if m.base is None:
            return m
        base = self.model(m.base)
        assert base is not None  # checked at load
        return base

    def engine_args(self, m: Model) -> EngineArgs:
        """The engine settings ``m``'s engines start with: a base of adapters gets vLLM's
        LoRA flags (``lora``, or its defaults)."""
        if m.lora is None and not self.adapters_of(m.name):
            return m.engine
        lora = m.lora or Lora()
        return m.engine.model_copy(update={"extra": {
            **m.engine.extra, "enable_lora": True, "max_loras": lora.max_loras, "max_lora_rank": lora.max_lora_rank}})

    def model(self, name: str) -> Model | None:
        """The model of this name or served name (the first in order that has it; None
        for anything that is not a name, as a request's ``model`` field may be)."""
        if not isinstance(name, str):
            return None
        return _models_index(self.models).by_name.get(name)


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__(f"{path}: invalid config\n" + "\n".join(f"  - {p}" for p in problems))


def hash_api_key(key: str) -> str:
    """The form in which keys are stored in config and compared."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def format_errors(exc: ValidationError, at: tuple[str | int, ...] = ()) -> list[str]:
    """One line per problem, each naming the field path (``models[0].autoscaling.max_replicas``);
    ``at``: where the validated value sits in the config (``("models", 0)`` for one entry)."""
    lines = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        lines.append(_line((*at, *err["loc"]), msg))
    return lines


def format_problem(exc: ValueError, at: tuple[str | int, ...] = ()) -> str:
    """A rule's ``ValueError`` as :func:`format_errors` reports it when a validator of the
    config (``at`` the top level) or of one of its fields raises it."""
    return _line(at, str(exc))


def _line(loc: tuple[str | int, ...], msg: str) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path or '(top level)'}: {msg}"


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(text: str) -> str:
    # ${VAR} or ${VAR:-default}; an unset VAR without default is left for the
    # validator to reject rather than silently becoming "".
    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is not None:
            return value
        return m.group(2) if m.group(2) is not None else m.group(0)

    return _ENV_REF.sub(sub, text)


def parse_config(data: Any, *, base_dir: Path | None = None, source: str = "<config>") -> ThawConfig:
    try:
        cfg = ThawConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_errors(exc)) from None
    if base_dir is not None and not cfg.data_dir.is_absolute():
        cfg = cfg.model_copy(update={"data_dir": (base_dir / cfg.data_dir).resolve()})
    return cfg


def load_config(path: Path | str, base_dir: Path | None = None) -> ThawConfig:
    """Read, expand ``${ENV}`` references in, and validate a YAML config file.

    ``data_dir`` is resolved relative to ``base_dir``, by default the current directory
    (where `thaw` runs), so the example config keeps its data in ``./.thaw``; a command
    run elsewhere that takes the config of a running `thaw up` passes the directory
    that one ran in (thaw.cli.stack).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(p, [f"cannot read file: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(expand_env(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(p, [f"{where}not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(p, [f"top level must be a mapping, got {type(data).__name__}"])
    return parse_config(data, base_dir=base_dir or Path.cwd(), source=str(p))
