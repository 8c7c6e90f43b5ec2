"""Models deployed, rolled, rolled back and removed at run time, end to end: `thaw
controller`, two `thaw activator`s and local `thaw worker`s with vLLM on the CPU, as
separate processes, and the store; every change made with `thaw models ...`.

A deployed model is listed by both activators (timed) and served; `update` and
`rollback` under a steady streamed load (the official client, through both activators)
roll with no failed request, and the ledgers name the revision that answered each;
`rm` gives new requests 404 while one in flight completes; a tenant's private model is
another tenant's 404; every refusal says why and leaves the registry as it was.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from loadtests.procs import kill_group
from tests.conftest import BUCKET
from tests.e2e_fleet import KEY, Fleet, kill_local_workers
from tests.e2e_stack import push_demo
from thaw.config import hash_api_key
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
OTHER_KEY = "thaw-other-tenant-key"


@pytest.fixture(scope="module")
def fleet(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("registry")
    uri = f"s3://{BUCKET}/e2e/registry-seed-{os.getpid()}"
    push_model(s3.client(), demo_model_dir, uri)
    cfg = yaml.safe_load((ROOT / "examples" / "thaw.yaml").read_text())
    controller_port = free_port()
    cfg.update({
        "data_dir": str(tmp / "data"),
        "controller": {"port": controller_port},
        "cluster": {"heartbeat_interval_s": 1, "worker_timeout_s": 10},
        "object_store": {"kind": "s3", "endpoint_url": s3.endpoint_url, "bucket": BUCKET,
                         "allowed_prefixes": [f"s3://{BUCKET}/e2e/"],
                         "credentials": {"source": "file", "file": str(store.root / "credentials.json")}},
        "ledger": {"ship": False},
    })
    cfg["tenants"].append({"name": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)]})
    cfg["models"][0].update({"uri": uri, "demo_if_missing": False})
    cfg["pools"][0].update({"standby_min": 1, "standby_max": 2, "max_instances": 4})
    path = tmp / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ports = {"a": free_port(), "b": free_port()}
    f = Fleet(tmp, path, f"http://127.0.0.1:{controller_port}",
              {n: f"http://127.0.0.1:{p}/v1" for n, p in ports.items()}, None)
    try:
        f.start_controller()
        for name in ports:
            f.start_activator(name)
        for base in f.activators.values():
            f.wait_healthy(base, timeout_s=120)
        yield f
    finally:
        for name in [n for n in f.procs if n.startswith("activator")] + ["controller"]:
            if name in f.procs:
                kill_group(f.procs[name], 60)
        kill_local_workers(f.data_dir)


def models(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return fleet.thaw("models", *args, "--controller", fleet.controller_url)


def listed(fleet: Fleet, name: str, key: str = KEY) -> list[str]:
    r = httpx.get(f"{fleet.activators[name]}/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
    r.raise_for_status()
    return sorted(m["id"] for m in r.json()["data"])


def registry(fleet: Fleet) -> Any:
    out = models(fleet, "ls", "--json")
    assert out.returncode == 0, out.stderr
    return [{k: v for k, v in m.items() if k != "replicas"} for m in json.loads(out.stdout)]


def ledger_rows(fleet: Fleet, model: str) -> list[dict[str, Any]]:
    rows = []
    for name in fleet.activators:
        conn = sqlite3.connect(fleet.data_dir / "activators" / name / "usage.db")
        conn.row_factory = sqlite3.Row
        rows += [dict(r) for r in conn.execute("SELECT * FROM usage WHERE model = ?", (model,))]
        conn.close()
    return rows


def chat(client: openai.OpenAI, model: str, max_tokens: int = 8) -> str:
    stream = client.chat.completions.create(model=model, stream=True, max_tokens=max_tokens,
                                            messages=[{"role": "user", "content": "hello"}])
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


class Load:
    """Streamed chat completions, one after another, through each activator."""

    def __init__(self, fleet: Fleet, model: str) -> None:
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(fleet.client(n), model), daemon=True)
                         for n in fleet.activators]

    def _run(self, client: openai.OpenAI, model: str) -> None:
        while not self._stop.is_set():
            try:
                chat(client, model)
                self.ok += 1
            except Exception as exc:  # every failure is the test's business
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(180)


def serving_revision(fleet: Fleet, model: str, revision: int) -> bool:
    """Every ready replica of ``model`` serves ``revision`` (and there is one)."""
    table = httpx.get(f"{fleet.controller_url}/v1/routes", headers=fleet.auth(), timeout=5).json()
    replicas = table["models"].get(model, {}).get("replicas", [])
    return bool(replicas) and all(r["revision"] == revision for r in replicas)


def test_deploy_roll_rollback_and_rm_under_load(fleet: Fleet, s3: S3Endpoint, tmp_path: Path) -> None:
    fleet.wait("the controller is up", lambda s: s["adopted"])
    v1, v2 = push_demo(s3, tmp_path, "chat-v1", seed=3), push_demo(s3, tmp_path, "chat-v2", seed=4)

    # Deployed: both activators list it (how soon is printed), and it is served.
    out = models(fleet, "deploy", "chat", "--uri", v1, "--shape", "cpu-local", "--note", "first",
                 "--price-prompt", "100", "--price-completion", "400")
    assert out.returncode == 0, out.stderr
    returned = time.monotonic()
    while not all("chat" in listed(fleet, n) for n in fleet.activators):
        assert time.monotonic() - returned < 30, "the deployed model did not reach both activators"
        time.sleep(0.02)
    print(f"deployed model listed by both activators {time.monotonic() - returned:.3f} s after the command")
    assert chat(fleet.client("b"), "chat")

    # An update under load rolls: no request fails; each is answered by one revision.
    with Load(fleet, "chat") as load:
        fleet.wait("load on revision 1", lambda s: load.ok >= 4, timeout_s=120)
        out = models(fleet, "update", "chat", "--uri", v2, "--note", "new weights")
        assert out.returncode == 0, out.stderr
        fleet.wait("revision 2 serving alone", lambda s: serving_revision(fleet, "chat", 2), timeout_s=300)
        settled = load.ok
        fleet.wait("load on revision 2", lambda s: load.ok >= settled + 4, timeout_s=120)
        # Rolled back (to revision 1's weights) under the same load: revision 3.
        out = models(fleet, "rollback", "chat")
        assert out.returncode == 0, out.stderr
        fleet.wait("revision 3 serving alone", lambda s: serving_revision(fleet, "chat", 3), timeout_s=300)
        settled = load.ok
        fleet.wait("load on revision 3", lambda s: load.ok >= settled + 4, timeout_s=120)
    assert load.failures == [] and load.ok > 12
    rows = ledger_rows(fleet, "chat")
    assert {r["status"] for r in rows} == {200}
    revisions = [r["revision"] for r in sorted(rows, key=lambda r: r["started_at"])]
    assert None not in revisions and {1, 2, 3} <= set(revisions), revisions
    # Billed at the prices of the revision that answered each request (kept by the update).
    usage = fleet.thaw("usage", "--format", "json", "--controller", fleet.controller_url)
    assert usage.returncode == 0, usage.stderr
    bill = json.loads(usage.stdout)["tenants"]["demo"]["models"]["chat"]
    assert bill["unpriced_requests"] == 0 and bill["cost_usd"] == pytest.approx(
        sum(r["prompt_tokens"] * 100 + r["completion_tokens"] * 400 for r in rows) / 1e6, rel=1e-3)
    described = json.loads(models(fleet, "describe", "chat", "--json").stdout)
    assert [(r["revision"], r["change"], r["from_revision"]) for r in described["revisions"]] == [
        (1, "deploy", None), (2, "update", None), (3, "rollback", 1)]
    assert described["revisions"][0]["note"] == "first" and described["revisions"][2]["spec"]["uri"] == v1

    # Removed while a long stream is in flight: it completes; a new request is a 404.
    client = fleet.client("a")
    stream = client.chat.completions.create(model="chat", stream=True, max_tokens=200,
                                            messages=[{"role": "user", "content": "tell me more"}])
    first = next(iter(stream))
    out = models(fleet, "rm", "chat")
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    while any("chat" in listed(fleet, n) for n in fleet.activators):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(openai.NotFoundError) as info:
        chat(fleet.client("b"), "chat")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]
    rest = [c for c in stream]
    assert first.choices and any(c.choices and c.choices[0].finish_reason in ("length", "stop") for c in rest)
    fleet.wait("its replicas released", lambda s: not any(w["model"] == "chat" for w in s["workers"]),
               timeout_s=120)
    assert [r["revision"] for r in json.loads(models(fleet, "describe", "chat", "--json").stdout)["revisions"]] \
        == [1, 2, 3]


def test_a_private_model_and_every_refusal(fleet: Fleet, s3: S3Endpoint, tmp_path: Path) -> None:
    fleet.wait("the controller is up", lambda s: s["adopted"])
    uri = push_demo(s3, tmp_path, "private", seed=5)
    out = models(fleet, "deploy", "mine", "--uri", uri, "--shape", "cpu-local", "--tenant", "other")
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    while "mine" not in listed(fleet, "a", OTHER_KEY):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "mine" not in listed(fleet, "a") and "mine" not in listed(fleet, "b")
    r = httpx.post(f"{fleet.activators['b']}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "mine", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

    before = registry(fleet)
    incomplete = f"s3://{BUCKET}/e2e/no-manifest-{os.getpid()}"
    s3.client().put_object(Bucket=BUCKET, Key=incomplete.split("/", 3)[3] + "/model.safetensors", Body=b"x")
    refusals = [
        (("deploy", "mine", "--uri", uri, "--shape", "cpu-local"), "exists"),
        (("deploy", "x", "--uri", f"s3://{BUCKET}/elsewhere/x", "--shape", "cpu-local"), "outside the allowed"),
        (("deploy", "x", "--uri", incomplete, "--shape", "cpu-local"), "no manifest"),
        (("deploy", "x", "--uri", uri, "--shape", "cpu-local", "--engine-arg", "cpu_kvcache_gib=64"), "do not fit"),
        (("deploy", "x", "--uri", uri, "--shape", "gpu-none"), "shape 'gpu-none' is not declared"),
        (("deploy", "x", "--base", "nothing", "--adapter-uri", uri), "base 'nothing' is not a model"),
        (("update", "mine", "--revision", "7", "--max-replicas", "2"), "not 7"),
        (("update", "nothing", "--max-replicas", "2"), "no model 'nothing'"),
        (("rollback", "mine"), "no revision 0"),
    ]
    for args, says in refusals:
        out = models(fleet, *args)
        assert out.returncode == 2 and says in out.stderr, (args, out.returncode, out.stderr)
    assert registry(fleet) == before
