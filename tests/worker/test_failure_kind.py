"""A failure's kind comes from the types of the exceptions behind it, never from their
text (``worker.launch.failure_kind``), and reaches the worker's status."""

from __future__ import annotations

from pathlib import Path

import botocore.exceptions
import pytest

from tests.worker.fakes import World, agent_client, assign_body, wait_state
from weight_streaming.s3_loader import ChecksumMismatch, S3Object
from weight_streaming.s3_source import S3NotFound
from weight_streaming.safetensors_header import MalformedSafetensors
from worker.launch import failure_kind


def wrapped(inner: BaseException) -> BaseException:
    """``inner`` as vLLM raises it: inside an exception of its own."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise RuntimeError("Engine core initialization failed") from exc
    except RuntimeError as outer:
        return outer


class OutOfMemoryError(RuntimeError):
    """torch's has this name (torch is not imported by the classifier)."""


@pytest.mark.parametrize(("exc", "kind"), [
    (ChecksumMismatch("sha256 differs", S3Object("b", "k", 1, "e"), None), "weights_integrity"),
    (MalformedSafetensors("bad header"), "weights_integrity"),
    (S3NotFound("NoSuchKey", code="NoSuchKey"), "store"),
    (botocore.exceptions.EndpointConnectionError(endpoint_url="http://store"), "store"),
    (MemoryError(), "memory"),
    (OutOfMemoryError("CUDA out of memory"), "memory"),
    # Text alone says nothing: a ValueError that mentions a checksum is the engine's.
    (ValueError("sha256 does not match the manifest; out of memory"), "engine"),
])
def test_the_kind_is_the_type_in_the_chain(exc: BaseException, kind: str) -> None:
    assert failure_kind(exc) == kind
    assert failure_kind(wrapped(exc)) == kind


async def test_a_store_failure_is_shown_with_its_kind(tmp_path: Path) -> None:
    def manifest(store: object, uri: str) -> object:
        raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://store")

    async with agent_client(World(manifest=manifest), tmp_path) as c:
        await wait_state(c, "standby")
        await c.post("/assign", json=assign_body())
        st = await wait_state(c, "failed")
        assert st["failure_kind"] == "store" and "cannot read the model's manifest" in st["error"]
        await c.post("/release", json={})
        st = await wait_state(c, "standby")
        assert st["failure_kind"] is None and st["error"] is None


async def test_an_engine_failure_carries_the_kind_its_host_reported(tmp_path: Path) -> None:
    world = World(on_launch="fail")
    async with agent_client(world, tmp_path) as c:
        await wait_state(c, "standby")
        await c.post("/assign", json=assign_body())
        st = await wait_state(c, "failed")
        assert st["failure_kind"] == "engine"  # the fake's "failed" event names no kind
