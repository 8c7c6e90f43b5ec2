#!/usr/bin/env python3
"""One-shot GPU benchmark for Thaw's cold-start path, run on a lent GPU machine.

    python3 loadtests/gpu/gpu_bench.py --out $OUT/gpu_bench.json
    python3 loadtests/gpu/gpu_bench.py --device cpu --size-gb 0.2 --out /tmp/b.json   # smoke run

Measures, in one run (each section records its own error and the run goes on; the
JSON is rewritten after every section so a timeout keeps what was measured):

1. an 8B-shaped (Llama-3-8B) random bf16 model written as HF-style shards;
2. the pinned and pageable host->device copy ceilings;
3. Thaw's streamer loading the whole model to the device (page-cache source);
4. baselines: safetensors ``load_file`` then ``.to(device)``, and ``load_file(device=)``;
5. correctness: Thaw's tensors equal safetensors' bit for bit;
6. CUDA-graph capture time vs eager and replay step times for a Llama-8B decoder;
7. the CUDA checkpoint driver API (lock / checkpoint / restore / unlock) on a child
   process holding the weights and graphs, vs recapturing them;
8. environment facts and the headline ``ratios``.

Needs only torch, safetensors and numpy (and the repo's ``weight_streaming``).

One piece: the device machine runs this file alone, without Thaw's packages or vLLM, so
everything it needs is in it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import importlib
import json
import math
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
import types
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T0 = time.perf_counter()
GB = 1e9
GiB = 1 << 30
MiB = 1 << 20


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def import_streamer() -> types.ModuleType:
    """Import weight_streaming.streamer even if the package __init__ pulls in extras
    (boto3, pydantic) that this machine lacks: fall back to a bare package object."""
    try:
        return importlib.import_module("weight_streaming.streamer")
    except ImportError as exc:
        log(f"plain import failed ({exc!r}); importing weight_streaming without its __init__")
        for name in [
            m for m in sys.modules if m == "weight_streaming" or m.startswith("weight_streaming.")
        ]:
            del sys.modules[name]
        pkg = types.ModuleType("weight_streaming")
        pkg.__path__ = [str(REPO_ROOT / "weight_streaming")]
        sys.modules["weight_streaming"] = pkg
        return importlib.import_module("weight_streaming.streamer")


# --- model shape --------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 4096
    intermediate: int = 14336
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256
    head_dim: int = 128

    def layer_tensors(self, i: int) -> list[tuple[str, tuple[int, ...]]]:
        h, q, kv, inter = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        p = f"model.layers.{i}."
        specs: list[tuple[str, tuple[int, ...]]] = [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
        return specs

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        out: list[tuple[str, tuple[int, ...]]] = [
            ("model.embed_tokens.weight", (self.vocab, self.hidden))
        ]
        for i in range(self.layers):
            out += self.layer_tensors(i)
        out += [
            ("model.norm.weight", (self.hidden,)),
            ("lm_head.weight", (self.vocab, self.hidden)),
        ]
        return out

    def nbytes(self) -> int:
        return sum(math.prod(s) for _, s in self.tensors()) * 2  # bf16


def config_for_size(size_gb: float) -> ModelConfig:
    """Llama-3-8B (~16 GB) for the default; fewer layers, then narrower dims, for smaller sizes."""
    full = ModelConfig()
    if size_gb * GB >= full.nbytes():
        return full
    scale = 1
    while True:
        cfg = ModelConfig(
            hidden=4096 // scale,
            intermediate=14336 // scale,
            layers=1,
            heads=max(1, 32 // scale),
            kv_heads=max(1, 8 // scale),
            vocab=128256 // scale,
        )
        one = cfg.nbytes()
        per_layer = ModelConfig.nbytes(replace(cfg, layers=2)) - one
        if one <= size_gb * GB or scale >= 64:
            layers = max(1, min(32, round((size_gb * GB - one) / per_layer) + 1))
            return replace(cfg, layers=layers)
        scale *= 2


# --- report -------------------------------------------------------------------------


class Report:
    def __init__(self, path: Path, budget_s: float) -> None:
        self.path = path
        self.budget_s = budget_s
        self.data: dict[str, Any] = {"started_unix": time.time(), "sections": {}, "ratios": {}}

    def remaining(self) -> float:
        return self.budget_s - (time.perf_counter() - T0)

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - T0, 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def section(
        self, name: str, *, min_remaining_s: float = 0.0
    ) -> Iterator[dict[str, Any] | None]:
        entry: dict[str, Any] = self.data["sections"].setdefault(name, {})
        if self.remaining() < min_remaining_s:
            entry["skipped"] = (
                f"time budget: {self.remaining():.0f}s left, section needs ~{min_remaining_s:.0f}s"
            )
            log(f"== {name}: SKIPPED ({entry['skipped']})")
            self.write()
            yield None
            return
        log(f"== {name}")
        t = time.perf_counter()
        try:
            yield entry
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            log(f"!! {name} failed: {entry['error']}")
        finally:
            entry["section_s"] = round(time.perf_counter() - t, 3)
            self.write()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_device(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# --- 1. model files -----------------------------------------------------------------


def generate_model(
    cfg: ModelConfig, directory: Path, device: torch.device, entry: dict[str, Any]
) -> list[Path]:
    """Write HF-style bf16 shards: header + raw bytes, no second copy of the model in RAM.

    Tensor bytes are slices of one random pool at per-tensor offsets, so every tensor
    differs (a misplaced tensor fails the equality check) without generating 16 GB of
    random numbers.
    """
    specs = cfg.tensors()
    total = cfg.nbytes()
    shard_limit = min(5 * GB, max(total / 3, 1))  # Llama-3-8B: 4 shards of <= 5 GB, like HF
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        nb = math.prod(shape) * 2
        if shards[-1] and size + nb > shard_limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nb
    marker = directory / "bench_model.json"
    want = {"config": asdict(cfg), "shards": len(shards), "version": 1}
    paths = [
        directory / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        for i in range(len(shards))
    ]
    if (
        marker.exists()
        and json.loads(marker.read_text()) == want
        and all(p.exists() for p in paths)
    ):
        entry["reused_existing_files"] = True
        log(f"reusing model files in {directory}")
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors"):
        old.unlink()
    free = shutil.disk_usage(directory).free
    entry["disk_free_gb"] = round(free / GB, 1)
    if free < total * 1.05:
        raise RuntimeError(
            f"{directory} has {free / GB:.1f} GB free, the model needs {total / GB:.1f} GB: pass --dir"
        )

    largest = max(math.prod(s) for _, s in specs) * 2
    slack = 64 * MiB
    t = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(1234)
    pool_t = (
        torch.randn((largest + slack) // 2, dtype=torch.float32, device=device, generator=gen)
        * 0.02
    ).to(torch.bfloat16)
    pool = pool_t.view(torch.uint8).cpu().numpy()
    del pool_t
    entry["random_pool_s"] = round(time.perf_counter() - t, 3)

    def write_shard(path: Path, shard: list[tuple[str, tuple[int, ...]]]) -> int:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        pos = 0
        for name, shape in shard:
            nb = math.prod(shape) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [pos, pos + nb]}
            pos += nb
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)  # data region 8-aligned, as safetensors writes it
        with open(path, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for name, shape in shard:
                nb = math.prod(shape) * 2
                off = (zlib.crc32(name.encode()) % (slack // 2)) * 2
                f.write(pool[off : off + nb].data)
        return pos

    t = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as ex:
        written = sum(ex.map(write_shard, paths, shards))
    entry["write_s"] = round(time.perf_counter() - t, 3)
    entry["write_gbps"] = round(written / entry["write_s"] / GB, 2)
    marker.write_text(json.dumps(want))
    return paths


def fs_type(path: Path) -> str:
    """Filesystem type under ``path`` (tmpfs means 'disk' reads are RAM reads)."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if (
                len(parts) > 2
                and str(path.resolve()).startswith(parts[1])
                and len(parts[1]) > len(best)
            ):
                best, kind = parts[1], parts[2]
    return f"{kind} ({best})"


