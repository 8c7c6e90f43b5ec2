"""What tenants owe: usage records priced with the model revision that answered each
(``models[].pricing``; a price change is a revision like any other, so a bill names the
prices that applied), a batch's lines (``service_tier`` batch) at ``batch.price_factor``
of those prices. Pure: the caller gives the records, the replicas' intervals and the
prices of each revision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from activator.ledger import attribute_gpu_seconds
from thaw.config import Pricing

MTOK = 1_000_000
# Prices of a model at a revision (None: not priced, or not known).
PriceOf = Callable[[str | None, int | None], Pricing | None]


def is_batch(record: dict[str, Any]) -> bool:
    return record.get("service_tier") == "batch"


def token_cost(record: dict[str, Any], price: Pricing, batch_factor: float = 1.0) -> float:
    """USD for one record's tokens (its cached prompt tokens at the cached price; a
    batch line's at ``batch_factor`` of the prices)."""
    cached = record.get("cached_tokens") or 0
    fresh = max(record["prompt_tokens"] - cached, 0)
    cached_price = price.prompt_usd_per_mtok if price.cached_usd_per_mtok is None else price.cached_usd_per_mtok
    usd = (fresh * price.prompt_usd_per_mtok + cached * cached_price
           + record["completion_tokens"] * price.completion_usd_per_mtok) / MTOK
    return usd * batch_factor if is_batch(record) else usd


def costs(records: Iterable[dict[str, Any]], intervals: Iterable[dict[str, Any]], price_of: PriceOf,
          now: float, batch_factor: float = 1.0) -> dict[tuple[str, str | None], dict[str, float]]:
    """Per (tenant, model): USD for tokens, USD for GPU-seconds, their sum, the part of it
    for batch lines (``batch_usd``), and the requests no price was known for
    (``unpriced``)."""
    rs = list(records)
    out: dict[tuple[str, str | None], dict[str, float]] = {}

    def row(key: tuple[str, str | None]) -> dict[str, float]:
        return out.setdefault(key, {"tokens_usd": 0.0, "gpu_usd": 0.0, "cost_usd": 0.0, "batch_usd": 0.0,
                                    "unpriced": 0})

    # GPU-seconds are priced at the revision that answered the request in each slice
    # (a batch line's at the batch factor); split per (tenant, model, revision, tier).
    gpu = attribute_gpu_seconds(rs, intervals, now,
                                by=lambda r: (r["tenant"], r["model"], r.get("revision"), is_batch(r)))
    for (tenant, model, revision, batch), seconds in gpu.items():
        price = price_of(model, revision)
        if price is not None:
            usd = seconds * price.usd_per_gpu_second * (batch_factor if batch else 1.0)
            entry = row((tenant, model))
            entry["gpu_usd"] += usd
            if batch:
                entry["batch_usd"] += usd
    for r in rs:
        price = price_of(r["model"], r.get("revision"))
        entry = row((r["tenant"], r["model"]))
        if price is None:
            entry["unpriced"] += 1
        else:
            usd = token_cost(r, price, batch_factor)
            entry["tokens_usd"] += usd
            if is_batch(r):
                entry["batch_usd"] += usd
    for entry in out.values():
        entry["cost_usd"] = entry["tokens_usd"] + entry["gpu_usd"]
    return out


def prices_from_registry(models: list[dict[str, Any]]) -> PriceOf:
    """``price_of`` from the controller's model records (``GET /v1/admin/models``): each
    revision's pricing."""
    table: dict[tuple[str, int], Pricing | None] = {}
    for m in models:
        for rev in m["revisions"]:
            p = rev["spec"].get("pricing")
            table[(m["name"], rev["revision"])] = Pricing.model_validate(p) if p else None

    def price_of(model: str | None, revision: int | None) -> Pricing | None:
        if model is None or revision is None:
            return None
        return table.get((model, revision))

    return price_of
