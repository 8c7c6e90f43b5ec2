"""What the agent and its engine host say to each other, and how a launch becomes vLLM flags.

The agent writes one :class:`LaunchCommand` as a JSON line to the engine host's
stdin, and later, to an engine launched ``swappable``, :class:`SwapCommand` and
:class:`ParkCommand` lines (``worker.engine_host.swap_server`` carries them out). The engine host (and the engine core process it forks) write events as JSON
lines to stdout, one ``os.write`` per line so that lines from several processes
sharing the pipe never interleave (writes up to PIPE_BUF bytes are atomic).
Anything else on that stdout is a stray print and is treated as log output.

This module is imported by the engine host before vLLM, so it stays light.
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from thaw.config import EngineArgs
from thaw.fit import cpu_kvcache_gib
from thaw.wire import FailureKind

# Events (the "event" field of a line on the engine host's stdout).
EV_IMPORTED = "imported"  # ready for a launch; fields: t, import_s, preloaded
EV_LAUNCHED = "launched"  # launch command accepted; fields: t, port
EV_WEIGHTS_LOADED = "weights_loaded"  # fields: t
EV_FAILED = "failed"  # fields: error, where ("engine_host" | "engine_core"), kind (FailureKind)
EV_SWAPPED = "swapped"  # fields: swap_id, load (the loader's summary), seconds (per step)
EV_SWAP_FAILED = "swap_failed"  # fields: swap_id, kind (SwapFailure), error, cause (FailureKind)
EV_PARKED = "parked"  # fields: swap_id, seconds (per step)
EVENTS = frozenset({EV_IMPORTED, EV_LAUNCHED, EV_WEIGHTS_LOADED, EV_FAILED, EV_SWAPPED, EV_SWAP_FAILED, EV_PARKED})

# Why a swap failed. Every kind leaves the engine dirty (never served again): "weights"
# (the store, a checksum, a shape, a parameter the checkpoint lacks), "prefix_cache"
# (blocks of the previous model could not all be dropped), "frontend" (the new model's
# config or tokenizer files), "engine" (anything else, e.g. the engine core died).
SwapFailure = Literal["weights", "prefix_cache", "frontend", "engine"]

# Longest error text carried in an event; keeps each line well under PIPE_BUF (4096).
MAX_ERROR_CHARS = 1500


class LaunchCommand(BaseModel):
    """Everything the engine host needs to start serving one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str
    served_model_name: str
    max_model_len: int
    engine: EngineArgs
    port: int
    host: str = "127.0.0.1"
    # Set in the engine host's (and the engine core's) environment before vLLM reads it.
    env: dict[str, str]
    # vLLM sleep mode (GPU): the engine can be put to sleep and woken (the asleep tier).
    sleep_mode: bool = False
    # Weights can be swapped into this engine later (SwapCommand), and it can be parked.
    swappable: bool = False
    # Whether the engine answers the OpenAI API once ready; False for an engine built
    # ahead of any assignment (it serves only after a swap).
    serving: bool = True


class SwapCommand(BaseModel):
    """Replace the engine's model by the one at ``uri`` (same engine class), in place:
    its weights, its prefix cache emptied, its served name, tokenizer, chat template
    and generation defaults. Answered by ``swapped`` or ``swap_failed``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Literal["swap"] = "swap"
    swap_id: str
    uri: str
    served_model_name: str
    # Thaw's loader options (model_loader_extra_config: caches, concurrency, checks).
    loader_options: dict[str, Any] = {}
    # A local copy of the model's files other than its weights (worker.front_end_files),
    # which the front end is rebuilt from; None: pulled from the store as vLLM does.
    files_dir: str | None = None


class ParkCommand(BaseModel):
    """Stop serving and drop the prefix cache, keeping the engine for a later swap (a
    release back to standby). Answered by ``parked``, or ``swap_failed``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Literal["park"] = "park"
    swap_id: str


HostCommand = Annotated[SwapCommand | ParkCommand, Field(discriminator="op")]
HOST_COMMAND: TypeAdapter[SwapCommand | ParkCommand] = TypeAdapter(HostCommand)
# The engine-core extension a swappable engine is started with (worker.engine_host.swap_core).
SWAP_EXTENSION = "worker.engine_host.swap_core.ThawSwapExtension"


def vllm_argv(cmd: LaunchCommand) -> list[str]:
    """The ``vllm serve``-style flags for a launch (parsed by vLLM's own arg parser)."""
    e = cmd.engine
    argv = [
        "--model", cmd.uri,
        "--load-format", e.load_format,
        "--served-model-name", cmd.served_model_name,
        "--max-model-len", str(cmd.max_model_len),
        "--dtype", e.dtype,
        "--tensor-parallel-size", str(e.tensor_parallel_size or 1),
        "--gpu-memory-utilization", str(e.gpu_memory_utilization),
        "--host", cmd.host,
        "--port", str(cmd.port),
        # Same seed on every replica: identical sampling for identical requests.
        "--seed", "0",
        # Usage says how many prompt tokens the prefix cache served: the ledger prices
        # them apart, and the Responses API shows them (cached_tokens).
        "--enable-prompt-tokens-details",
    ]
    if e.enforce_eager:
        argv.append("--enforce-eager")
    if cmd.sleep_mode:
        argv.append("--enable-sleep-mode")
    if cmd.swappable:
        argv.extend(["--worker-extension-cls", SWAP_EXTENSION])
    for key, value in e.extra.items():
        argv.extend(extra_flag(key, value))
    return argv


