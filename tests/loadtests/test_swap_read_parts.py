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
    import os

    out = tmp_path / "parts.json"
    aws = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING")
    before = {k: os.environ.get(k) for k in aws}
    assert main(["--size", "tiny", "--reps", "1", "--out", str(out)]) == 0
    # Its store's address and keys are not left for the next test.
    assert {k: os.environ.get(k) for k in aws} == before
    report = json.loads(out.read_text())
    assert report["bytes"] > 0 and report["crc32"] in ("isal", "zlib")
    assert list(report["steps"]) == [name for name, _ in STEPS]
    for step in report["steps"].values():
        assert len(step["samples_s"]) == 1 and step["median_s"] > 0 and step["gbps"] > 0
