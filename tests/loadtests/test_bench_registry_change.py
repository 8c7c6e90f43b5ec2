"""The registry's change benchmark runs, and its configs are the registry's to serve."""

from __future__ import annotations

import json

import pytest

from loadtests.bench_registry_change import base_config, entries, main
from warm_pool.registry.in_force import with_models


def test_it_reports_each_change_at_each_size_and_the_line_through_them(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--sizes", "10", "20", "--repeat", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["models"] for r in rows[:2]] == [10, 20]
    assert set(rows[0]) == {"models", "full_s", "change_s", "update_base_s", "remove_s"}
    assert {r["series"] for r in rows[2:]} == {"full_s", "change_s", "update_base_s", "remove_s"}


def test_its_models_are_valid_with_adapters_and_a_private_tenant() -> None:
    cfg = with_models(base_config(), entries(50))
    assert len(cfg.models) == 50 and sum(m.is_adapter for m in cfg.models) == 10
    assert any(m.tenant == "acme" for m in cfg.models)
