"""What the simulator's tests share: a small config, a cost model, a trace from rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.costs import CostModel, ModelCosts
from simulator.traces import Trace, from_columns
from thaw.config import ThawConfig


def config(models: int = 1, *, idle_grace_s: float = 100, standby_min: int = 1, standby_max: int = 1,
           max_instances: int = 4, boot_s: float = 60, price: float = 3.6, budget: float | None = None,
           **autoscaling: Any) -> ThawConfig:
    return ThawConfig.model_validate({
        "shapes": [{"name": "gpu", "gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 44.4,
                    "host_memory_gib": 32, "price_per_hour_usd": price, "boot_s": boot_s}],
        "pools": [{"shape": "gpu", "standby_min": standby_min, "standby_max": standby_max,
                   "max_instances": max_instances, "budget_usd_per_hour": budget, "standby_hold_s": 60}],
        "models": [{"name": f"m{i}", "uri": f"s3://thaw/m{i}", "shape": "gpu",
                    "autoscaling": {"idle_grace_s": idle_grace_s, "max_replicas": 1, **autoscaling}}
                   for i in range(models)],
    })


def with_adapters(cfg: ThawConfig, adapters: dict[str, str], *, max_loras: int | None = None,
                  **autoscaling: Any) -> ThawConfig:
    """``cfg`` with the models named in ``adapters`` made LoRA adapters of the base each
    maps to (their shape, context and engine the base's; ``autoscaling`` their own, over
    what they had, less the asleep tier an adapter cannot have); ``max_loras`` on the
    bases."""
    data = cfg.model_dump()
    for m in data["models"]:
        base = adapters.get(m["name"])
        if base is not None:
            for key in ("shape", "max_context_tokens", "engine", "uri", "lora"):
                m.pop(key)
            m["base"], m["adapter_uri"] = base, f"s3://thaw/adapters/{m['name']}"
            m["autoscaling"] |= {"asleep_ttl_s": 0, **autoscaling}
        elif max_loras is not None and m["name"] in adapters.values():
            m["lora"] = {"max_loras": max_loras}
    return ThawConfig.model_validate(data)


def costs(cfg: ThawConfig, *, load_s: float = 10.0, prefill: float = 1000.0, tpot_s: float = 0.01,
          release_s: float = 0.0) -> CostModel:
    return CostModel({m.name: ModelCosts(weights_gib=1.0, standby_load_s=load_s, asleep_load_s=1.0,
                                         release_s=release_s, prefill_tokens_per_s=prefill, tpot_s=tpot_s,
                                         source="test") for m in cfg.models})


def trace(rows: list[tuple[float, str, int, int]]) -> Trace:
    rows = sorted(rows)
    names = sorted({r[1] for r in rows})
    return from_columns([r[0] for r in rows], [names.index(r[1]) for r in rows], [0] * len(rows),
                        [r[2] for r in rows], [r[3] for r in rows], names, ["t"], "test")


def equivalence_cfg(variant: int) -> ThawConfig:
    """Configs the fast and exact modes are compared on: 0 plain, 1 the asleep tier, 2
    histogram keep-alive, 3 min_replicas and an upscale delay, 4 pre-built engines, 5
    those and the asleep tier, 6 packed engines, 7 those with the asleep tier and a
    disk cache, 8 m1 and m2 LoRA adapters of m0 (one adapter per engine: they wait for
    each other's slot), 9 those in packed engines with the asleep tier on the bases and
    two adapters per engine, 10 scheduled pre-warm windows (m0 every 2 minutes for 45 s,
    m1 two replicas at minutes 1, 4, 7 for 100 s) with the histogram keep-alive, 11 the
    histogram keep-alive by the time of day, in slots of about 2 minutes, 12 a full pool
    (two instances for four models: idle replicas evicted for waiting models, the rest
    refused at capacity)."""
    if variant == 12:
        data = equivalence_cfg(0).model_dump()
        data["pools"][0] |= {"standby_min": 1, "standby_max": 1, "max_instances": 2}
        return ThawConfig.model_validate(data)
    if variant == 11:
        data = equivalence_cfg(2).model_dump()
        for m in data["models"]:
            m["autoscaling"]["keep_alive_histogram"] |= {"periodic": "day", "period_slots": 672}
        return ThawConfig.model_validate(data)
    if variant == 10:
        data = equivalence_cfg(2).model_dump()
        data["models"][0]["prewarm"] = [{"cron": "*/2 * * * *", "for_s": 45}]
        data["models"][1]["prewarm"] = [{"cron": "1-59/3 * * * *", "replicas": 2, "for_s": 100}]
        return ThawConfig.model_validate(data)
    if variant == 8:
        return with_adapters(equivalence_cfg(0), {"m1": "m0", "m2": "m0"}, max_loras=1, idle_grace_s=15)
    if variant == 9:
        return with_adapters(equivalence_cfg(7), {"m1": "m0", "m2": "m0"}, max_loras=2, idle_grace_s=15)
    base: dict[str, Any] = {"idle_grace_s": 40, "max_replicas": 3, "target_concurrency": 2,
                            "max_concurrency_per_replica": 4, "downscale_delay_s": 5, "stable_window_s": 20,
                            "panic_window_s": 4}
    if variant == 1:
        base |= {"asleep_ttl_s": 60}
    elif variant == 2:
        base |= {"keep_alive": "histogram",
                 "keep_alive_histogram": {"bin_s": 5, "range_s": 300, "prior_samples": 3, "prewarm_lead_s": 5}}
    elif variant == 3:
        base |= {"min_replicas": 1, "upscale_delay_s": 3}
    elif variant in (5, 7):
        base |= {"asleep_ttl_s": 60}
    cfg = config(4, standby_min=1, standby_max=3, max_instances=6, boot_s=25, budget=8.0, **base)
    if variant < 4:
        return cfg
    if variant >= 6:
        # Several engines per worker: on 44.4 GiB, m0-m2 take 0.3 of it each (13.3 GiB:
        # three fit), m3 0.5 (22.2 GiB: beside one of the others only); with the asleep
        # tier and a disk cache too (a packed engine reads the worker's disk copy).
        data = cfg.model_dump()
        data["pools"][0]["pack"] = True
        for i, m in enumerate(data["models"]):
            m["engine"]["gpu_memory_utilization"] = 0.5 if i == 3 else 0.3
        if variant == 7:
            data["shapes"][0]["cache"] = {"dir": "c", "max_gib": 2}
        return ThawConfig.model_validate(data)
    # Pre-built engines: m0 and m1 of one class, m2 and m3 (a longer context) of another;
    # the pool pre-builds both classes, its workers keep weights in memory.
    data = cfg.model_dump()
    for m in data["models"][2:]:
        m["max_context_tokens"] = 4096
    data["pools"][0]["prebuild"] = ["m0", "m2"]
    data["shapes"][0]["host_cache_gib"] = 2.0
    return ThawConfig.model_validate(data)


def cli_args(tmp_path: Path, cfg: ThawConfig, rows: list[tuple[float, str, int, int]], *,
             prefill: float, tpot_s: float) -> list[str]:
    """`thaw simulate` arguments for ``cfg`` and a trace of ``rows`` (time, model, input
    and output tokens; one tenant), written under ``tmp_path`` with a costs file of
    every model's serving figures (10 s loads)."""
    cfg_file = tmp_path / "thaw.yaml"
    cfg_file.write_text(cfg.model_dump_json(exclude={"data_dir"}))
    costs_file = tmp_path / "costs.json"
    costs_file.write_text(json.dumps({"defaults": {
        "weights_gib": 1, "standby_load_s": 10, "asleep_load_s": 1, "release_s": 0,
        "prefill_tokens_per_s": prefill, "tpot_s": tpot_s}}))
    tr_file = tmp_path / "trace.csv"
    tr_file.write_text("timestamp,model,tenant,input_tokens,output_tokens\n"
                       + "".join(f"{t},{m},t,{i},{o}\n" for t, m, i, o in rows))
    return ["simulate", "--trace", str(tr_file), "--config", str(cfg_file), "--costs", str(costs_file)]
