"""One engine host from spawn to serving: what a standby costs and how fast it launches.

    python loadtests/engine_host_start.py MODEL_DIR [--reps 3] [--out FILE.json]

Per rep: spawn ``python -m worker.engine_host`` (from the current directory, so run it
in the checkout to measure), time its ``imported`` event, sum the CPU seconds of its
process tree once it stands by (the engine host, its forkserver, the resource
tracker), then launch MODEL_DIR (a local safetensors model, e.g. ``thaw demo-model
DIR``) in eager mode and time launch to ``/health``. Run it in two checkouts,
interleaved, to compare them (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.procs import tree_cpu_s
from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from worker.launch import EV_IMPORTED, LaunchCommand, decode_event, engine_env

# Time for the forkserver's one-off preparation to finish before the CPU is read.
SETTLE_S = 3.0


def one_rep(model_dir: str, work: str) -> dict[str, float]:
    env = {**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_NO_USAGE_STATS": "1",
           "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "worker.engine_host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        while True:
            raw = proc.stdout.readline()
            if not raw:
                raise RuntimeError(f"the engine host exited ({proc.wait()}) before standing by")
            ev = decode_event(raw.decode(errors="replace"))
            if ev is not None and ev["event"] == EV_IMPORTED:
                break
        imported_s = time.monotonic() - t0
        time.sleep(SETTLE_S)
        standby_cpu_s = tree_cpu_s(proc.pid)
        engine = EngineArgs(load_format="safetensors", enforce_eager=True)
        port = free_port()
        cmd = LaunchCommand(uri=model_dir, served_model_name="m", max_model_len=512, engine=engine, port=port,
                            env=engine_env(engine, {}, work))
        t1 = time.monotonic()
        proc.stdin.write(cmd.model_dump_json().encode() + b"\n")
        proc.stdin.flush()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the engine host exited ({proc.returncode}) during the launch")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        return {"imported_s": round(imported_s, 2), "standby_cpu_s": round(standby_cpu_s, 2),
                "launch_to_health_s": round(time.monotonic() - t1, 2)}
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("model_dir")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    reps: list[dict[str, float]] = []
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory() as work:
            reps.append(one_rep(str(Path(args.model_dir).resolve()), work))
        print(json.dumps(reps[-1]), flush=True)
    report: dict[str, Any] = {"cwd": os.getcwd(), "reps": reps,
                              "median": {k: statistics.median(r[k] for r in reps) for k in reps[0]}}
    print(json.dumps(report["median"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
