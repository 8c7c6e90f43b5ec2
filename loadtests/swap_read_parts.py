"""What a swap from the store pays per byte, part by part: the swap's reader
(``FileByFileWeights``) over one demo model, with no engine, each check and cache tier
added in turn.

    python -m loadtests.swap_read_parts --size 1GiB --reps 3 --out parts.json

Starts its own SeaweedFS, builds and pushes a demo model of ``--size``, then in each rep
reads it with: nothing but the GETs into fresh memory; the tensors' CRC-32 checks; the
files' sha256; both; both and the host-memory tier filled; both and the host and disk
tiers filled (what a swap from the store does on a worker with both tiers). Prints and
writes each step's median seconds and GB/s; the difference between two steps is what
the part added costs. The store's own ceiling is ``thaw bench stream``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("gets_only", {"verify_sha256": False, "verify_tensors": False}),
    ("crc32", {"verify_sha256": False, "verify_tensors": True}),
    ("sha256", {"verify_sha256": True, "verify_tensors": False}),
    ("sha256_crc32", {"verify_sha256": True, "verify_tensors": True}),
    ("sha256_crc32_host", {"verify_sha256": True, "verify_tensors": True, "host": True}),
    ("sha256_crc32_host_disk", {"verify_sha256": True, "verify_tensors": True, "host": True, "disk": True}),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.swap_read_parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1GiB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("swap_read_parts.json"))
    args = p.parse_args(argv)

    from loadtests.environ import environment
    from thaw.embedded_store import EmbeddedStore, free_port
    from weight_streaming.tensor_check import CRC32_IMPL

    work = Path(tempfile.mkdtemp(prefix="thaw-swap-read-parts-", dir="/var/tmp"))
    store = EmbeddedStore(work / "store", s3_port=free_port(), bucket="bench")
    endpoint = store.start(timeout_s=90)
    try:
        # The reader finds the store in the environment, as an engine does; set for this
        # run only (a caller's own store, a test's, stays as it was).
        with environment({**endpoint.env(), "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}):
            nbytes, samples = _measure(args, work, endpoint)
    finally:
        store.stop()
        shutil.rmtree(work, ignore_errors=True)
    steps = {name: {"median_s": round(statistics.median(s), 4), "gbps": round(nbytes / statistics.median(s) / 1e9, 3),
                    "samples_s": [round(x, 4) for x in s]} for name, s in samples.items()}
    report = {"benchmark": "swap_read_parts", "size": args.size, "bytes": nbytes, "reps": args.reps,
              "crc32": CRC32_IMPL, "cpu_count": os.cpu_count(), "steps": steps}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, st in steps.items():
        print(f"{name:24s} {st['median_s']:6.2f} s  {st['gbps']:5.2f} GB/s")
    print(f"wrote {args.out}")
    return 0


def _measure(args: argparse.Namespace, work: Path, endpoint: Any) -> tuple[int, dict[str, list[float]]]:
    """A demo model of ``--size`` pushed, then every step ``--reps`` times: the model's
    bytes and each step's seconds."""
    from thaw.demo_model import build_demo_model
    from weight_streaming.push import push_model
    from weight_streaming.vllm_loader import FileByFileWeights, StreamOptions

    build_demo_model(work / "model", size=args.size)
    uri = "s3://bench/swap-read-parts"
    push_model(endpoint.client(), work / "model", uri)
    nbytes = sum(f.stat().st_size for f in (work / "model").glob("*.safetensors"))
    samples: dict[str, list[float]] = {name: [] for name, _ in STEPS}
    for rep in range(args.reps):
        for name, kw in STEPS:
            host = Path(tempfile.mkdtemp(prefix="thaw-swap-read-parts-", dir="/dev/shm"))
            disk = work / "disk"
            options = StreamOptions(
                verify_sha256=kw["verify_sha256"], verify_tensors=kw["verify_tensors"],
                host_cache_dir=str(host) if kw.get("host") else None, host_cache_max_bytes=2 * nbytes,
                cache_dir=str(disk) if kw.get("disk") else None, cache_max_bytes=2 * nbytes)
            try:
                t0 = time.perf_counter()
                for _ in FileByFileWeights(uri, options):
                    pass
                samples[name].append(time.perf_counter() - t0)
            finally:
                shutil.rmtree(host, ignore_errors=True)
                shutil.rmtree(disk, ignore_errors=True)
            print(f"rep {rep + 1}/{args.reps} {name:24s} {samples[name][-1]:6.2f} s", flush=True)
    return nbytes, samples


if __name__ == "__main__":
    raise SystemExit(main())
