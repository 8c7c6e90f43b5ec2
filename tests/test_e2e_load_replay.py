"""`thaw load run` and `thaw load report` end to end: a two-model trace replayed against
`thaw up` (real vLLM on CPU, the real store), and the report's counts checked against what
the activator recorded (its ledger and its /metrics). A cheap second check, against the
fake engine: the generator-lag flag is raised when the generator falls behind, not
otherwise."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from activator.ledger import query_usage
from loadtests.load_report import read_run
from loadtests.load_stats import completed
from simulator.traces import from_columns, write_generic
from tests.activator.fake_engine import FakeEngine, serve
from tests.e2e_stack import KEY, Stack, running_stack
from tests.waiting import wait_until
from thaw.cli.main import main as thaw
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

# model name in the config -> served name; "demo" is hot from the start, "second" starts at zero.
SERVED = {"demo": "thaw-demo", "second": "second"}
# The trace's names for them (mapped with --model-map).
TRACE_NAMES = {"chat": "thaw-demo", "code": "second"}


def write_trace(path: Path, rows: list[tuple[float, str, int, int]]) -> Path:
    t, models, inp, out = zip(*rows, strict=True)
    names = sorted(set(models))
    write_generic(from_columns(list(t), [names.index(m) for m in models], [0] * len(rows), list(inp), list(out),
                               names, ["demo"], "test"), path)
    return path


def two_model_trace(path: Path) -> Path:
    # 24 requests over 19 s of trace time: "chat" every 1.6 s from 0, "code" every 1.6 s from 1 s
    # (12 of each); inputs of 40..150 tokens, outputs of 8..30.
    rows = [(round(1.6 * i, 3), "chat", 40 + 10 * i, 8 + 2 * i) for i in range(12)]
    rows += [(1.0 + 1.6 * i, "code", 150 - 10 * i, 30 - 2 * i) for i in range(12)]
    return write_trace(path, rows)


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["autoscaling"].update({"min_replicas": 1, "max_replicas": 1, "idle_grace_s": 600,
                                    "activation_timeout_s": 240})
        cfg["models"].append({**demo, "name": "second", "served_name": SERVED["second"],
                              "autoscaling": {**demo["autoscaling"], "min_replicas": 0}})
        # One worker serves "demo", the other waits as a standby for "second"'s cold start.
        cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 2})

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("load-replay"), configure) as s:
        s.wait_for("demo ready and a standby worker",
                   lambda st: next(m for m in st["models"] if m["name"] == "demo")["replicas"] == {"ready": 1}
                   and any(w["state"] == "standby" for w in st["workers"]),
                   timeout_s=300)
        yield s


def ledger_records(stack: Stack, since: float) -> list[dict[str, Any]]:
    return [r for path in sorted((stack.data_dir / "activators").glob("*/usage.db"))
            for r in query_usage(path, since=since)]


@pytest.mark.integration
@pytest.mark.engine
def test_replayed_trace_matches_what_the_activator_recorded(stack: Stack, tmp_path: Path) -> None:
    trace = two_model_trace(tmp_path / "trace.csv")
    out = tmp_path / "run"
    # 20 s of trace at 2x: 10 s of sends; "second" waits for its cold start meanwhile.
    rc = thaw(["load", "run", "--trace", str(trace), "--base-url", stack.base_url, "--api-key", KEY,
               "--out-dir", str(out), "--speedup", "2", "--max-tokens-cap", "16", "--grace-s", "240",
               "--model-map", f"chat={TRACE_NAMES['chat']}", "--model-map", f"code={TRACE_NAMES['code']}",
               "--controller", stack.control_url, "--cluster-token", stack.token()])
    stack.remember_children()
    assert rc == 0
    assert thaw(["load", "report", str(out), "--ttft-slo-s", "5", "--tpot-slo-ms", "1000"]) == 0
    info, records, samples = read_run(out)
    report = json.loads((out / "report.json").read_text())
    print(f"\n{json.dumps(report['counts'])}; ttft p50 by tier: "
          f"{ {k: v['ttft_s']['p50'] for k, v in report['by_tier'].items()} }")

    assert report["counts"]["sent"] == 24 and report["counts"]["cancelled"] == 0
    name_of = {served: name for name, served in SERVED.items()}
    # What the client saw, per model and status; the same from the activator's ledger
    # (written as each request ends: give the last ones a moment) and its counters.
    seen = Counter((name_of[r.model], r.status) for r in records)
    with contextlib.suppress(AssertionError):  # the assert below shows the difference
        wait_until("the ledger to hold what the client saw", lambda: Counter(
            (r["model"], r["status"]) for r in ledger_records(stack, info.started_at - 1)) == seen, 15, 0.3)
    ledger = ledger_records(stack, info.started_at - 1)
    assert Counter((r["model"], r["status"]) for r in ledger) == seen
    metrics = stack.metrics()
    counted = Counter({(dict(labels)["model"], int(dict(labels)["status"])): int(v)
                       for (name, labels), v in metrics.items() if name == "thaw_requests_total"})
    assert +counted == seen
    for served, name in name_of.items():
        g = report["by_model"][served]
        assert g["requests"] == sum(n for (m, _), n in seen.items() if m == name) == 12
        assert g["completed"] == sum(1 for r in ledger if r["model"] == name and r["status"] == 200
                                     and not r["cancelled"])
    assert report["counts"]["completed"] == sum(1 for r in ledger if r["status"] == 200)
    errors = Counter(str(r["status"]) for r in ledger if r["status"] != 200)
    assert report["errors_by_status"] == dict(errors)

    # A TTFT for every completed request; the report's samples are those.
    done = [r for r in records if completed(r)]
    assert done and all(r.ttft_s is not None and r.ttft_s > 0 for r in done)
    assert report["overall"]["ttft_s"]["n"] == len(done) == report["counts"]["completed"]
    # "demo" was hot all along; "second"'s first request waited for its cold start.
    assert all(r.cold_start is False and r.tier == "hot" for r in records if r.model == "thaw-demo")
    first = min((r for r in records if r.model == "second"), key=lambda r: r.sent_s)
    assert first.cold_start is True and first.tier not in (None, "hot") and first.queue_ms is not None
    # The controller was polled: "second" went from no replica to a ready one.
    ready = [s.replicas.get("ready", 0) for s in samples if s.model == "second"]
    assert ready and ready[0] == 0 and max(ready) == 1
    assert (out / "ttft_cdf.png").exists() and (out / "timeline.png").exists()


def run_cli(argv: list[str]) -> None:
    # In its own process, as an operator runs it: the fake engine in this one does not
    # compete with the generator's loop.
    proc = subprocess.run([sys.executable, "-m", "thaw.cli.main", *argv], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("gap_s", "overhead_ms", "behind"),
    [
        # 20 sends 10 ms apart, each blocking the loop 100 ms: send k goes out ~90k ms late.
        (0.01, 100, True),
        # 20 sends 100 ms apart and nothing in the way: on time.
        (0.1, 0, False),
    ],
)
def test_lag_flag_is_raised_only_when_the_generator_falls_behind(tmp_path: Path, gap_s: float, overhead_ms: float,
                                                                 behind: bool, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(gap_s * i, "chat", 20, 4) for i in range(20)])
    out = tmp_path / "run"
    engine = FakeEngine(tokens=3)
    with serve(engine) as url:
        run_cli(["load", "run", "--trace", str(trace), "--base-url", f"{url}/v1", "--api-key", "k",
                 "--out-dir", str(out), "--model-map", "chat=served-demo", "--send-overhead-ms", str(overhead_ms),
                 "--grace-s", "30"])
    info, records, _ = read_run(out)
    assert info.counts.completed == 20 and len(engine.requests) == 20
    assert info.generator_fell_behind is behind
    assert info.config.send_overhead_ms == overhead_ms
    if behind:
        assert info.lag.max_ms is not None and info.lag.max_ms > 1000  # ~19 x 90 ms
    assert thaw(["load", "report", str(out), "--no-plots"]) == 0
    assert f"generator fell behind: {'YES' if behind else 'no'}" in capsys.readouterr().out
