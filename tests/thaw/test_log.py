from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from thaw.log import bind_request, get_logger, setup_logging


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in buf.getvalue().splitlines() if ln.strip()]


def test_json_lines_carry_component_and_request_id() -> None:
    buf = io.StringIO()
    setup_logging("activator", "info", stream=buf)
    log = get_logger()
    log.info("outside")
    with bind_request("req-123", model="demo"):
        log.info("inside", queue_ms=12)
        logging.getLogger("uvicorn.error").warning("from stdlib")
    log.debug("filtered out at info")
    lines = _lines(buf)
    assert [ln["event"] for ln in lines] == ["outside", "inside", "from stdlib"]
    assert all(ln["component"] == "activator" for ln in lines)
    assert "request_id" not in lines[0]
    assert lines[1]["request_id"] == "req-123" and lines[1]["model"] == "demo" and lines[1]["queue_ms"] == 12
    assert lines[2]["request_id"] == "req-123" and lines[2]["level"] == "warning"
    assert all("timestamp" in ln for ln in lines)


def test_request_ids_do_not_leak_between_tasks() -> None:
    buf = io.StringIO()
    setup_logging("activator", "info", stream=buf)
    log = get_logger()

    async def handle(rid: str) -> None:
        with bind_request(rid):
            await asyncio.sleep(0.01)
            log.info("done")

    async def main() -> None:
        await asyncio.gather(handle("a"), handle("b"))

    asyncio.run(main())
    assert sorted(str(ln["request_id"]) for ln in _lines(buf)) == ["a", "b"]


def test_logging_follows_stderr_when_it_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set up with one stderr, which is then closed and replaced (as a test harness
    does between tests): a log call writes to the new one instead of raising."""
    import io
    import logging
    import sys

    from thaw.log import get_logger, setup_logging

    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging("test")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    get_logger().info("after_the_swap")
    logging.getLogger("lib").warning("from a library")
    assert '"event": "after_the_swap"' in second.getvalue()
    assert "from a library" in second.getvalue()
