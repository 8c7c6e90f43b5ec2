"""What a simulation answers: each model's counters as the run goes, and the summary,
cold starts and decisions it hands back (``simulator.sim``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simulator.samples import Samples, percentiles
from thaw.wire import TIERS as WIRE_TIERS
from warm_pool.policy.decisions import Decision
from warm_pool.policy.keepalive import IdleHistogram

if TYPE_CHECKING:
    from simulator.traffic import SimModel

# Where a cold start's replica got its model (thaw.wire's tiers but "hot"), in the
# wire's order, about the fastest start first.
TIERS = tuple(t for t in WIRE_TIERS if t != "hot")

SUMMARY_KEYS = ("requests", "cold_starts", "cold_start_share", "cold_starts_by_tier", "replica_seconds",
                "standby_seconds", "asleep_seconds", "instance_seconds", "usd", "ttft_s", "slo_met_share",
                "activation_timeouts", "capacity_refusals", "evictions", "per_model")


@dataclass
class ModelStats:
    requests: int = 0
    cold_starts: int = 0
    cold_waiters: int = 0
    # Every request's time to first token (in bounded memory: simulator.samples).
    ttfts: Samples = field(default_factory=Samples)
    slo_met: int = 0
    activation_timeouts: int = 0
    queue_full: int = 0
    # Requests answered 503 at once: no instance could come (its pool full, nothing idle).
    capacity_refusals: int = 0
    # Times an idle replica of it was given up for a model waiting in its full pool.
    evictions: int = 0
    replica_s: float = 0.0
    asleep_s: float = 0.0
    usd: float = 0.0
    adapter_s: float = 0.0  # an adapter: seconds held in engines (loading, ready, unloading)
    cold_start_s: list[float] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ColdStart:
    model: str
    at: float
    ready_after_s: float
    tier: str  # asleep | adapter | swap | host | disk | s3 | packed | launch


@dataclass
class SimResult:
    summary: dict[str, Any]
    decisions: list[tuple[float, Decision]]
    cold_starts: list[ColdStart]
    ticks: int
    judged: int  # models judged by decide(), summed over ticks
    end_s: float
    # Each model's keep-alive histogram at the end (what a controller would keep).
    histograms: dict[str, IdleHistogram] = field(default_factory=dict)
    last_arrival_s: float = 0.0  # the trace's duration (of a stream: known once read)


def tier_order(tier: str) -> tuple[int, str]:
    """Sort key: the tiers in the order of :data:`TIERS` (unknown ones last)."""
    return (TIERS.index(tier) if tier in TIERS else len(TIERS), tier)


def summary(models: Iterable[SimModel], standby_s: Mapping[str, float], standby_usd: Mapping[str, float],
            instance_s: float) -> dict[str, Any]:
    """The run's summary (keys :data:`SUMMARY_KEYS`): the totals, then a row per model
    that had requests or time; the standbys' time and cost are the fleet's."""
    per_model: dict[str, Any] = {}
    tot = ModelStats()
    tiers: dict[str, int] = {}
    for m in models:
        st = m.stats
        if not st.requests and not st.replica_s and not st.asleep_s and not st.adapter_s:
            continue
        per_model[m.name] = _row(st) | {
            "queue_full": st.queue_full,
            "capacity_refusals": st.capacity_refusals,
            "evictions": st.evictions,
            "cold_start_s": percentiles(st.cold_start_s),
            "cold_starts_by_tier": dict(sorted(st.tiers.items())),
        }
        if m.base is not None:
            # No engine of its own: its base's engines served it (and their time and
            # cost are the base's); how long it was held in them.
            per_model[m.name] |= {"base": m.base.name, "adapter_seconds": round(st.adapter_s, 3)}
        tot.ttfts.extend(st.ttfts)
        for tier, n in st.tiers.items():
            tiers[tier] = tiers.get(tier, 0) + n
        for k in ("requests", "cold_starts", "cold_waiters", "slo_met", "activation_timeouts",
                  "queue_full", "capacity_refusals", "evictions", "replica_s", "asleep_s", "usd"):
            setattr(tot, k, getattr(tot, k) + getattr(st, k))
    row = _row(tot)
    out = {k: row[k] for k in ("requests", "cold_starts", "cold_start_share")}
    out["cold_starts_by_tier"] = dict(sorted(tiers.items()))
    out["replica_seconds"] = row["replica_seconds"]
    out["standby_seconds"] = round(sum(standby_s.values()), 3)
    out["asleep_seconds"] = row["asleep_seconds"]
    out["instance_seconds"] = round(instance_s, 3)
    out["usd"] = round(tot.usd + sum(standby_usd.values()), 6)
    for k in ("ttft_s", "slo_met_share", "activation_timeouts"):
        out[k] = row[k]
    out["capacity_refusals"] = tot.capacity_refusals
    out["evictions"] = tot.evictions
    out["per_model"] = per_model
    return out


def _row(st: ModelStats) -> dict[str, Any]:
    n = st.requests
    return {
        "requests": n,
        "cold_starts": st.cold_starts,
        "cold_start_share": st.cold_waiters / n if n else 0.0,
        "replica_seconds": round(st.replica_s, 3),
        "asleep_seconds": round(st.asleep_s, 3),
        "usd": round(st.usd, 6),
        "ttft_s": st.ttfts.percentiles(),
        "slo_met_share": st.slo_met / n if n else 0.0,
        "activation_timeouts": st.activation_timeouts,
    }
