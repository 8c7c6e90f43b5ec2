"""Bills from usage records: each record priced at the model revision that answered it,
GPU-seconds at that revision's price, unpriced requests counted, not guessed."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from activator.billing import costs, prices_from_registry, token_cost
from tests.activator.support import record
from thaw.config import Pricing

PRICES = [{"name": "demo", "revisions": [
    {"revision": 1, "spec": {"pricing": {"prompt_usd_per_mtok": 1.0, "completion_usd_per_mtok": 4.0}}},
    {"revision": 2, "spec": {"pricing": {"prompt_usd_per_mtok": 2.0, "cached_usd_per_mtok": 0.5,
                                         "completion_usd_per_mtok": 8.0, "usd_per_gpu_second": 0.001}}},
    {"revision": 3, "spec": {}},
]}]


def test_a_record_costs_its_tokens_with_cached_ones_at_their_price() -> None:
    r = asdict(record(1, prompt_tokens=1_000_000, cached_tokens=400_000, completion_tokens=500_000))
    assert token_cost(r, Pricing(prompt_usd_per_mtok=2, completion_usd_per_mtok=8)) == pytest.approx(2 + 4)
    assert token_cost(r, Pricing(prompt_usd_per_mtok=2, cached_usd_per_mtok=0.5, completion_usd_per_mtok=8)) \
        == pytest.approx(0.6 * 2 + 0.4 * 0.5 + 4)


def test_each_request_is_billed_at_the_revision_that_answered_it() -> None:
    price_of = prices_from_registry(PRICES)
    records = [asdict(record(i, "a", prompt_tokens=1_000_000, completion_tokens=0, revision=rev, replica=f"demo-{rev}",
                             started_at=1000.0 + i))
               for i, rev in enumerate((1, 2, 3, None))]
    records.append(asdict(record(9, "b", prompt_tokens=0, completion_tokens=1_000_000, revision=2, replica="demo-2",
                                 started_at=1001.0)))
    # Revision 2's replica ran 60 s on one GPU in the slice where a and b used it equally.
    intervals = [{"replica": "demo-2", "model": "demo", "gpus": 1, "started_at": 960.0, "ended_at": 1020.0}]
    bill = costs(records, intervals, price_of, now=2000.0)
    a, b = bill[("a", "demo")], bill[("b", "demo")]
    assert a["tokens_usd"] == pytest.approx(1.0 + 2.0) and a["unpriced"] == 2
    assert a["gpu_usd"] == pytest.approx(30 * 0.001) and b["gpu_usd"] == pytest.approx(30 * 0.001)
    assert b["cost_usd"] == pytest.approx(8.0 + 0.03) and b["unpriced"] == 0


def test_a_batch_line_costs_the_batch_share_of_the_prices() -> None:
    price_of = prices_from_registry(PRICES)
    online = asdict(record(1, "a", prompt_tokens=1_000_000, completion_tokens=0, revision=2, replica="demo-2",
                           started_at=1000.0))
    batch = {**asdict(record(2, "a", prompt_tokens=1_000_000, completion_tokens=0, revision=2, replica="demo-2",
                             started_at=1000.0)), "service_tier": "batch"}
    assert token_cost(batch, Pricing(prompt_usd_per_mtok=2, completion_usd_per_mtok=8), 0.5) == pytest.approx(1.0)
    assert token_cost(online, Pricing(prompt_usd_per_mtok=2, completion_usd_per_mtok=8), 0.5) == pytest.approx(2.0)
    # The replica's 60 s split evenly between the two requests; the batch's half at half price.
    intervals = [{"replica": "demo-2", "model": "demo", "gpus": 1, "started_at": 960.0, "ended_at": 1020.0}]
    bill = costs([online, batch], intervals, price_of, now=2000.0, batch_factor=0.5)[("a", "demo")]
    assert bill["tokens_usd"] == pytest.approx(2.0 + 1.0)
    assert bill["gpu_usd"] == pytest.approx(30 * 0.001 + 30 * 0.001 * 0.5)
    assert bill["batch_usd"] == pytest.approx(1.0 + 30 * 0.001 * 0.5)
    assert bill["cost_usd"] == pytest.approx(bill["tokens_usd"] + bill["gpu_usd"])