def meminfo_kb(key: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


# --- 2. copy ceilings ---------------------------------------------------------------


def copy_ceilings(device: torch.device, entry: dict[str, Any], nbytes: int, reps: int) -> None:
    t = time.perf_counter()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    entry["pin_alloc_s"] = round(time.perf_counter() - t, 3)
    pinned.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    entry["bytes"] = nbytes

    def timed(fn: Callable[[], object]) -> list[float]:
        out = []
        for _ in range(reps):
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            out.append(nbytes / (time.perf_counter() - t) / GB)
        return out

    h2d = timed(lambda: dev.copy_(pinned, non_blocking=True))
    entry["pinned_h2d_gbps"] = [round(x, 2) for x in h2d]
    entry["pinned_h2d_best_gbps"] = round(max(h2d), 2)
    entry["pinned_h2d_median_gbps"] = round(med(h2d), 2)
    d2h = timed(lambda: pinned.copy_(dev, non_blocking=True))
    entry["pinned_d2h_best_gbps"] = round(max(d2h), 2)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.fill_(7)  # fault the pages in: first-touch cost is not copy cost
    pg = timed(lambda: dev.copy_(pageable))
    entry["pageable_h2d_gbps"] = [round(x, 2) for x in pg]
    entry["pageable_h2d_best_gbps"] = round(max(pg), 2)
    entry["pageable_h2d_median_gbps"] = round(med(pg), 2)


# --- 3-5. streamer and baselines ----------------------------------------------------


def thaw_load(
    streamer: types.ModuleType, paths: list[Path], device: torch.device, chunk: int, conc: int
) -> tuple[float, float, int]:
    """(seconds, GB/s, bytes) for one full load, tensors freed afterwards."""
    sync(device)
    t = time.perf_counter()
    res = streamer.load_many(paths, device=device, chunk_bytes=chunk, concurrency=conc)
    sync(device)
    dt = time.perf_counter() - t
    nbytes = res.stats.bytes
    del res
    free_device(device)
    return dt, nbytes / dt / GB, nbytes


def st_load_then_to(paths: list[Path], device: torch.device) -> tuple[float, int]:
    from safetensors.torch import load_file

    sync(device)
    t = time.perf_counter()
    nbytes = 0
    keep = []
    for p in paths:
        sd = load_file(str(p))
        moved = {k: v.to(device) for k, v in sd.items()}
        nbytes += sum(v.numel() * v.element_size() for v in moved.values())
        del sd
        keep.append(moved)
    sync(device)
    dt = time.perf_counter() - t
    del keep
    free_device(device)
    return dt, nbytes


def st_load_device(paths: list[Path], device: torch.device) -> tuple[float, int]:
    from safetensors.torch import load_file

    sync(device)
    t = time.perf_counter()
    keep = [load_file(str(p), device=str(device)) for p in paths]
    sync(device)
    dt = time.perf_counter() - t
    nbytes = sum(v.numel() * v.element_size() for sd in keep for v in sd.values())
    del keep
    free_device(device)
    return dt, nbytes


def evict_page_cache(paths: list[Path]) -> dict[str, Any]:
    """Drop the model files from the page cache: drop_caches if writable, else fadvise."""
    info: dict[str, Any] = {"cached_kb_before": meminfo_kb("Cached")}
    t = time.perf_counter()
    os.sync()  # dirty pages cannot be dropped
    info["sync_s"] = round(time.perf_counter() - t, 2)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        info["method"] = "drop_caches"
    except OSError as exc:
        info["drop_caches_error"] = repr(exc)
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        info["method"] = "posix_fadvise(DONTNEED)"
    info["cached_kb_after"] = meminfo_kb("Cached")
    return info


# --- 6. decoder + CUDA graphs -------------------------------------------------------


class Decoder:
    """Llama-shaped decode step: RMSNorm, fused QKV, attention over a static KV cache
    (no RoPE), o_proj, SwiGLU MLP. Random bf16 weights; deterministic for a seed."""

    def __init__(
        self,
        cfg: ModelConfig,
        layers: int,
        max_batch: int,
        kv_len: int,
        device: torch.device,
        seed: int = 0,
    ) -> None:
        self.cfg = cfg
        self.kv_len = kv_len
        # Set after a failed capture: the math SDPA backend is plain matmuls, always capturable.
        self.force_math_sdpa = False
        gen = torch.Generator(device=device).manual_seed(seed)
        dt = torch.bfloat16
        h, q, kv, inter = (
            cfg.hidden,
            cfg.heads * cfg.head_dim,
            cfg.kv_heads * cfg.head_dim,
            cfg.intermediate,
        )

        def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
            return (
                torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
            ).to(dt)

        self.layers = []
        for _ in range(layers):
            self.layers.append(
                {
                    "ln1": torch.ones(h, device=device, dtype=dt),
                    "wqkv": rnd(q + 2 * kv, h),
                    "wo": rnd(h, q),
                    "ln2": torch.ones(h, device=device, dtype=dt),
                    "wgu": rnd(2 * inter, h),
                    "wd": rnd(h, inter),
                    "k": rnd(max_batch, cfg.kv_heads, kv_len, cfg.head_dim, scale=1.0),
                    "v": rnd(max_batch, cfg.kv_heads, kv_len, cfg.head_dim, scale=1.0),
                }
            )

    def weight_bytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for lw in self.layers
            for k, t in lw.items()
            if k not in ("k", "v")
        )

    def kv_bytes(self) -> int:
        return sum(lw[k].numel() * lw[k].element_size() for lw in self.layers for k in ("k", "v"))

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def step(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b = x.shape[0]
        nq, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        group = nq // nkv
        pos = self.kv_len - 1  # the new token's slot: static, so capture-safe
        for lw in self.layers:
            hs = self._rms(x, lw["ln1"])
            q, k, v = (hs @ lw["wqkv"].t()).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
            kc, vc = lw["k"][:b], lw["v"][:b]
            kc[:, :, pos].copy_(k.reshape(b, nkv, hd))
            vc[:, :, pos].copy_(v.reshape(b, nkv, hd))
            # GQA for a single decode token without repeating K/V: the `group` query
            # heads sharing a KV head act as `group` query positions of that head.
            qg = q.reshape(b, nkv, group, hd)
            if self.force_math_sdpa:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.MATH):
                    attn = F.scaled_dot_product_attention(qg, kc, vc)
            else:
                attn = F.scaled_dot_product_attention(qg, kc, vc)
            x = x + attn.reshape(b, nq * hd) @ lw["wo"].t()
            hs = self._rms(x, lw["ln2"])
            gate, up = (hs @ lw["wgu"].t()).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ lw["wd"].t()
        return x


