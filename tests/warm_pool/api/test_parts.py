"""What the controller's routes take by dependency (warm_pool.api.parts): who asked, as
the decision log records it."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request

from tests.warm_pool.in_process import TOKEN, registry_config
from warm_pool.api.parts import actor_of
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl


def request(headers: dict[str, str], client: tuple[str, int] | None = ("10.0.0.7", 4000)) -> Request:
    return Request({"type": "http", "method": "PUT", "path": "/v1/pool/budget", "client": client,
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})


async def test_the_actor_names_the_operator_their_admin_key_and_address(tmp_path: Path) -> None:
    parts = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path).parts
    assert actor_of(request({"x-thaw-actor": "alice"}), parts) == "alice (10.0.0.7)"
    assert actor_of(request({}, client=None), parts) == "unknown (?)"
    made = await parts.key_admin.add_admin("ci", "ops")
    who = actor_of(request({"x-thaw-actor": "bob", "authorization": f"Bearer {made.key}"}), parts)
    assert who == f"bob with admin key {made.row.prefix}… (ci) (10.0.0.7)"
