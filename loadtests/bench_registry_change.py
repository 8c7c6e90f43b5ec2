"""What checking one model change costs the registry as the number of models grows:
the config in force with one model deployed, validated as the registry validates it.

    python -m loadtests.bench_registry_change [--sizes 100 1000 10000] [--repeat 5]

At each size it builds a config of that many models (three shapes, pools that prebuild,
a fifth of the models adapters of the others, tenants whose ``allowed_models`` name some
of them) and times, median of ``--repeat``:

- ``full``: :func:`warm_pool.registry.in_force.with_models` over every model with the new
  one first (what a deploy cost before changes were checked one at a time);
- ``change``: :func:`warm_pool.registry.in_force.with_change`, one entry against the
  config in force (what a deploy costs now); ``update_base``: a base model with an
  adapter changed; ``remove``: an adapter removed.

It prints one JSON line per size and, for each series, the fixed part and the slope
(seconds per model) of the line through its smallest and largest size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import yaml

from thaw.config import DEFAULT_CONFIG_PATH, ThawConfig, parse_config
from warm_pool.registry.in_force import with_change, with_models


def entries(n: int) -> list[dict[str, Any]]:
    """``n`` config entries: bases over three shapes, every fifth an adapter of a base."""
    shapes = ("cpu-local", "gpu-1", "gpu-2")
    out: list[dict[str, Any]] = []
    for i in range(n):
        if i % 5 == 4:
            out.append({"name": f"m{i}", "base": f"m{i - 1}", "adapter_uri": f"s3://thaw/models/a{i}",
                        "served_name": f"m{i}-chat"})
        else:
            out.append({"name": f"m{i}", "uri": f"s3://thaw/models/m{i}", "shape": shapes[i % 3],
                        "engine": {"dtype": "bfloat16"}, "autoscaling": {"max_replicas": 2},
                        "tenant": "acme" if i % 7 == 0 else None})
    return [{k: v for k, v in e.items() if v is not None} for e in out]


def base_config() -> ThawConfig:
    data = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    data["data_dir"] = "/tmp/unused"
    data["models"] = entries(10)  # what the file says (the registry replaces them)
    data["shapes"] += [
        {"name": "gpu-1", "gpu_type": "h100-80gb", "gpu_count": 1, "gpu_memory_gib": 80, "host_memory_gib": 200,
         "price_per_hour_usd": 4},
        {"name": "gpu-2", "gpu_type": "h100-80gb", "gpu_count": 2, "gpu_memory_gib": 80, "host_memory_gib": 400,
         "price_per_hour_usd": 8}]
    data["pools"] += [{"shape": "gpu-1", "prebuild": ["m1"]}, {"shape": "gpu-2"}]
    data["tenants"].append({"name": "acme", "allowed_models": ["m0", "m1", "m4"]})
    return parse_config(data)


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``seconds = fixed + slope * models`` through the smallest and the largest size (a
    least-squares line is led by the largest alone, and its intercept by noise)."""
    (n0, s0), (n1, s1) = min(points), max(points)
    slope = (s1 - s0) / (n1 - n0)
    return s0 - slope * n0, slope


def measure(base: ThawConfig, n: int, repeat: int) -> dict[str, Any]:
    """The seconds of each change at ``n`` models (the median of ``repeat``)."""
    es = entries(n)
    cfg = with_models(base, es)
    spec_of = {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in es}.__getitem__
    new = {"uri": "s3://thaw/models/fresh", "shape": "gpu-1", "served_name": "fresh-chat"}
    return {
        "models": n,
        "full_s": timed(lambda: with_models(base, [{"name": "fresh", **new}, *es]), repeat),
        "change_s": timed(lambda: with_change(cfg, base, spec_of, "fresh", new), repeat),
        "update_base_s": timed(lambda: with_change(cfg, base, spec_of, "m3", spec_of("m3")), repeat),
        "remove_s": timed(lambda: with_change(cfg, base, spec_of, "m4", None), repeat),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    base = base_config()
    series: dict[str, list[tuple[int, float]]] = {}
    for n in args.sizes:
        row = measure(base, n, args.repeat)
        for k, v in row.items():
            if k != "models":
                series.setdefault(k, []).append((n, v))
        print(json.dumps(row))
    if len(args.sizes) > 1:
        for k, points in series.items():
            fixed, slope = fit(points)
            print(json.dumps({"series": k, "fixed_s": fixed, "slope_s_per_model": slope}))


if __name__ == "__main__":
    main()
