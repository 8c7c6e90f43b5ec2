"""The console in a real browser (headless Chromium): it draws a running controller's
models, pools, workers and decisions, and says so when the controller goes away. The
screenshot is left in the test's directory (and printed)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.headless_browser import chromium, wait_for
from tests.warm_pool.in_process import TOKEN, InProcessProvider, controller, fleet_config, until
from thaw.wire import ColdStartRecord

pytestmark = pytest.mark.integration

STATUS = "document.getElementById('status')"


async def test_the_console_draws_the_fleet_and_says_when_the_controller_is_gone(
        provider: InProcessProvider, tmp_path: Path) -> None:
    port = int(provider.controller_url.rsplit(":", 1)[1])
    async with chromium(tmp_path) as page:
        assert page is not None, "Chromium is not installed (apt-get install chromium; scripts/bootstrap.sh does)"
        async with controller(fleet_config(idle_grace_s=300), provider, port) as c:
            m = c.manager
            await until("a standby", lambda: any(w.state.value == "standby" for w in m.status().workers), m)
            m.traffic.demand("demo")
            await until("demo served", lambda: any(r.replicas.get("ready") for r in m.status().models), m)
            # Its cold start as an activator reports it (POST /v1/cold_starts).
            phases = {"queued": 0.01, "instance_acquired": 0.02, "snapshot_restored": 0.0, "weights_loaded": 0.4,
                      "engine_ready": 1.1, "first_token": 0.05}
            async with httpx.AsyncClient(timeout=5) as http:
                r = await http.post(f"{c.url}/v1/cold_starts", headers={"Authorization": f"Bearer {TOKEN}"},
                                    json=ColdStartRecord(model="demo", request_id="r1", at=time.time(),
                                                         total_s=sum(phases.values()), phases_s=phases,
                                                         tier="s3").model_dump())
                assert r.status_code == 204, r.text
            await page.open(f"{c.url}/console#token={TOKEN}")
            await wait_for(page, "the page live", f"{STATUS}.dataset.state === 'live'")
            models = await wait_for(page, "demo's row", "document.querySelector('#models tbody').innerText")
            assert "demo" in models and "ready" in models and "weights_loaded 0.40" in models and "s3" in models
            pools = await page.eval("document.querySelector('#pools tbody').innerText")
            assert "cpu-local" in pools and "1-1" in pools  # the standby band
            workers = await page.eval("document.querySelector('#workers tbody').innerText")
            assert "ready" in workers
            decisions = await wait_for(page, "the decisions", "document.querySelector('#events tbody').innerText")
            assert "assign" in decisions
            # The token left the address once taken.
            assert await page.eval("location.hash") == ""
            shot = tmp_path / "console.png"
            await page.screenshot(shot)
            assert shot.stat().st_size > 10_000
            print(f"\nconsole screenshot: {shot}")
        # The controller is gone: the page says so and keeps what it last drew.
        said = await wait_for(page, "the error state",
                              f"{STATUS}.dataset.state === 'error' && {STATUS}.textContent")
        assert said == "the controller does not answer"
        assert "demo" in await page.eval("document.querySelector('#models tbody').innerText")
        await page.screenshot(tmp_path / "console-controller-gone.png")
