"""Batch work on standbys the pool holds anyway: a stage of ``warm_pool.policy.decide.decide``.

A model with unanswered lines in running batches (``Snapshot.batch_demand``) and no
replica takes a free standby of its shape, after every online model has taken what it
needs this tick, with an assignment marked ``batch``. Such a worker stays one of its
pool's standbys: it counts toward the standby target (so the pool launches nothing to
replace it) and not as serving, and an online cold start that finds no free standby
takes it back at once (an assignment for the online model preempts the batch engine;
the worker starts it on the engine host it keeps imported beside the batch one).

Batch launches no instance of its own, except within ``batch.max_usd_per_hour``: that
spend buys instances beyond the pool's standby band, one per model waiting for batch
work, gone again when the batches are done. Adapters' lines run where their base
serves; batch places no base for them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from thaw.config import ThawConfig
from warm_pool.policy.states import SERVING

if TYPE_CHECKING:  # warm_pool.policy.decide calls this stage
    from warm_pool.policy.decide import ModelActivity, WorkerView



def lent_to_batch(w: WorkerView, activity: Mapping[str, ModelActivity]) -> bool:
    """A standby lent to batch work: an instance on a batch assignment whose model no
    online request wants now (one that does serves it like any replica, and is kept)."""
    if not w.batch or w.host is not None or w.state not in SERVING or w.model is None:
        return False
    act = activity.get(w.model)
    return act is None or act.demand == 0


def standby_use(workers: Collection[WorkerView], activity: Mapping[str, ModelActivity]) -> dict[str, tuple[int, int]]:
    """Per shape, (standbys idle, standbys lent to batch) now: what batch makes of the
    standby time the pool pays for."""
    out: dict[str, tuple[int, int]] = {}
    for w in workers:
        if w.host is not None:
            continue
        idle, lent = out.get(w.shape, (0, 0))
        if w.state == "standby":
            out[w.shape] = (idle + 1, lent)
        elif lent_to_batch(w, activity):
            out[w.shape] = (idle, lent + 1)
    return out


def to_preempt(workers: Collection[WorkerView], shape: str, activity: Mapping[str, ModelActivity],
               taken: Collection[str]) -> WorkerView | None:
    """The worker lent to batch on ``shape`` that an online cold start takes: one still
    loading first (no batch work lost), else the one that started serving last."""
    lent = [w for w in workers if w.shape == shape and w.id not in taken and lent_to_batch(w, activity)]
    if not lent:
        return None
    return min(lent, key=lambda w: (w.state != "loading", -(w.since or 0.0), w.id))


def wanting_batch(cfg: ThawConfig, workers: Collection[WorkerView], demand: Mapping[str, int],
                  placed: Collection[str], only: Collection[str] | None = None) -> list[str]:
    """Models with batch lines waiting and no replica (nor one placed this tick), in
    config order: each wants one worker."""
    serving = {w.model for w in workers if w.state in SERVING and w.model is not None}
    return [m.name for m in cfg.models
            if m.base is None and demand.get(m.name, 0) > 0 and m.name not in serving and m.name not in placed
            and (only is None or m.name in only)]


def batch_launches(cfg: ThawConfig, waiting: Mapping[str, int]) -> dict[str, int]:
    """Per shape, the instances beyond the standby band that ``batch.max_usd_per_hour``
    buys for the models waiting for batch work there (``waiting``: shape -> models),
    pools in config order."""
    left = cfg.batch.max_usd_per_hour
    prices = {s.name: s.price_per_hour_usd for s in cfg.shapes}
    out: dict[str, int] = {}
    for pool in cfg.pools:
        want = waiting.get(pool.shape, 0)
        price = prices.get(pool.shape, 0.0)
        if want <= 0 or left <= 0:
            continue
        n = want if price <= 0 else min(want, math.floor(left / price + 1e-9))
        if n > 0:
            out[pool.shape] = n
            left -= n * price
    return out