class GraphRunner:
    """Captures one CUDA graph per decode batch size, largest first, in one shared
    memory pool (what vLLM does), with eager warmup runs on a side stream first."""

    def __init__(
        self, model: Decoder, batch_sizes: list[int], device: torch.device, warmups: int = 2
    ) -> None:
        self.model = model
        self.device = device
        self.batch_sizes = sorted(batch_sizes, reverse=True)
        self.warmups = warmups
        gen = torch.Generator(device=device).manual_seed(99)
        self.static_x = torch.randn(
            max(batch_sizes), model.cfg.hidden, generator=gen, device=device
        ).to(torch.bfloat16)
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.capture_s_by_batch: dict[int, float] = {}

    def capture(self) -> float:
        self.graphs.clear()
        self.outputs.clear()
        pool = torch.cuda.graph_pool_handle()
        sync(self.device)
        t_all = time.perf_counter()
        for b in self.batch_sizes:
            t = time.perf_counter()
            xb = self.static_x[:b]
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmups):
                    self.model.step(xb)
            torch.cuda.current_stream(self.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[b] = self.model.step(xb)
            self.graphs[b] = g
            sync(self.device)
            self.capture_s_by_batch[b] = round(time.perf_counter() - t, 4)
        sync(self.device)
        return time.perf_counter() - t_all

    def replay(self, b: int) -> torch.Tensor:
        self.graphs[b].replay()
        return self.outputs[b]


def capture_with_fallback(runner: GraphRunner) -> tuple[float, str | None]:
    """Capture; if the default attention kernel refuses capture, retry with the math one."""
    try:
        return runner.capture(), None
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        log(f"capture failed ({err}); retrying with the math SDPA backend")
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        runner.model.force_math_sdpa = True
        return runner.capture(), err


def time_steps(
    fn: Callable[[], object], device: torch.device, iters: int, warmup: int = 2
) -> float:
    """Mean seconds per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t) / iters


def graph_section(
    cfg: ModelConfig, args: argparse.Namespace, device: torch.device, entry: dict[str, Any]
) -> None:
    layers = min(args.graph_layers, cfg.layers) if device.type == "cpu" else args.graph_layers
    sizes = args.batch_sizes if device.type == "cuda" else [b for b in args.batch_sizes if b <= 4]
    t = time.perf_counter()
    model = Decoder(cfg, layers, max(sizes), args.kv_len, device)
    sync(device)
    entry.update(
        layers=layers,
        batch_sizes=sizes,
        kv_len=args.kv_len,
        build_s=round(time.perf_counter() - t, 3),
        weight_gb=round(model.weight_bytes() / GB, 3),
        kv_cache_gb=round(model.kv_bytes() / GB, 3),
    )
    gen = torch.Generator(device=device).manual_seed(99)
    x_all = torch.randn(max(sizes), cfg.hidden, generator=gen, device=device).to(torch.bfloat16)
    iters = args.step_iters
    with torch.no_grad():
        # First eager step pays lazy init (cuBLAS handles, kernel loading): report it apart.
        t = time.perf_counter()
        model.step(x_all[:1])
        sync(device)
        entry["first_eager_step_s"] = round(time.perf_counter() - t, 4)
        eager = {
            b: time_steps(functools.partial(model.step, x_all[:b]), device, iters) for b in sizes
        }
        entry["eager_step_ms"] = {b: round(s * 1e3, 3) for b, s in eager.items()}
        if device.type != "cuda":
            entry["graphs"] = "skipped: CUDA graphs need a CUDA device"
            return
    runner = GraphRunner(model, sizes, device)
    with torch.no_grad():
        capture_s, capture_error = capture_with_fallback(runner)
        if capture_error:
            entry["capture_error_default_sdpa"] = capture_error
            entry["sdpa_backend"] = "math (fallback)"
        entry["capture_total_s"] = round(capture_s, 3)
        entry["capture_s_by_batch"] = runner.capture_s_by_batch
        replay = {b: time_steps(functools.partial(runner.replay, b), device, iters) for b in sizes}
        entry["replay_step_ms"] = {b: round(s * 1e3, 3) for b, s in replay.items()}
        entry["eager_over_replay"] = {b: round(eager[b] / replay[b], 2) for b in sizes}
        diffs = {}
        for b in sizes:
            ref = model.step(runner.static_x[:b]).float()
            got = runner.replay(b).float()
            diffs[b] = float((ref - got).abs().max())
        entry["replay_vs_eager_max_abs_diff"] = diffs
        entry["recapture_total_s"] = round(runner.capture(), 3)


# --- 7. CUDA checkpoint via a child process -----------------------------------------


class CudaCheckpointAPI:
    """ctypes bindings for the driver's process checkpoint API (CUDA 12.8+ drivers)."""

    STATES = {0: "RUNNING", 1: "LOCKED", 2: "CHECKPOINTED", 3: "FAILED"}

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuInit.argtypes = [ctypes.c_uint]
        self.lib.cuInit.restype = ctypes.c_int
        self._check("cuInit", self.lib.cuInit(0))
        for name in ("Lock", "Checkpoint", "Restore", "Unlock"):
            fn = getattr(self.lib, f"cuCheckpointProcess{name}")  # AttributeError: old driver
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p]
            fn.restype = ctypes.c_int
        self.has_get_state = hasattr(self.lib, "cuCheckpointProcessGetState")
        if self.has_get_state:
            self.lib.cuCheckpointProcessGetState.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int),
            ]
            self.lib.cuCheckpointProcessGetState.restype = ctypes.c_int

    def _error(self, code: int) -> str:
        s = ctypes.c_char_p()
        with contextlib.suppress(Exception):
            self.lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            self.lib.cuGetErrorString(code, ctypes.byref(s))
        return f"CUresult {code} ({s.value.decode() if s.value else '?'})"

    def _check(self, what: str, code: int) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed: {self._error(code)}")

    def call(self, name: str, pid: int, timeout_ms: int = 0) -> None:
        # Every args struct is 64 bytes of reserved-must-be-zero fields today, except
        # Lock's leading `unsigned int timeoutMs`; a zeroed 256-byte block covers them.
        args = (ctypes.c_uint8 * 256)()
        if name == "Lock":
            ctypes.c_uint.from_buffer(args).value = timeout_ms
        self._check(
            f"cuCheckpointProcess{name}",
            getattr(self.lib, f"cuCheckpointProcess{name}")(pid, ctypes.byref(args)),
        )

    def state(self, pid: int) -> str:
        if not self.has_get_state:
            return "n/a (no cuCheckpointProcessGetState)"
        st = ctypes.c_int(-1)
        code = self.lib.cuCheckpointProcessGetState(pid, ctypes.byref(st))
        return self.STATES.get(st.value, str(st.value)) if code == 0 else self._error(code)


