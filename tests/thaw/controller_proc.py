"""A real `thaw controller` process for the CLI's tests: started from a config, waited
for until healthy, stopped after; and one over the session's store with the demo model
pushed (no pools: it launches nothing)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.conftest import BUCKET
from tests.waiting import wait_until
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
THAW = [sys.executable, "-m", "thaw.cli.main"]


@contextlib.contextmanager
def controller_process(config: Path, port: int, cwd: Path) -> Iterator[str]:
    """`thaw controller --config CONFIG` run in ``cwd``; yields its URL once healthy."""
    import httpx

    proc = subprocess.Popen([*THAW, "controller", "--config", str(config)], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, "the controller exited"
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            return False

        wait_until("the controller healthy", healthy, 30, 0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.contextmanager
def controller_with_demo(tmp: Path, store: EmbeddedStore, s3: S3Endpoint,
                         demo_model_dir: Path) -> Iterator[tuple[list[str], str]]:
    """A controller of its own over the session's store, examples/thaw.yaml's demo model
    pushed to a fresh URI; yields the common arguments (--config, --controller) and that
    URI."""
    uri = f"s3://{BUCKET}/tests/{tmp.name}"
    push_model(s3.client(), demo_model_dir, uri)
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(tmp / "data")
    data["pools"] = []  # a controller that launches nothing
    port = free_port()
    data["controller"] = {"port": port}
    data["object_store"] = {"kind": "s3", "endpoint_url": s3.endpoint_url, "bucket": BUCKET,
                            "credentials": {"source": "file", "file": str(store.root / "credentials.json")}}
    data["models"][0].update({"uri": uri, "demo_if_missing": False})
    cfg = tmp / "thaw.yaml"
    cfg.write_text(yaml.safe_dump(data))
    with controller_process(cfg, port, tmp) as url:
        yield ["--config", str(cfg), "--controller", url], uri
