"""The controller's Batches API over HTTP (warm_pool.batch.api), as activators call it:
a batch over the tenant's own batch file only, another tenant's batch a 404, lines
leased and answered once, a cancel."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from tests.conftest import BUCKET
from tests.warm_pool.in_process import TOKEN, InProcessProvider, controller, fleet_config, until
from thaw.config import parse_config
from thaw.objstore import S3Endpoint
from thaw.wire import BatchEndpoint, NewFile

CHAT: BatchEndpoint = "/v1/chat/completions"


async def test_batches_over_the_controllers_api(provider: InProcessProvider, s3: S3Endpoint, s3_prefix: str,
                                                tmp_path: Path) -> None:
    data = fleet_config().model_dump(mode="json", exclude_none=True)
    data["object_store"].update({"bucket": BUCKET, "allowed_prefixes": [f"s3://{BUCKET}/"]})
    for model in data["models"]:
        model["uri"] = model["uri"].replace("s3://thaw/", f"s3://{BUCKET}/")
    cfg = parse_config(data)
    port = int(provider.controller_url.rsplit(":", 1)[1])
    key = s3_prefix.split("/", 3)[3] + "/in.jsonl"
    served = cfg.models[0].resolved_served_name
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT,
                         "body": {"model": served, "messages": []}}) for i in (1, 2)]
    s3.client().put_object(Bucket=BUCKET, Key=key, Body="\n".join(lines).encode())
    async with controller(cfg, provider, port, state_dir=tmp_path / "ctl", store_client=s3.client) as c, \
            httpx.AsyncClient(base_url=c.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5) as http:
        m = c.manager
        tenant = cfg.tenants[0].name
        m.parts.files.add(NewFile(id="file-input0001", tenant=tenant, filename="in.jsonl", purpose="batch", bytes=10,
                                  lines=2, key=key), 1.0)
        new = {"tenant": tenant, "input_file_id": "file-input0001", "endpoint": CHAT, "metadata": {"job": "x"}}
        missing = await http.post("/v1/batches", json={**new, "input_file_id": "file-nothere0"})
        assert missing.status_code == 400 and "No such File object" in missing.json()["error"]
        other = await http.post("/v1/batches", json={**new, "tenant": "someone-else"})
        assert other.status_code == 400
        assert (await http.post("/v1/batches", json={**new, "completion_window": "1h"})).status_code == 422
        made = await http.post("/v1/batches", json=new)
        assert made.status_code == 201, made.text
        batch_id = made.json()["id"]
        assert made.json()["status"] == "validating" and batch_id.startswith("batch_")

        async def status() -> str:
            r = await http.get(f"/v1/batches/{batch_id}", params={"tenant": tenant})
            return str(r.json()["status"])

        await until("validated", lambda: m.parts.batches.get(tenant, batch_id).status == "in_progress", m)  # type: ignore[union-attr]
        assert (await http.get(f"/v1/batches/{batch_id}", params={"tenant": "someone-else"})).status_code == 404
        listed = (await http.get("/v1/batches", params={"tenant": tenant})).json()
        assert [b["id"] for b in listed["data"]] == [batch_id] and not listed["has_more"]

        leased = (await http.post("/v1/batch-lines/lease", json={"owner": "act-a", "models": [cfg.models[0].name],
                                                                  "n": 1})).json()["lines"]
        assert [x["custom_id"] for x in leased] == ["r1"]
        answer = {"response": {"status_code": 200, "request_id": "q", "body": {}}}
        first = await http.post(f"/v1/batch-lines/{batch_id}/1/result", json=answer)
        assert first.json() == {"kept": True}
        # Sent again (its reply was lost): still the kept one; another run's answer is not.
        again = await http.post(f"/v1/batch-lines/{batch_id}/1/result", json=answer)
        assert again.json() == {"kept": True}
        other_run = {"response": {**answer["response"], "request_id": "q2"}}
        assert (await http.post(f"/v1/batch-lines/{batch_id}/1/result", json=other_run)).json() == {"kept": False}
        both = await http.post(f"/v1/batch-lines/{batch_id}/1/result", json={**answer, "error": {"code": "x"}})
        assert both.status_code == 422

        # The operators' view: every tenant's, by status; `thaw batches` over it.
        every = (await http.get("/v1/admin/batches", params={"status": "in_progress"})).json()
        assert [b["id"] for b in every["data"]] == [batch_id] and every["data"][0]["tenant"] == tenant
        assert (await http.get("/v1/admin/batches", params={"status": "completed"})).json()["data"] == []
        assert (await http.get("/v1/admin/batches/batch_nope")).status_code == 404
        cfg_path = tmp_path / "thaw.yaml"
        cfg_path.write_text(yaml.safe_dump(data))

        def thaw(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "thaw.cli.main", "batches", *argv, "--config", str(cfg_path),
                                   "--controller", c.url], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "THAW_CLUSTER_TOKEN": TOKEN})

        listed_cli = await asyncio.to_thread(thaw, "ls")
        assert listed_cli.returncode == 0, listed_cli.stderr
        assert batch_id in listed_cli.stdout and "in_progress" in listed_cli.stdout and "1/2" in listed_cli.stdout
        shown = await asyncio.to_thread(thaw, "show", batch_id)
        assert "lines: 2, answered 1, failed 0" in shown.stdout and "file-input0001" in shown.stdout
        missing_cli = await asyncio.to_thread(thaw, "show", "batch_nope")
        assert missing_cli.returncode != 0 and "no batch" in missing_cli.stderr

        cancelled = await http.post(f"/v1/batches/{batch_id}/cancel", params={"tenant": tenant})
        assert cancelled.json()["status"] == "cancelling"
        await until("cancelled", lambda: m.parts.batches.get(tenant, batch_id).status == "cancelled", m)  # type: ignore[union-attr]
        assert await status() == "cancelled"
        assert (await http.post("/v1/batches/batch_nope/cancel", params={"tenant": tenant})).status_code == 404
        second = (await http.post("/v1/batches", json=new)).json()["id"]
        by_operator = await asyncio.to_thread(thaw, "cancel", second)
        assert by_operator.returncode == 0 and by_operator.stdout.strip() == f"{second}: cancelling"
        await until("cancelled by the operator",
                    lambda: m.parts.batches.get(tenant, second).status == "cancelled", m)  # type: ignore[union-attr]