class Child:
    """A child python process speaking one JSON line per request and per reply."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def recv(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"child sent nothing for {timeout_s:.0f}s") from None
        if line is None:
            raise RuntimeError(f"child exited with code {self.proc.wait()}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"child: {msg['error']}")
        return msg

    def ask(self, cmd: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd}) + "\n")
        self.proc.stdin.flush()
        return self.recv(timeout_s)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask("exit", 10)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=15)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=15)


def child_main(args: argparse.Namespace) -> None:
    """Holds a decoder with captured graphs; answers replay/recapture/exit on stdin."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the protocol
    device = torch.device(args.device)

    def send(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    try:
        cfg = config_for_size(args.size_gb)
        sizes = (
            args.batch_sizes if device.type == "cuda" else [b for b in args.batch_sizes if b <= 4]
        )
        layers = args.graph_layers if device.type == "cuda" else min(args.graph_layers, cfg.layers)
        t = time.perf_counter()
        model = Decoder(cfg, layers, max(sizes), args.kv_len, device)
        sync(device)
        build_s = time.perf_counter() - t
        runner: GraphRunner | None = None
        with torch.no_grad():
            if device.type == "cuda":
                runner = GraphRunner(model, sizes, device)
                capture_s, _ = capture_with_fallback(runner)
                run: Callable[[int], torch.Tensor] = runner.replay
            else:
                capture_s = 0.0
                x_all = torch.randn(max(sizes), cfg.hidden).to(torch.bfloat16)

                def run(b: int) -> torch.Tensor:
                    return model.step(x_all[:b])

            refs = {b: run(b).float().cpu() for b in sizes}
        sync(device)
        mem = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
        send(
            {
                "ready": True,
                "build_s": build_s,
                "capture_s": capture_s,
                "reserved_bytes": mem,
                "pid": os.getpid(),
            }
        )
        for line in sys.stdin:
            cmd = json.loads(line)["cmd"]
            if cmd == "exit":
                send({"bye": True})
                return
            with torch.no_grad():
                if cmd == "replay":
                    t = time.perf_counter()
                    equal = {b: bool(torch.equal(run(b).float().cpu(), refs[b])) for b in sizes}
                    sync(device)
                    send(
                        {
                            "equal": equal,
                            "all_equal": all(equal.values()),
                            "replay_check_s": time.perf_counter() - t,
                        }
                    )
                elif cmd == "recapture":
                    send({"recapture_s": runner.capture() if runner else 0.0})
                else:
                    send({"error": f"unknown command {cmd!r}"})
    except Exception as exc:
        send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]})


