"""A running `thaw up` for end-to-end tests: started as a real process, stopped after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BUCKET
from tests.waiting import wait_until
from thaw.auth import bearer, local_token
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

KEY = "thaw-demo-key"


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    base_url: str
    control_url: str
    config: Path
    log: Path
    data_dir: Path
    seen_pids: set[int] = field(default_factory=set)

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=KEY, max_retries=0, timeout=300, **kw)

    def token(self) -> str:
        return local_token(self.data_dir)

    def state(self) -> dict[str, Any]:
        r = httpx.get(f"{self.control_url}/v1/state", timeout=5, headers=bearer(self.token()))
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(self.base_url.removesuffix("/v1") + "/metrics", timeout=5,
                         headers=bearer(self.token())).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def remember_children(self) -> None:
        try:
            self.seen_pids.update(c.pid for c in psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def wait_for(self, what: str, pred: Any, timeout_s: float = 180) -> dict[str, Any]:
        state: dict[str, Any] = {}

        def holds() -> bool:
            nonlocal state
            self.remember_children()
            if self.proc.poll() is not None:
                raise AssertionError(f"thaw up exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            state = self.state()
            return bool(pred(state))

        wait_until(what, holds, timeout_s, 0.3, detail=lambda: f"last state: {json.dumps(state, indent=1)}")
        return state


def push_demo(s3: S3Endpoint, tmp: Path, name: str, seed: int) -> str:
    """The demo model with ``seed`` (another model of its engine class) built under
    ``tmp`` and pushed to a fresh URI; returns the URI."""
    from thaw.demo_model import build_demo_model

    build_demo_model(tmp / name, seed=seed)
    uri = f"s3://{BUCKET}/e2e/{name}-{tmp.name}-{os.getpid()}"
    push_model(s3.client(), tmp / name, uri)
    return uri


@contextmanager
def running_stack(
    store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path, tmp: Path,
    configure: Callable[[dict[str, Any], str], None],
) -> Iterator[Stack]:
    """`thaw up` against the session store, with the demo model pushed to a fresh URI;
    ``configure(cfg, uri)`` adjusts the config dict before it is written."""
    uri = f"s3://{BUCKET}/e2e/{tmp.name}-{os.getpid()}"
    push_model(s3.client(), demo_model_dir, uri)
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "thaw.yaml").read_text())
    cfg["data_dir"] = str(tmp / "data")
    cfg["server"]["port"] = free_port()
    cfg["controller"] = {"port": free_port()}
    cfg["object_store"] = {
        "kind": "s3", "endpoint_url": s3.endpoint_url, "bucket": BUCKET,
        "credentials": {"source": "file", "file": str(store.root / "credentials.json")},
    }
    cfg["models"][0].update({"uri": uri, "demo_if_missing": False})
    configure(cfg, uri)
    path = tmp / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp / "thaw-up.log"
    logf = open(log, "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "thaw.cli.main", "up", "--config", str(path)],
                            stdout=logf, stderr=subprocess.STDOUT)
    endpoint = tmp / "data" / "endpoint.json"
    # The store, then the controller and the activator, each importing its stack: on a
    # busy 2-core machine this takes a while.
    try:
        wait_until("thaw up to start (its endpoint file)", lambda: endpoint.exists() or proc.poll() is not None,
                   240, 0.2)
        assert endpoint.exists()
    except AssertionError:
        proc.kill()
        raise AssertionError(f"thaw up did not start:\n{log.read_text()[-3000:]}") from None
    info = json.loads(endpoint.read_text())
    s = Stack(proc, info["base_url"], info["control_url"], path, log, tmp / "data")
    assert info["api_key"] == KEY and info["model"] == "thaw-demo"
    try:
        yield s
    finally:
        if proc.poll() is None:
            # Gracefully first: workers give back what they hold (a host cache is memory).
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            proc.kill()
            for pid in s.seen_pids:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        logf.close()
