"""``python -m loadtests.swap_read_parts``: every step reads the whole model from a real
store, and the report names each step with its samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.swap_read_parts import STEPS, main

pytestmark = pytest.mark.integration


def test_every_step_reads_the_model_and_is_reported(tmp_path: Path) -> None:
    pytest.importorskip("vllm")  # the reader is vLLM's loader's
    out = tmp_path / "parts.json"
    assert main(["--size", "tiny", "--reps", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["bytes"] > 0 and report["crc32"] in ("isal", "zlib")
    assert list(report["steps"]) == [name for name, _ in STEPS]
    for step in report["steps"].values():
        assert len(step["samples_s"]) == 1 and step["median_s"] > 0 and step["gbps"] > 0
