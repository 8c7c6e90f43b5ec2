"""A real Prometheus (Debian's ``prometheus``) for a test: started on a free loopback port
with a config of the test's (``thaw monitoring write``), stopped with its data."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.waiting import wait_until
from thaw.embedded_store import free_port
from thaw.process import stop_group

BINARY = "prometheus"


@contextmanager
def prometheus(config: Path, work: Path) -> Iterator[str | None]:
    """Yields Prometheus's base URL, or None when it is not installed (the caller says so)."""
    binary = shutil.which(BINARY)
    if binary is None:
        yield None
        return
    port = free_port()
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("Prometheus ready", lambda: proc.poll() is not None or _ready(url), 60, 0.2)
        assert proc.poll() is None, (work / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        stop_group(proc, 20)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result; AssertionError naming the query when Prometheus refuses it."""
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body.get("status") == "success", f"{expr}: {body.get('error') or r.text}"
    return body["data"]["result"]  # type: ignore[no-any-return]


def has_numbers(result: list[dict[str, Any]]) -> bool:
    """A result with at least one series whose value is a number (not NaN)."""
    return any(not math.isnan(float(s["value"][1])) for s in result)


def targets_up(url: str) -> dict[str, str]:
    """Each scrape target's job and health."""
    r = httpx.get(f"{url}/api/v1/targets", timeout=10).json()
    return {f"{t['labels']['job']} {t['scrapeUrl']}": t["health"] for t in r["data"]["activeTargets"]}
