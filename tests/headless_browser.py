"""A real browser for a test: Debian's headless Chromium, driven over the DevTools
protocol (a websocket; no driver to install). It opens a page, evaluates expressions
in it and takes screenshots; stopped with its profile."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import websockets

from tests.waiting import until
from thaw.embedded_store import free_port
from thaw.process import stop_group

BINARY = "chromium"


class Page:
    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        mid = next(self._ids)
        await self._ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:  # events come in between; the answer names its call
            msg = json.loads(await asyncio.wait_for(self._ws.recv(), 30))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})  # type: ignore[no-any-return]

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def eval(self, expression: str) -> Any:
        out = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))


def _start(binary: str, work: Path, port: int, width: int, height: int) -> tuple[Any, subprocess.Popen[bytes]]:
    log = open(work / "chromium.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             f"--remote-debugging-port={port}", f"--user-data-dir={work / 'profile'}",
                             f"--window-size={width},{height}", "about:blank"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return log, proc


@asynccontextmanager
async def chromium(work: Path, width: int = 1280, height: int = 900) -> AsyncIterator[Page | None]:
    """A page in a fresh headless Chromium, or None when it is not installed."""
    binary = shutil.which(BINARY)
    if binary is None:
        yield None
        return
    port = free_port()
    log, proc = await asyncio.to_thread(_start, binary, work, port, width, height)
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            async def target() -> str | None:
                try:
                    pages = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
                except httpx.HTTPError:
                    return None
                return next((p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page"), None)

            found: list[str] = []

            async def ready() -> bool:
                url = await target()
                if url:
                    found.append(url)
                return bool(url) or proc.poll() is not None

            await until("Chromium's DevTools", ready, 60, interval_s=0.2,
                        detail=lambda: (work / "chromium.log").read_text()[-2000:])
        assert found, (work / "chromium.log").read_text()[-2000:]
        async with websockets.connect(found[-1], max_size=64 << 20) as ws:
            page = Page(ws)
            await page.call("Page.enable")
            yield page
    finally:
        await asyncio.to_thread(stop_group, proc, 10)
        log.close()


async def wait_for(page: Page, what: str, expression: str, timeout_s: float = 30.0) -> Any:
    """The value of ``expression`` once it is truthy in the page."""
    seen: list[Any] = [None]

    async def value() -> Any:
        seen[0] = await page.eval(expression)
        return seen[0]

    return await until(what, value, timeout_s, interval_s=0.1, detail=lambda: repr(seen[0]))
