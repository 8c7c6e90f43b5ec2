"""The console's page and its reads over the controller's API (drawn in a real browser:
test_console_browser.py)."""

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


async def test_the_page_needs_no_token_and_its_reads_take_an_admin_key(provider: InProcessProvider,
                                                                     tmp_path: Path) -> None:
    port = int(provider.controller_url.rsplit(":", 1)[1])
    async with controller(fleet_config(), provider, port, state_dir=tmp_path / "ctl",
                          store_reader=FakeStoreReader()) as c, httpx.AsyncClient(base_url=c.url, timeout=5) as http:
        await until("adopted", lambda: c.manager.adopted, c.manager)
        page = await http.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/console/console.js">' in page.text and "default-src 'self'" in \
            page.headers["content-security-policy"]
        for path, kind in (("/console/console.js", "text/javascript"), ("/console/console.css", "text/css")):
            r = await http.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and r.text
        # Its reads: 401 without a token; the cluster token, or an operator's admin key.
        assert (await http.get("/v1/state")).status_code == 401
        cluster = {"Authorization": f"Bearer {TOKEN}", "X-Thaw-Actor": "ops@test"}
        key = (await http.post("/v1/keys/admin", json={"label": "console"}, headers=cluster)).json()["key"]
        for auth in (cluster, {"Authorization": f"Bearer {key}"}):
            state = await http.get("/v1/state", headers=auth)
            assert state.status_code == 200 and {"models", "shapes", "workers"} <= set(state.json())
            assert (await http.get("/v1/events", headers=auth)).status_code == 200
        # The page's files are not in the API's document (the fuzzers read it).
        assert not any(p.startswith("/console") for p in (await http.get("/openapi.json", headers=cluster)).json()[
            "paths"])
