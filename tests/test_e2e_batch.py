"""Batches end to end with the official openai client: `thaw up` (real vLLM on the CPU),
a file of 41 lines with 4 bad ones uploaded (three refused when the file is read, one
past the model's context refused when it runs), the batch created and polled to
``completed``; its 37 answers equal the same requests sent online (greedy), in input
order; the error file names the 4 lines; the counts agree; the lines are billed as
``service_tier`` batch. A cancelled batch ends with what it answered. Another tenant
sees neither the file nor the batch.

A batch for a model at zero runs on a standby lent to it; an online cold start of
another model takes that standby back at once (its cold start measured against the same
cold start with no batch running, and reported), and the cut lines finish later, each
answered once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest

from tests import waiting
from tests.e2e_stack import KEY, Stack, running_stack
from tests.prometheus_server import has_numbers, prometheus, query, targets_up
from thaw.config import hash_api_key
from thaw.dashboards import DASHBOARDS, RATE, queries
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

OTHER_KEY = "thaw-other-tenant-key"
LIMITED_KEY = "thaw-limited-tenant-key"
CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
# Three lines refused when the file is read, one by the activator when it runs (its
# prompt is past the model's context).
BAD_LINES = {5: "invalid_json_line", 17: "missing_custom_id", 30: "model_not_found", 36: "context_length_exceeded"}


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["engine"] = {**demo.get("engine", {}), "enforce_eager": True}
        demo["autoscaling"].update({"idle_grace_s": 3600, "activation_timeout_s": 300})
        cfg["tenants"].append({"name": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)],
                               "allowed_models": ["*"]})
        # One request a minute: the dashboards' test hits the limit.
        cfg["tenants"].append({"name": "limited", "api_key_hashes": [hash_api_key(LIMITED_KEY)],
                               "allowed_models": ["*"], "limits": {"requests_per_minute": 1}})
        cfg["batch"] = {"poll_interval_s": 0.2}
        # Two more models of the same weights: one online only, with a short idle grace
        # (cold started twice), one for batch only. No weight caches: every load reads
        # the store, so the two cold starts compared are alike.
        for name, grace in (("solo", 2), ("bulk", 3600)):
            cfg["models"].append({**demo, "name": name, "served_name": f"thaw-{name}",
                                  "autoscaling": {**demo["autoscaling"], "idle_grace_s": grace}})
        cfg["shapes"][0].pop("cache", None)
        cfg["shapes"][0]["host_cache_gib"] = 0

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("batch-e2e"), configure) as s:
        yield s


@pytest.fixture(scope="module", autouse=True)
def scraped(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """A real Prometheus scraping the stack every second from its start, with the config
    `thaw monitoring write` makes (None: Prometheus is not installed)."""
    work = tmp_path_factory.mktemp("monitoring")
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "monitoring", "write", "--config", str(stack.config),
                          "--out-dir", str(work), "--interval-s", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with prometheus(work / "prometheus.yml", work) as url:
        yield url


def body(i: int, max_tokens: int = 6, model: str = "thaw-demo", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": f"Say {i} and more"}],
            "max_tokens": max_tokens, "temperature": 0, **extra}


def input_file(n: int, bad: dict[int, str], max_tokens: int = 6, **kw: Any) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """n lines, those in ``bad`` broken as named; the good ones' bodies by custom_id."""
    lines, good = [], {}
    for i in range(1, n + 1):
        item: dict[str, Any] = {"custom_id": f"req-{i}", "method": "POST", "url": CHAT,
                                "body": body(i, max_tokens, **kw)}
        kind = bad.get(i)
        if kind == "invalid_json_line":
            lines.append(b'{"custom_id": "broken", ')
            continue
        if kind == "missing_custom_id":
            del item["custom_id"]
        elif kind == "model_not_found":
            item["body"] = {**item["body"], "model": "no-such-model"}
        elif kind == "context_length_exceeded":
            item["body"] = {**item["body"], "messages": [{"role": "user", "content": "many words " * 20_000}]}
        else:
            good[item["custom_id"]] = item["body"]
        lines.append(json.dumps(item).encode())
    return b"\n".join(lines) + b"\n", good


def wait_until(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 600) -> Any:
    last: list[Any] = [None]

    def reached() -> Any:
        last[0] = b = client.batches.retrieve(batch_id)
        return b if b.status in statuses else None

    return waiting.wait_until(f"the batch {sorted(statuses)}", reached, timeout_s, 0.5,
                              detail=lambda: f"batch still {last[0].status}: {last[0]}")


