"""`thaw bench routes`: the figures it writes; a one-replica change is a one-model delta."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadtests import bench_routes


def test_one_replica_ready_is_a_delta_of_one_model_against_a_whole_table(tmp_path: Path) -> None:
    out = tmp_path / "routes.json"
    assert bench_routes.run(argparse.Namespace(out=out, sizes=["100x10"], repeat=1)) == 0
    [size] = json.loads(out.read_text())["sizes"]
    assert (size["models"], size["workers"], size["version_moved"], size["delta_models"]) == (100, 10, True, 1)
    assert size["delta_bytes"] * 10 < size["full_bytes"]
