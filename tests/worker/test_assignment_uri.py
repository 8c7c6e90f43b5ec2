"""A worker loads only models inside the store prefixes its config allows: an
assignment naming any other URI is refused at its control API, before the manifest is
read or an engine launched (fakes: no process, no store)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.worker.fakes import World, agent_client, assign_body, wait_state
from thaw.config import parse_config
from thaw.objstore import S3Endpoint
from worker.__main__ import settings_from

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
ALLOWED = ("s3://thaw/models",)


@pytest.fixture
async def world_and_client(tmp_path: Path) -> AsyncIterator[tuple[World, httpx.AsyncClient, list[str]]]:
    world = World()
    manifests_read: list[str] = []

    def read_manifest(store: S3Endpoint, uri: str) -> object:
        manifests_read.append(uri)
        return {"ok": True}

    async with agent_client(world, tmp_path, secret="SK", settings={"allowed_uri_prefixes": ALLOWED},
                            manifest_reader=read_manifest) as c:
        yield world, c, manifests_read


@pytest.mark.parametrize(
    "uri",
    [
        "s3://other-bucket/models/demo",  # another bucket
        "s3://thaw/models-evil/demo",  # a sibling whose name starts like the prefix
        "s3://thaw/secrets/demo",
        "s3://thaw/",
    ],
)
async def test_an_assignment_outside_the_allowed_prefixes_is_403(
    world_and_client: tuple[World, httpx.AsyncClient, list[str]], uri: str
) -> None:
    world, client, manifests_read = world_and_client
    await wait_state(client, "standby")
    r = await client.post("/assign", json=assign_body(uri=uri))
    assert r.status_code == 403, r.text
    assert r.json()["error"] == (f"refusing the assignment: model uri {uri!r} is outside the allowed prefixes "
                                 "['s3://thaw/models'] (object_store.allowed_prefixes)")
    # Nothing was read or launched; the worker still stands by.
    assert manifests_read == [] and not any(h.launches for h in world.hosts)
    assert (await client.get("/state")).json()["state"] == "standby"


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("s3://thaw/models/../secrets", "'..' segment"),
        ("s3://thaw/models/./demo", "'.' segment"),
        ("s3://thaw/models//demo", "empty segment"),
        ("s3://thaw/models/%2e%2e/secrets", "holds '%'"),
        ("s3://thaw/models\\..\\secrets", "holds '\\\\'"),
        ("file:///etc/passwd", "file:// is refused"),
        ("http://169.254.169.254/latest/meta-data/", "http:// is refused"),
        ("gs://thaw/models/demo", "gs:// is refused"),
    ],
)
async def test_an_assignment_uri_that_could_escape_is_422(
    world_and_client: tuple[World, httpx.AsyncClient, list[str]], uri: str, why: str
) -> None:
    world, client, manifests_read = world_and_client
    await wait_state(client, "standby")
    r = await client.post("/assign", json=assign_body(uri=uri))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith("invalid request body: uri: ") and why in r.json()["error"]
    assert manifests_read == [] and not any(h.launches for h in world.hosts)


async def test_an_assignment_inside_the_allowed_prefixes_loads(
    world_and_client: tuple[World, httpx.AsyncClient, list[str]],
) -> None:
    _, client, manifests_read = world_and_client
    await wait_state(client, "standby")
    r = await client.post("/assign", json=assign_body(uri="s3://thaw/models/org/demo/"))
    assert r.status_code == 202, r.text
    await wait_state(client, "ready")
    assert manifests_read == ["s3://thaw/models/org/demo/"]


def test_thaw_worker_takes_the_allowed_prefixes_from_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THAW_CLUSTER_TOKEN", "t")
    data = yaml.safe_load(EXAMPLE.read_text())
    data["object_store"]["allowed_prefixes"] = ["s3://thaw/models"]
    cfg = parse_config(data)
    args = argparse.Namespace(host="127.0.0.1", advertise_host=None, shape=cfg.shapes[0].name, instance_id="i-1",
                              worker_id=None, port=8200, data_dir=None, host_cache_dir=None, log_level=None,
                              controller=None, exit_when_orphaned_s=None)
    assert settings_from(args, cfg).allowed_uri_prefixes == ("s3://thaw/models",)