def extra_flag(key: str, value: Any) -> list[str]:
    """One ``engine.extra`` entry as flags: ``True`` is a bare flag, ``False`` its
    ``--no-`` form, lists and dicts are JSON (vLLM parses JSON for structured options)."""
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if value is None:
        return []
    if isinstance(value, dict | list):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def engine_env(
    engine: EngineArgs, store_env: dict[str, str], data_dir: str, *,
    cache_root: str | None = None, assets_dir: str | None = None, sleep_mode: bool = False,
) -> dict[str, str]:
    """Environment for one launch: the store's (runai streamer), the CPU KV cache, caches.

    ``cache_root`` and ``assets_dir`` (the agent's choice, see ``AgentSettings``) replace
    the defaults under ``data_dir``.
    """
    env = {
        **store_env,
        # vLLM reads whole GiB here; round up so the configured space always fits.
        "VLLM_CPU_KVCACHE_SPACE": str(cpu_kvcache_gib(engine)),
        # The executor runs inside the engine core process (no extra worker process).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        # The streamer's copies of config/tokenizer files land here, not in ~/.cache.
        "VLLM_CACHE_ROOT": os.path.join(data_dir, "vllm-cache"),
        "VLLM_ASSETS_CACHE": os.path.join(data_dir, "vllm-cache", "assets"),
    }
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = cache_root
        # Inductor's own caches (FX graphs, AOTAutograd, C++ kernels) under it too, not
        # in /tmp/torchinductor_<user>: vLLM redirects them only on its AOT path, and
        # a snapshot of the cache root must hold them.
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "torchinductor")
    if assets_dir is not None:
        env["VLLM_ASSETS_CACHE"] = assets_dir
    if sleep_mode:
        # vLLM serves /sleep and /wake_up only in its dev mode.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if engine.extra.get("enable_lora"):
        # vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this.
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def encode_event(event: str, **fields: Any) -> bytes:
    if "error" in fields and isinstance(fields["error"], str):
        fields["error"] = fields["error"][-MAX_ERROR_CHARS:]
    return (json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}) + "\n").encode()


def emit_event(event: str, **fields: Any) -> None:
    """Write one event line to fd 1 in a single write (see the module docstring)."""
    os.write(1, encode_event(event, **fields))


def decode_event(line: str) -> dict[str, Any] | None:
    """The event on this stdout line, or None for any other output."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if isinstance(obj, dict) and obj.get("event") in EVENTS:
        return obj
    return None


def failure_kind(exc: BaseException) -> FailureKind:
    """What kind of failure ``exc`` is, from the types in its chain (innermost first).
    Imports the loaders' exception types only now: this module stays light."""
    import botocore.exceptions

    from weight_streaming.fetch import FetchError
    from weight_streaming.s3_loader import ChecksumMismatch
    from weight_streaming.s3_source import S3Error, S3ObjectChanged
    from weight_streaming.safetensors_header import MalformedSafetensors

    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not e for e in chain):
        chain.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    for e in reversed(chain):
        if isinstance(e, ChecksumMismatch | S3ObjectChanged | MalformedSafetensors):
            return "weights_integrity"
        if isinstance(e, S3Error | FetchError | botocore.exceptions.BotoCoreError | botocore.exceptions.ClientError):
            return "store"
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":  # torch's, not imported here
            return "memory"
    return "engine"


def reported_kind(value: object) -> FailureKind:
    """A failure kind an engine host reported (anything else, or none: "engine")."""
    return value if value in get_args(FailureKind) else "engine"  # type: ignore[return-value]


def root_cause(exc: BaseException) -> str:
    """``Type: message`` of the innermost exception in the chain, prefixed by the
    outermost one when they differ (vLLM wraps loader errors in its own)."""
    chain = [exc]
    seen = {id(exc)}
    cur: BaseException | None = exc
    while cur is not None:
        nxt = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        chain.append(nxt)
        cur = nxt

    def fmt(e: BaseException) -> str:
        msg = str(e).strip()
        return f"{type(e).__name__}: {msg}" if msg else type(e).__name__

    inner, outer = fmt(chain[-1]), fmt(chain[0])
    return inner if inner == outer else f"{inner} (while: {outer})"


# The module the engine host's forkserver preloads (see worker.engine_host.engine_core_entry).
FORKSERVER_PRELOAD = "worker.engine_host.engine_core_entry"


def forkserver_probe() -> None:
    """Target of a probe process forked from the engine host's forkserver: exit 0 when
    the preload is in the forkserver (multiprocessing ignores a failed preload
    import silently), 3 when it is not."""
    import sys

    sys.exit(0 if FORKSERVER_PRELOAD in sys.modules else 3)