def completed(client: openai.OpenAI, batch_id: str, n: int, timeout_s: float = 300) -> None:
    """Once ``n`` of the batch's lines are done."""
    waiting.wait_until(f"{n} lines of the batch completed",
                       lambda: client.batches.retrieve(batch_id).request_counts.completed >= n,  # type: ignore[union-attr]
                       timeout_s, 0.2, detail=lambda: str(client.batches.retrieve(batch_id)))


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_a_batch_answers_as_online_and_names_its_bad_lines(stack: Stack) -> None:
    client = stack.client()
    data, good = input_file(41, BAD_LINES)
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
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (41, 37, 4)
    assert done.in_progress_at and done.finalizing_at and done.completed_at

    output = jsonl(client, done.output_file_id)
    assert [x["custom_id"] for x in output] == list(good)  # input order
    for x in output:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["message"]["content"] == online[x["custom_id"]], x
    errors = jsonl(client, done.error_file_id)
    assert [(x["error"]["line"], x["error"]["code"]) for x in errors] == sorted(BAD_LINES.items())
    # The line refused at run time keeps the activator's answer, as OpenAI's error file does.
    assert [x["response"] and x["response"]["status_code"] for x in errors] == [None, None, None, 400]

    # Another tenant: neither the file nor the batch exists.
    other = openai.OpenAI(base_url=stack.base_url, api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(created.id)
    for file_id in (uploaded.id, done.output_file_id, done.error_file_id):
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(file_id)  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            other.files.content(file_id)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(created.id)
    assert [b.id for b in other.batches.list()] == [] and [f.id for f in other.files.list()] == []
    assert created.id in [b.id for b in client.batches.list()]

    # Billed apart: one batch record per line the activator answered (the 37, and the one
    # it refused past the context, which has no tokens to bill).
    usage = httpx.get(f"{stack.base_url}/usage", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    batch = sorted(r["status"] for r in usage["data"] if r.get("service_tier") == "batch")
    assert batch == [200] * 37 + [400]
    assert [r.get("service_tier") for r in usage["data"]].count(None) >= 37
    # This activator ran them on its spare slots, and says so.
    metrics = stack.metrics()
    assert metrics[("thaw_batch_lines_total", (("model", "demo"), ("outcome", "answered")))] == 38
    # `thaw usage` shows them apart (priced at batch.price_factor where the model has prices).
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "usage", "--config", str(stack.config),
                          "--format", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["tenants"]["demo"]["models"]["demo"]
    assert row["batch"]["requests"] == 38 and row["requests"] >= 75


def test_a_cancelled_batch_ends_with_what_it_answered(stack: Stack) -> None:
    client = stack.client()
    client.chat.completions.create(**body(0))  # the model up
    # Far more lines than any machine answers between the batch starting and the cancel
    # (30 once all finished first on a fast one): the cancel always cuts it short.
    lines = 400
    data, good = input_file(lines, {}, max_tokens=48)
    uploaded = client.files.create(file=("slow.jsonl", data), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    wait_until(client, created.id, {"in_progress"}, timeout_s=60)
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_until(client, created.id, {"cancelled"}, timeout_s=300)
    assert done.request_counts is not None and done.request_counts.completed < lines
    answered = jsonl(client, done.output_file_id) if done.output_file_id else []
    assert len(answered) == done.request_counts.completed
    assert all(x["response"]["status_code"] == 200 for x in answered)
    if done.error_file_id:
        assert {x["error"]["code"] for x in jsonl(client, done.error_file_id)} == {"batch_cancelled"}


def first_token_s(client: openai.OpenAI, model: str) -> tuple[float, bool]:
    """Seconds from sending a streamed request to its first content, and whether it was a
    cold start."""
    t0 = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, stream=True)
    took = None
    for chunk in raw.parse():
        if took is None and chunk.choices and chunk.choices[0].delta.content:
            took = time.monotonic() - t0
    assert took is not None
    return took, raw.headers["x-thaw-cold-start"] == "true"


def serving(state: dict[str, Any], model: str) -> list[str]:
    return [w["id"] for w in state["workers"] if w["model"] == model and w["state"] in ("loading", "ready")]


def test_an_online_cold_start_takes_back_a_standby_lent_to_batch(stack: Stack) -> None:
    client = stack.client()
    token = {"Authorization": f"Bearer {stack.token()}"}
    standing_by = lambda s: [w["id"] for w in s["workers"] if w["state"] == "standby"]  # noqa: E731
    stack.wait_for("a standby", standing_by, timeout_s=240)
    # The cold start with no batch running: solo from a standby.
    baseline_s, cold = first_token_s(client, "thaw-solo")
    assert cold
    stack.wait_for("solo back at zero, a standby again",
                   lambda s: not serving(s, "solo") and standing_by(s), timeout_s=240)

    # A batch for bulk, at zero: a standby is lent to it and runs its lines.
    # Five rounds of lines on the lent engine's batch slots (16 of its 32): solo asks
    # once the first round has answered, with four still to run.
    data, good = input_file(80, {}, max_tokens=48, model="thaw-bulk", ignore_eos=True)
    uploaded = client.files.create(file=("bulk.jsonl", data), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    state = stack.wait_for("bulk on a lent standby", lambda s: serving(s, "bulk") and any(
        d["batch"] and d["id"] in serving(s, "bulk") for d in s["worker_details"]), timeout_s=300)
    lent = serving(state, "bulk")[0]
    assert not [d for d in state["worker_details"] if d["id"] == lent][0]["assignment_id"].startswith("solo")
    completed(client, created.id, 1)
    # Nothing was launched for it: the lent standby is one of the pool's.
    assert stack.state()["shapes"][0]["standby_lent_to_batch"] == 1

    # solo at zero again, no standby free: it takes the lent one back.
    asked_at = time.time()
    preempted_s, cold = first_token_s(client, "thaw-solo")
    assert cold
    state = stack.state()
    assert serving(state, "solo") == [lent] and not serving(state, "bulk")
    events = httpx.get(f"{stack.control_url}/v1/events", headers=token, timeout=5).json()["events"]
    assert [e for e in events if e["kind"] == "assign" and e["model"] == "solo" and e["worker_id"] == lent]
    control = [w["control_url"] for w in state["workers"] if w["id"] == lent][0]
    worker_metrics = httpx.get(f"{control}/metrics", headers=token, timeout=5).text
    sample = {line.split()[0]: float(line.split()[-1]) for line in worker_metrics.splitlines()
              if line.startswith("thaw_worker_batch_preemption_seconds_")}
    # Taken back from batch work still running (the batch had lines left).
    assert sample["thaw_worker_batch_preemption_seconds_count"] == 1
    took = sample["thaw_worker_batch_preemption_seconds_sum"]
    print(f"\nsolo's cold start from a standby: {baseline_s:.2f} s; from a standby lent to batch: "
          f"{preempted_s:.2f} s ({preempted_s - baseline_s:+.2f} s; the preemption itself {took:.3f} s)")

    # The cut lines run again once solo is gone: every line answered once, in order.
    done = wait_until(client, created.id, {"completed", "failed", "expired", "cancelled"}, timeout_s=900)
    assert done.status == "completed", done
    assert done.completed_at is not None and done.completed_at > asked_at
    assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (80, 0)
    output = jsonl(client, done.output_file_id)
    assert [x["custom_id"] for x in output] == list(good)
    assert all(x["response"]["status_code"] == 200 for x in output)
    assert all(x["response"]["body"]["usage"]["completion_tokens"] == 48 for x in output)


def test_a_batch_past_its_window_expires_with_what_it_answered(stack: Stack) -> None:
    client = stack.client()
    client.chat.completions.create(**body(0))  # the model up
    data, good = input_file(200, {}, max_tokens=64, ignore_eos=True)
    uploaded = client.files.create(file=("expiring.jsonl", data), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    completed(client, created.id, 5)
    # 24 hours pass: the controller's record says the window ended a second ago.
    db = sqlite3.connect(stack.data_dir / "controller" / "registry.db", timeout=30)
    try:
        (raw,) = db.execute("SELECT body FROM batches WHERE id = ?", (created.id,)).fetchone()
        record = json.loads(raw)
        record["expires_at"] = time.time() - 1
        with db:
            db.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(record), created.id))
    finally:
        db.close()
    done = wait_until(client, created.id, {"expired", "completed"}, timeout_s=120)
    assert done.status == "expired" and done.expired_at is not None, done
    assert done.request_counts is not None and done.request_counts.total == 200
    answered = jsonl(client, done.output_file_id) if done.output_file_id else []
    assert 5 <= len(answered) == done.request_counts.completed < 200
    errors = jsonl(client, done.error_file_id)
    assert len(errors) == 200 - len(answered) == done.request_counts.failed
    assert {x["error"]["code"] for x in errors} == {"batch_expired"}
    # Every line is in one file or the other, once.
    assert sorted(x["custom_id"] for x in answered + errors) == sorted(good)


def test_every_dashboard_panel_has_data_in_a_real_prometheus(stack: Stack, scraped: str | None) -> None:
    """Each panel of each dashboard (thaw/dashboards.py) is a query Prometheus accepts and
    that returns numbers, scraped from this stack since its start (its batches, cold
    starts and the requests below). Rates are taken over the module's whole run."""
    assert scraped is not None, "Prometheus is not installed (apt-get install prometheus; scripts/bootstrap.sh does)"
    assert set(targets_up(scraped).values()) == {"up"}, targets_up(scraped)
    # A tenant at its limit, a conversation's turn, a model that does not exist.
    limited = openai.OpenAI(base_url=stack.base_url, api_key=LIMITED_KEY, max_retries=0, timeout=300)
    limited.chat.completions.create(**body(1))
    with pytest.raises(openai.RateLimitError):
        limited.chat.completions.create(**body(2))
    stack.client().responses.create(model="thaw-demo", input="Hello", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        stack.client().chat.completions.create(**body(3, model="no-such-model"))
    waiting.wait_until("the refusal scraped", lambda: query(
        scraped, 'thaw_tenant_requests_total{outcome="rate_limit_requests"}'), 30, 0.5)
    empty = []
    for d in DASHBOARDS:
        for title, expr in queries(d):
            result = query(scraped, expr.replace(RATE, "1h"))  # valid, or this raises naming it
            if not has_numbers(result):
                empty.append(f"{d.uid}: {title}: {expr}")
    assert empty == [], "panels with no data:\n" + "\n".join(empty)
