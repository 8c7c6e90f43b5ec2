"""Batches end to end with the official openai client: `thaw up` (real vLLM on the CPU),
a file of 40 lines with 3 bad ones uploaded, the batch created and polled to
``completed``; its 37 answers equal the same requests sent online (greedy), in input
order; the error file names the 3 lines; the counts agree; the lines are billed as
``service_tier`` batch. A cancelled batch ends with what it answered. Another tenant
sees neither the file nor the batch.

The batch runs on the replica online traffic brought up (a model at zero is not started
for a batch yet)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest

from tests.e2e_stack import KEY, Stack, running_stack
from thaw.config import hash_api_key
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

OTHER_KEY = "thaw-other-tenant-key"
CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
BAD_LINES = {5: "invalid_json_line", 17: "missing_custom_id", 30: "model_not_found"}


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["engine"] = {**demo.get("engine", {}), "enforce_eager": True}
        demo["autoscaling"].update({"idle_grace_s": 3600, "activation_timeout_s": 300})
        cfg["tenants"].append({"name": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)],
                               "allowed_models": ["*"]})
        cfg["batch"] = {"poll_interval_s": 0.2}

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("batch-e2e"), configure) as s:
        yield s


def body(i: int, max_tokens: int = 6) -> dict[str, Any]:
    return {"model": "thaw-demo", "messages": [{"role": "user", "content": f"Say {i} and more"}],
            "max_tokens": max_tokens, "temperature": 0}


def input_file(n: int, bad: dict[int, str], max_tokens: int = 6) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """n lines, those in ``bad`` broken as named; the good ones' bodies by custom_id."""
    lines, good = [], {}
    for i in range(1, n + 1):
        item: dict[str, Any] = {"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body(i, max_tokens)}
        kind = bad.get(i)
        if kind == "invalid_json_line":
            lines.append(b'{"custom_id": "broken", ')
            continue
        if kind == "missing_custom_id":
            del item["custom_id"]
        elif kind == "model_not_found":
            item["body"] = {**item["body"], "model": "no-such-model"}
        else:
            good[item["custom_id"]] = item["body"]
        lines.append(json.dumps(item).encode())
    return b"\n".join(lines) + b"\n", good


def wait_until(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 600) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in statuses:
            return b
        assert time.monotonic() < deadline, f"batch still {b.status}: {b}"
        time.sleep(0.5)


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_a_batch_answers_as_online_and_names_its_bad_lines(stack: Stack) -> None:
    client = stack.client()
    data, good = input_file(40, BAD_LINES)
    # Online first (which brings the model up): the answers the batch must equal.
    online = {cid: client.chat.completions.create(**b).choices[0].message.content for cid, b in good.items()}
    uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
    assert uploaded.bytes == len(data)
    created = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                    metadata={"job": "e2e"})
    assert created.status == "validating" and created.metadata == {"job": "e2e"}
    done = wait_until(client, created.id, {"completed", "failed", "expired", "cancelled"})
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (40, 37, 3)
    assert done.in_progress_at and done.finalizing_at and done.completed_at

    output = jsonl(client, done.output_file_id)
    assert [x["custom_id"] for x in output] == list(good)  # input order
    for x in output:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["message"]["content"] == online[x["custom_id"]], x
    errors = jsonl(client, done.error_file_id)
    assert [(x["error"]["line"], x["error"]["code"]) for x in errors] == sorted(BAD_LINES.items())
    assert all(x["response"] is None for x in errors)

    # Another tenant: neither the file nor the batch exists.
    other = openai.OpenAI(base_url=stack.base_url, api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(created.id)
    assert [b.id for b in other.batches.list()] == [] and [f.id for f in other.files.list()] == []
    assert created.id in [b.id for b in client.batches.list()]

    # Billed apart: one batch record per answered line.
    usage = httpx.get(f"{stack.base_url}/usage", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    tiers = [r.get("service_tier") for r in usage["data"]]
    assert tiers.count("batch") == 37 and tiers.count(None) >= 37
    # This activator ran them on its spare slots, and says so.
    metrics = stack.metrics()
    assert metrics[("thaw_batch_lines_total", (("model", "demo"), ("outcome", "answered")))] == 37
    # `thaw usage` shows them apart (priced at batch.price_factor where the model has prices).
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "usage", "--config", str(stack.config),
                          "--format", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["tenants"]["demo"]["models"]["demo"]
    assert row["batch"]["requests"] == 37 and row["requests"] >= 74


def test_a_cancelled_batch_ends_with_what_it_answered(stack: Stack) -> None:
    client = stack.client()
    client.chat.completions.create(**body(0))  # the model up
    data, good = input_file(30, {}, max_tokens=48)
    uploaded = client.files.create(file=("slow.jsonl", data), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    wait_until(client, created.id, {"in_progress"}, timeout_s=60)
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_until(client, created.id, {"cancelled"}, timeout_s=300)
    assert done.request_counts is not None and done.request_counts.completed < 30
    answered = jsonl(client, done.output_file_id) if done.output_file_id else []
    assert len(answered) == done.request_counts.completed
    assert all(x["response"]["status_code"] == 200 for x in answered)
    if done.error_file_id:
        assert {x["error"]["code"] for x in jsonl(client, done.error_file_id)} == {"batch_cancelled"}
