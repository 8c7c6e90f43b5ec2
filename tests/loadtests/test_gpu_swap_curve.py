"""The GPU swap-curve script's own smoke run, on the CPU (its figures mean nothing
here): every path moves the right bytes and the report has a line per path."""

from __future__ import annotations

import json
from pathlib import Path

from loadtests.gpu import swap_curve


def test_the_smoke_run_moves_the_right_bytes_on_every_path(tmp_path: Path) -> None:
    out = tmp_path / "swap_curve.json"
    assert swap_curve.main(["--device", "cpu", "--sizes-gb", "0.02", "0.04", "--reps", "1",
                            "--dir", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    sizes = [report["sections"][f"size_{s}gb"] for s in ("0.02", "0.04")]
    for entry in sizes:
        for path in ("swap", "swap_unverified", "staged"):
            assert entry[path]["correct"] is True and entry[path]["seconds"] > 0, (path, entry[path])
        assert entry["swap"]["parts_s"]["verify_s"] > 0 and "verify_s" not in entry["swap_unverified"]["parts_s"]
    assert set(report["curve"]) == {"pinned", "swap", "swap_unverified", "staged"}
    assert report["goals"]["swap_over_pinned_at_16GB"]["met"] is None  # no 16 GB here
    assert not list(tmp_path.glob("thaw-swap-curve-*"))  # the model files are removed
