"""Admin keys over the controller's API: made and revoked with the cluster token only,
they open the model and tenant API (/v1/admin/) and the console's reads and nothing
else, and the audit events name the key that made a change."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.warm_pool.in_process import (
    TOKEN,
    FakeStoreReader,
    InProcessProvider,
    controller,
    fleet_config,
    until,
)


async def test_an_admin_key_opens_the_admin_api_only_until_revoked(provider: InProcessProvider,
                                                                   tmp_path: Path) -> None:
    port = int(provider.controller_url.rsplit(":", 1)[1])
    async with controller(fleet_config(), provider, port, state_dir=tmp_path / "ctl",
                          store_reader=FakeStoreReader()) as c, httpx.AsyncClient(base_url=c.url, timeout=5) as http:
        m = c.manager
        await until("adopted", lambda: m.adopted, m)
        cluster = {"Authorization": f"Bearer {TOKEN}", "X-Thaw-Actor": "ops@test"}
        r = await http.post("/v1/keys/admin", json={"label": "ci"}, headers=cluster)
        assert r.status_code == 201, r.text
        key, prefix = r.json()["key"], r.json()["row"]["prefix"]
        admin = {"Authorization": f"Bearer {key}", "X-Thaw-Actor": "ci@runner"}

        assert (await http.get("/v1/admin/models", headers=admin)).status_code == 200
        body = {"name": "second", "spec": {"uri": "s3://thaw/models/second", "shape": "cpu-local"}}
        r = await http.post("/v1/admin/models", json=body, headers=admin)
        assert r.status_code == 201, r.text
        assert f"with admin key {prefix}… (ci)" in r.json()["revisions"][0]["who"]
        # Nothing outside /v1/admin/ but the console's reads (the pool's state, its
        # decisions): not a change to the pool, the tenants' keys, nor other admin keys.
        assert (await http.get("/v1/state", headers=admin)).status_code == 200
        for method, path in (("PUT", "/v1/pool/budget"), ("GET", "/v1/keys"), ("POST", "/v1/keys/admin"),
                             ("GET", "/v1/keys/admin"), ("GET", "/v1/routes")):
            assert (await http.request(method, path, headers=admin, json={})).status_code == 401, path
        listed = (await http.get("/v1/keys/admin", headers=cluster)).json()["keys"]
        assert [(k["prefix"], k["label"], k["revoked_at"]) for k in listed] == [(prefix, "ci", None)]
        assert "hash" in listed[0] and "key" not in listed[0]

        r = await http.post("/v1/keys/admin/revoke", json={"key": prefix}, headers=cluster)
        assert r.status_code == 200 and r.json()["revoked"] == 1
        assert (await http.get("/v1/admin/models", headers=admin)).status_code == 401
        assert (await http.post("/v1/keys/admin/revoke", json={"key": prefix}, headers=cluster)).status_code == 404
        assert [e.outcome for e in m.parts.event_log.events if e.kind == "admin_key"] == ["added", "revoked"]