def proc_rss_kb(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def checkpoint_section(
    args: argparse.Namespace, device: torch.device, entry: dict[str, Any]
) -> None:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--device", str(device),
        "--size-gb", str(args.size_gb),
        "--graph-layers", str(args.graph_layers),
        "--kv-len", str(args.kv_len),
        "--batch-sizes", *[str(b) for b in args.batch_sizes],
    ]  # fmt: skip
    t = time.perf_counter()
    child = Child(argv)
    try:
        ready = child.recv(timeout_s=min(300.0, max(60.0, args.budget_s)))
        entry["child_start_to_ready_s"] = round(time.perf_counter() - t, 3)
        entry["child_build_s"] = round(ready["build_s"], 3)
        entry["child_capture_s"] = round(ready["capture_s"], 3)
        entry["child_reserved_gb"] = round(ready["reserved_bytes"] / GB, 3)
        pid = child.proc.pid
        if device.type != "cuda":
            entry["checkpoint"] = "skipped: needs a CUDA device"
            entry["replay_after"] = child.ask("replay", 120)
            return
        api = CudaCheckpointAPI()
        entry["api"] = "ctypes libcuda.so.1"
        states = {"before": api.state(pid)}
        rss = {"before_kb": proc_rss_kb(pid)}
        free_before, _ = torch.cuda.mem_get_info(device)
        steps: dict[str, float] = {}

        def timed(name: str, **kw: int) -> None:
            t = time.perf_counter()
            api.call(name, pid, **kw)
            steps[name.lower() + "_s"] = round(time.perf_counter() - t, 4)
            states["after_" + name.lower()] = api.state(pid)
            entry["steps"] = steps
            entry["states"] = states

        # A daemon thread with a deadline: a driver call that never returns must not
        # take the rest of the benchmark with it.
        outcome: list[BaseException | None] = []

        def run_cycle() -> None:
            try:
                timed("Lock", timeout_ms=30_000)
                timed("Checkpoint")
                free_mid, _ = torch.cuda.mem_get_info(device)
                entry["device_bytes_released_gb"] = round((free_mid - free_before) / GB, 3)
                rss["checkpointed_kb"] = proc_rss_kb(pid)
                timed("Restore")
                timed("Unlock")
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome.append(exc)

        th = threading.Thread(target=run_cycle, daemon=True)
        th.start()
        th.join(timeout=240)
        entry["rss"] = rss
        if th.is_alive():
            raise TimeoutError(f"checkpoint cycle did not finish in 240s; states so far {states}")
        if outcome and outcome[0] is not None:
            raise outcome[0]
        entry["checkpoint_plus_restore_s"] = round(steps["checkpoint_s"] + steps["restore_s"], 4)
        entry["full_cycle_s"] = round(sum(steps.values()), 4)
        rep = child.ask("replay", 120)
        entry["replay_after_restore_equal"] = rep["all_equal"]
        entry["replay_after_restore"] = rep
        entry["recapture_warm_process_s"] = round(child.ask("recapture", 300)["recapture_s"], 3)
    finally:
        child.close()


