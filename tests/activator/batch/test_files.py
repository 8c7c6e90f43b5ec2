"""The Files API end to end, without engines: the official openai client against a real
activator (its app on a loopback port) that keeps the bytes in the store (SeaweedFS) and
the index at a real controller (its app and manager, on the state database).

Uploaded, listed (paged, in both orders), read and deleted as OpenAI's client expects;
another tenant's file is a 404 exactly as an unknown one; bad uploads get clear 400/413
answers and leave nothing behind; an upload the controller cannot index is refused and
its bytes removed."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from activator.app import create_app
from activator.batch.files import count_lines
from activator.errors import PayloadTooLarge
from tests.activator.support import KEY, LIMITED_KEY, assert_openai_error, make_config
from tests.conftest import BUCKET
from tests.warm_pool.in_process import TOKEN, InProcessProvider, controller, serve
from thaw.config import ThawConfig, parse_config
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint

pytestmark = pytest.mark.integration

LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n' * 3


@dataclass
class Api:
    url: str
    s3: S3Endpoint
    prefix: str
    controller: Any

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def stored(self) -> list[str]:
        page = self.s3.client().list_objects_v2(Bucket=BUCKET, Prefix=self.prefix)
        return sorted(o["Key"] for o in page.get("Contents", []))


def config(tmp: Path, prefix: str, **batch: Any) -> ThawConfig:
    """The activator tests' config in the test store's bucket, with no standby (nothing
    here needs a worker)."""
    data = make_config(tmp / "act").model_dump(mode="json", exclude_none=True)
    data["object_store"].update({"bucket": BUCKET, "allowed_prefixes": [f"s3://{BUCKET}/"]})
    for m in data["models"]:
        m["uri"] = m["uri"].replace("s3://thaw/", f"s3://{BUCKET}/")
    for p in data["pools"]:
        p.update({"standby_min": 0, "standby_max": 0})
    data["batch"] = {"files_prefix": prefix, **batch}
    return parse_config(data)


@asynccontextmanager
async def files_api(tmp: Path, s3: S3Endpoint, **batch: Any) -> AsyncIterator[Api]:
    prefix = f"files-{tmp.name}/"
    cfg = config(tmp, prefix, **batch)
    port = free_port()
    provider = InProcessProvider(tmp / "workers", f"http://127.0.0.1:{port}")
    try:
        async with controller(cfg, provider, port, state_dir=tmp / "ctl") as ctl:
            app = create_app(cfg, ctl.url, activator_id="files", token=TOKEN, files_client=s3.client())
            act_port = free_port()
            server, task = await serve(app, act_port)
            try:
                yield Api(f"http://127.0.0.1:{act_port}", s3, prefix, ctl)
            finally:
                server.should_exit = True
                await task
    finally:
        await provider.shutdown()


def test_lines_and_bytes_are_counted_and_bounded() -> None:
    assert count_lines(io.BytesIO(b"a\nb\n"), 100) == (4, 2)
    assert count_lines(io.BytesIO(b"a\nb"), 100) == (3, 2)  # a last line without a newline counts
    assert count_lines(io.BytesIO(b""), 100) == (0, 0)
    with pytest.raises(PayloadTooLarge):
        count_lines(io.BytesIO(b"x" * 101), 100)


async def test_upload_list_read_and_delete_with_the_openai_client(s3: S3Endpoint, tmp_path: Path) -> None:
    async with files_api(tmp_path, s3) as api:
        def scenario() -> None:
            client = api.client()
            made = [client.files.create(file=(f"in{i}.jsonl", LINES), purpose="batch") for i in range(3)]
            first = made[0]
            assert first.object == "file" and first.purpose == "batch" and first.status == "processed"
            assert first.bytes == len(LINES) and first.filename == "in0.jsonl" and first.id.startswith("file-")
            assert client.files.retrieve(first.id) == first
            assert client.files.content(first.id).read() == LINES
            # Newest first, paged by the client itself (after = the last id of a page).
            listed = [f.id for f in client.files.list(limit=2)]
            assert listed == [f.id for f in reversed(made)]
            page = client.files.list(limit=2, order="asc")
            assert [f.id for f in page.data] == [made[0].id, made[1].id] and page.has_more
            assert [f.id for f in client.files.list(purpose="batch_output")] == []

            # Another tenant: none of it exists.
            other = api.client(LIMITED_KEY)
            assert [f.id for f in other.files.list()] == []
            for call in (lambda: other.files.retrieve(first.id), lambda: other.files.content(first.id),
                         lambda: other.files.delete(first.id)):
                with pytest.raises(openai.NotFoundError) as info:
                    call()
                assert info.value.body["message"] == f"No such File object: {first.id}"  # type: ignore[index]

            deleted = client.files.delete(first.id)
            assert deleted.deleted and deleted.id == first.id
            with pytest.raises(openai.NotFoundError):
                client.files.retrieve(first.id)
            assert sorted(f.id for f in client.files.list()) == sorted(f.id for f in made[1:])
            assert api.stored() == sorted(f"{api.prefix}all/{f.id}" for f in made[1:])

        await asyncio.to_thread(scenario)


async def test_bad_uploads_are_refused_and_leave_nothing(s3: S3Endpoint, tmp_path: Path) -> None:
    async with files_api(tmp_path, s3, max_file_bytes=1000, max_file_lines=4) as api:
        async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
            async def upload(data: bytes, **form: str) -> httpx.Response:
                return await http.post("/v1/files", data=form, files={"file": ("in.jsonl", data)})

            assert_openai_error(await upload(LINES, purpose="fine-tune"), 400, param="purpose")
            assert_openai_error(await upload(LINES), 400, param="purpose")
            assert_openai_error(await http.post("/v1/files", data={"purpose": "batch"}), 400, param="file")
            assert_openai_error(await http.post("/v1/files", json={"purpose": "batch"}), 400, param="file")
            assert_openai_error(await upload(b"", purpose="batch"), 400, code="empty_file")
            assert_openai_error(await upload(b"{}\n" * 5, purpose="batch"), 400, code="too_many_lines")
            assert_openai_error(await upload(b"x" * 1001, purpose="batch"), 413, code="file_too_large")
            # Declared over the bound: refused before the body is read (a client still
            # sending may see the connection close; the answer is there to read).
            host, port = api.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode()
                         + b"\r\ncontent-type: multipart/form-data; boundary=b\r\ncontent-length: 1000000000\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), head
            writer.close()
            r = await http.post("/v1/files", content=b"--x\r\nbroken", headers={
                "content-type": "multipart/form-data; boundary=x"})
            assert r.status_code == 400, r.text
            r = await http.post("/v1/files", content=b"x", headers={"content-type": "multipart/form-data"})
            assert_openai_error(r, 400)
            for path in ("/v1/files/nope", "/v1/files/file-%3Fx%3D1", "/v1/files/nope/content"):
                err = assert_openai_error(await http.get(path), 404, param="file_id")
                assert err["message"].startswith("No such File object")
            assert_openai_error(await http.get("/v1/files", params={"limit": 0}), 400, param="limit")
            assert_openai_error(await http.get("/v1/files", params={"order": "sideways"}), 400, param="order")
            assert (await http.post("/v1/files", data={"purpose": "batch"},
                                    headers={"Authorization": "Bearer nope"})).status_code == 401
            assert api.stored() == []


async def test_an_upload_the_controller_cannot_index_is_not_kept(s3: S3Endpoint, tmp_path: Path) -> None:
    async with files_api(tmp_path, s3) as api:
        await api.controller.stop()
        async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=30) as http:
            r = await http.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", LINES)})
            err = assert_openai_error(r, 503, code="files_unavailable")
            assert "not kept" in err["message"] and r.headers["retry-after"]
        assert api.stored() == []
