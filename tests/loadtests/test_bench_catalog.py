"""The catalog benchmark runs and its delta is the one deployed model's."""

from __future__ import annotations

import json

import pytest

from loadtests.bench_catalog import main


def test_it_reports_the_whole_catalog_and_the_delta_at_each_size(capsys: pytest.CaptureFixture[str]) -> None:
    rows = main(["--sizes", "10", "20", "--repeat", "1"])
    assert [r["models"] for r in rows] == [10, 20]
    assert [json.loads(line)["models"] for line in capsys.readouterr().out.splitlines()] == [10, 20]
    # The delta carries one model whatever the size; the whole catalog grows with it.
    assert rows[0]["delta_bytes"] == rows[1]["delta_bytes"] < rows[0]["whole_bytes"] < rows[1]["whole_bytes"]