# --- environment --------------------------------------------------------------------


def run_cmd(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (out.stdout.strip() or out.stderr.strip())[:2000]
    except Exception as exc:  # noqa: BLE001
        return f"error: {exc!r}"


def environment(device: torch.device, model_dir: Path) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "host_mem_total_gb": round((meminfo_kb("MemTotal") or 0) * 1024 / GB, 1),
        "model_dir": str(model_dir),
        "model_dir_fs": fs_type(model_dir),
    }
    with contextlib.suppress(Exception):
        import safetensors

        env["safetensors"] = safetensors.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["gpu_mem_gb"] = round(props.total_memory / GB, 1)
        env["nvidia_smi"] = run_cmd(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,"
                "pcie.link.gen.max,pcie.link.width.max,memory.total,persistence_mode",
                "--format=csv",
            ]
        )
        with contextlib.suppress(Exception):
            v = ctypes.c_int()
            ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
            env["cuda_driver_api_version"] = v.value
    return env


# --- main ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("gpu_bench.json"))
    p.add_argument(
        "--dir", type=Path, default=Path("/tmp/thaw_bench_model"), help="where the model shards go"
    )
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--size-gb", type=float, default=16.1, help="model size; 16.1 = Llama-3-8B bf16")
    p.add_argument("--reps", type=int, default=3, help="repetitions of the Thaw load")
    p.add_argument("--baseline-reps", type=int, default=2)
    p.add_argument("--chunk-mib", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--ceiling-gib", type=float, default=4.0)
    p.add_argument("--graph-layers", type=int, default=32)
    p.add_argument("--kv-len", type=int, default=256)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--step-iters", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=330.0, help="skip optional sections past this")
    p.add_argument("--no-cold", action="store_true", help="skip the cold page-cache runs")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    report = Report(args.out, args.budget_s)
    report.data["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    cfg = config_for_size(args.size_gb)
    report.data["model_config"] = asdict(cfg) | {"gb": round(cfg.nbytes() / GB, 3)}
    log(f"device={device} model={report.data['model_config']} out={args.out}")
    S = report.data["sections"]
    streamer: types.ModuleType | None = None
    paths: list[Path] = []

    with report.section("environment") as e:
        assert e is not None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA requested but torch.cuda.is_available() is False")
        e.update(environment(device, args.dir))
        log(json.dumps(e))

    with report.section("import_streamer") as e:
        assert e is not None
        streamer = import_streamer()
        e["module"] = streamer.__file__

    with report.section("generate_model") as e:
        assert e is not None
        paths = _generated(cfg, args, device, e)

    if device.type == "cuda":
        with report.section("copy_ceiling", min_remaining_s=30) as e:
            if e is not None:
                copy_ceilings(device, e, int(args.ceiling_gib * GiB), reps=5)
                log(
                    f"pinned H2D best {e['pinned_h2d_best_gbps']} GB/s, pageable {e['pageable_h2d_best_gbps']} GB/s"
                )
                free_device(device)

    chunk = args.chunk_mib * MiB
    with report.section("thaw_load") as e:
        assert e is not None
        if streamer is None or not paths:
            raise RuntimeError("needs the streamer and the model files")
        _thaw_load_section(streamer, paths, device, chunk, args, e)

    with report.section("thaw_sweep", min_remaining_s=150) as e:
        if e is not None and streamer is not None and paths:
            _thaw_sweep_section(report, streamer, paths, device, chunk, args, e)

    with report.section("safetensors_baselines", min_remaining_s=60) as e:
        if e is not None and paths:
            _baselines_section(paths, device, args, e)

    with report.section("correctness") as e:
        assert e is not None
        if streamer is None or not paths:
            raise RuntimeError("needs the streamer and the model files")
        _correctness_section(streamer, paths, device, chunk, args, e)

    with report.section("cuda_graphs", min_remaining_s=60) as e:
        if e is not None:
            graph_section(cfg, args, device, e)
            free_device(device)  # the decoder and its graphs died with graph_section's frame
            log(
                f"capture {e.get('capture_total_s')}s eager {e.get('eager_step_ms')} replay {e.get('replay_step_ms')}"
            )

    with report.section("cuda_checkpoint", min_remaining_s=60) as e:
        if e is not None:
            checkpoint_section(args, device, e)
            log(f"checkpoint: {e.get('steps')} replay equal={e.get('replay_after_restore_equal')}")

    if not args.no_cold:
        with report.section("cold_page_cache", min_remaining_s=90) as e:
            if e is not None and streamer is not None and paths:
                _cold_section(report, streamer, paths, device, chunk, args, e)

    report.data["ratios"] = ratios(S)
    report.write()
    log(f"ratios: {json.dumps(report.data['ratios'])}")
    log(f"wrote {args.out}")
    return 0


def _generated(cfg: ModelConfig, args: argparse.Namespace, device: torch.device, e: dict[str, Any]) -> list[Path]:
    """The model's shards, written now (so warm runs read them from the page cache)."""
    paths = generate_model(cfg, args.dir, device, e)
    e["files"] = [str(p) for p in paths]
    e["bytes"] = sum(p.stat().st_size for p in paths)
    e["source_note"] = (
        "files were just written: warm runs read them from the page cache, not the disk"
    )
    log(f"{len(paths)} shards, {e['bytes'] / GB:.2f} GB")
    return paths


def _thaw_load_section(streamer: types.ModuleType, paths: list[Path], device: torch.device, chunk: int,
                       args: argparse.Namespace, e: dict[str, Any]) -> None:
    """Thaw's load from the page cache, ``args.reps`` times."""
    runs = [thaw_load(streamer, paths, device, chunk, args.concurrency) for _ in range(args.reps)]
    e.update(
        source="page cache",
        chunk_mib=args.chunk_mib,
        concurrency=args.concurrency,
        bytes=runs[0][2],
        seconds=[round(r[0], 3) for r in runs],
        gbps=[round(r[1], 2) for r in runs],
        median_gbps=round(med([r[1] for r in runs]), 2),
        median_s=round(med([r[0] for r in runs]), 3),
    )
    log(f"thaw {e['gbps']} GB/s")


def _thaw_sweep_section(report: Report, streamer: types.ModuleType, paths: list[Path], device: torch.device,
                        chunk: int, args: argparse.Namespace, e: dict[str, Any]) -> None:
    """Thaw's load at other chunk sizes and concurrencies, and into host memory only."""
    results = []
    for chunk_mib, conc in [(8, 16), (16, 16), (64, 16), (32, 8), (32, 32)]:
        if report.remaining() < 130:
            break
        dt, gbps, _ = thaw_load(streamer, paths, device, chunk_mib * MiB, conc)
        results.append(
            {
                "chunk_mib": chunk_mib,
                "concurrency": conc,
                "seconds": round(dt, 3),
                "gbps": round(gbps, 2),
            }
        )
        log(f"  chunk={chunk_mib}MiB conc={conc}: {gbps:.2f} GB/s")
    e["runs"] = results
    if device.type == "cuda":
        dt, gbps, _ = thaw_load(
            streamer, paths, torch.device("cpu"), chunk, args.concurrency
        )
        e["host_only"] = {
            "seconds": round(dt, 3),
            "gbps": round(gbps, 2),
            "note": "read into host RAM, no H2D",
        }
        log(f"  host-only read: {gbps:.2f} GB/s")


def _baselines_section(paths: list[Path], device: torch.device, args: argparse.Namespace, e: dict[str, Any]) -> None:
    """safetensors' own loads of the same files: the baselines Thaw is compared with."""
    if device.type == "cuda":
        base_runs = [st_load_then_to(paths, device) for _ in range(args.baseline_reps)]
        e["load_file_then_to_cuda"] = {
            "seconds": [round(r[0], 3) for r in base_runs],
            "median_gbps": round(med([r[1] / r[0] / GB for r in base_runs]), 2),
        }
        log(f"load_file + .to(cuda): {e['load_file_then_to_cuda']}")
    dev_runs = [st_load_device(paths, device) for _ in range(args.baseline_reps)]
    key = "load_file_device_cuda" if device.type == "cuda" else "load_file_cpu"
    e[key] = {
        "seconds": [round(r[0], 3) for r in dev_runs],
        "median_gbps": round(med([r[1] / r[0] / GB for r in dev_runs]), 2),
    }
    if device.type == "cpu":
        e[key]["note"] = "CPU load_file is an mmap: bytes are not read until touched"
    log(f"{key}: {e[key]}")


def _correctness_section(streamer: types.ModuleType, paths: list[Path], device: torch.device, chunk: int,
                         args: argparse.Namespace, e: dict[str, Any]) -> None:
    """Thaw's tensors equal safetensors' for one shard, whole and as tensor-parallel slices."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    def has_layer(p: Path) -> bool:
        with safe_open(str(p), framework="pt") as f:
            return any(k.endswith("q_proj.weight") for k in f.keys())

    # The first shard holding a decoder layer, so the TP check below has its tensors.
    shard = next((p for p in paths if has_layer(p)), paths[0])
    mine = streamer.load(
        shard, device=device, chunk_bytes=chunk, concurrency=args.concurrency
    ).tensors
    ref = load_file(str(shard), device=str(device))
    bad = [k for k in ref if k not in mine or not torch.equal(mine[k], ref[k])]
    e["file"] = str(shard)
    e["tensors"] = len(ref)
    e["names_match"] = sorted(mine) == sorted(ref)
    e["mismatched"] = bad[:20]
    e["equal"] = e["names_match"] and not bad
    # Tensor-parallel slices: rank 1 of 2 along rows and along columns.
    q = next(k for k in ref if k.endswith("q_proj.weight"))
    o = next(k for k in ref if k.endswith("o_proj.weight"))
    tp = streamer.load(
        shard, device=device, tp_rank=1, tp_size=2, shard_dims={q: 0, o: 1}.get
    ).tensors
    e["tp_equal"] = bool(
        torch.equal(tp[q], ref[q].chunk(2, 0)[1]) and torch.equal(tp[o], ref[o].chunk(2, 1)[1])
    )
    log(f"equal={e['equal']} tp_equal={e['tp_equal']} ({len(ref)} tensors)")
    del mine, ref, tp
    free_device(device)


def _cold_section(report: Report, streamer: types.ModuleType, paths: list[Path], device: torch.device, chunk: int,
                  args: argparse.Namespace, e: dict[str, Any]) -> None:
    """Thaw and safetensors with the page cache evicted: the disk's rate."""
    # One shard: enough to see the disk's rate, and a slow disk cannot eat the run.
    cold_paths = paths[:1]
    e["files"] = [str(p) for p in cold_paths]
    e["evict_thaw"] = evict_page_cache(cold_paths)
    dt, gbps, _ = thaw_load(streamer, cold_paths, device, chunk, args.concurrency)
    e["thaw"] = {"seconds": round(dt, 3), "gbps": round(gbps, 2)}
    log(f"cold thaw: {gbps:.2f} GB/s ({e['evict_thaw']})")
    if report.remaining() > 60:
        e["evict_safetensors"] = evict_page_cache(cold_paths)
        fn = st_load_then_to if device.type == "cuda" else st_load_device
        dt2, nb = fn(cold_paths, device)
        e["safetensors"] = {
            "seconds": round(dt2, 3),
            "gbps": round(nb / dt2 / GB, 2),
            "method": fn.__name__,
        }
        log(f"cold safetensors: {nb / dt2 / GB:.2f} GB/s")


def ratios(S: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def put(name: str, fn: Callable[[], float]) -> None:
        with contextlib.suppress(Exception):
            v = fn()
            if math.isfinite(v):
                out[name] = round(v, 3)

    thaw = S.get("thaw_load", {})
    ceil = S.get("copy_ceiling", {})
    base = S.get("safetensors_baselines", {})
    graphs = S.get("cuda_graphs", {})
    ck = S.get("cuda_checkpoint", {})
    cold = S.get("cold_page_cache", {})
    put("thaw_gbps", lambda: thaw["median_gbps"])
    put("thaw_vs_pinned_ceiling", lambda: thaw["median_gbps"] / ceil["pinned_h2d_best_gbps"])
    put("thaw_vs_pageable_ceiling", lambda: thaw["median_gbps"] / ceil["pageable_h2d_best_gbps"])
    put(
        "thaw_vs_safetensors_to_cuda",
        lambda: thaw["median_gbps"] / base["load_file_then_to_cuda"]["median_gbps"],
    )
    put(
        "thaw_vs_safetensors_device_cuda",
        lambda: thaw["median_gbps"] / base["load_file_device_cuda"]["median_gbps"],
    )
    put(
        "thaw_vs_safetensors_cpu",
        lambda: thaw["median_gbps"] / base["load_file_cpu"]["median_gbps"],
    )
    put("graph_replay_speedup_b1", lambda: graphs["eager_over_replay"][1])
    put("graph_capture_s", lambda: graphs["capture_total_s"])
    put("graph_restore_vs_capture", lambda: ck["steps"]["restore_s"] / ck["child_capture_s"])
    put(
        "graph_checkpoint_plus_restore_vs_capture",
        lambda: ck["checkpoint_plus_restore_s"] / ck["child_capture_s"],
    )
    put(
        "restore_vs_thaw_load_plus_capture",
        lambda: ck["steps"]["restore_s"] / (thaw["median_s"] + ck["child_capture_s"]),
    )
    put("cold_thaw_vs_cold_safetensors", lambda: cold["thaw"]["gbps"] / cold["safetensors"]["gbps"])
    with contextlib.suppress(Exception):
        out["correctness_equal"] = bool(S["correctness"]["equal"])
    with contextlib.suppress(Exception):
        out["checkpoint_replay_equal"] = bool(ck["replay_after_restore_equal"])
    return out


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A driver call stuck in a daemon thread must not keep the process alive.
    os._exit(rc)
