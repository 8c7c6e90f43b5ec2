"""Schema fuzzing of the activator's OpenAI API (activator.app) with schemathesis: the
real activator on loopback, routed by a fake controller's route feed to a fake engine
(tests/activator/fake_engine.py), so that valid requests get their 200 (streamed too).
No 5xx; every answer as /openapi.json documents it, each error in OpenAI's shape. A
tenant's key is the bearer; schemathesis also sends some cases without it or with a
wrong one (its ignored_auth check). See tests/fuzz/support.py for the number of examples
(THAW_FUZZ_EXAMPLES)."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest
import schemathesis
import yaml
from fastapi import FastAPI
from schemathesis import Case

from activator.app import create_app
from tests.activator.fake_engine import FakeEngine
from tests.activator.support import EXAMPLE, KEY, LIMITED_KEY, controller_stand_in, replica
from tests.fuzz.support import fuzz_config, running
from tests.waiting import until
from tests.warm_pool.in_process import serve
from tests.warm_pool.moto_ec2 import CREDS, REGION, moto_server
from thaw.config import Server, ThawConfig, hash_api_key, parse_config
from thaw.embedded_store import free_port
from thaw.wire import RouteTable
from warm_pool.db import Db

MODELS = ("thaw-demo", "other")


def config(root: Path) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(root)
    demo = data["models"][0]
    # A cold request (none here: both models are routed) would not hold a case for long.
    demo["autoscaling"].update({"activation_timeout_s": 1, "max_queue_length": 100})
    other = copy.deepcopy(demo)
    other.update({"name": "other", "served_name": "other", "uri": "s3://thaw/models/other"})
    data["models"].append(other)
    data["ledger"]["ship"] = False
    data["tenants"] = [
        {"name": "all", "api_key_hashes": [hash_api_key(KEY)], "allowed_models": ["*"]},
        {"name": "limited", "api_key_hashes": [hash_api_key(LIMITED_KEY)], "allowed_models": ["other"]},
    ]
    if "failed_auth" in Server.model_fields:
        # schemathesis sends many keyless cases from one address: 401 each, never 429.
        data["server"]["failed_auth"] = {"burst": 1_000_000}
    return parse_config(data)


def route_feed(engine_url: str) -> FastAPI:
    """A controller as the activator sees it: one route table, both models on the engine;
    the real Files and Batches APIs (an in-memory database; its batches fail validation:
    this controller has no store)."""
    entry = {"served_name": "thaw-demo", "replicas": [replica(engine_url)]}
    table = RouteTable.model_validate({"epoch": "fuzz", "version": 1, "models": {
        "demo": entry, "other": {**entry, "served_name": "other"}}})
    return controller_stand_in(table, Db.sqlite(None))


def openapi() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="thaw-fuzz-") as root:
        app = create_app(config(Path(root)), "http://127.0.0.1:9", activator_id="fuzz")
        try:
            return app.openapi()
        finally:
            app.state.ledger.close()


# /v1/usage's since/until take epoch seconds, an ISO time or a duration (15m): a string
# the schema cannot narrow, so a schema-valid one may be refused with 400.
# The completion routes document the fields the activator reads, loosely typed (the
# engine checks the rest): a schema-valid body the engine would refuse (n: 3.5) is 400.
OPERATIONS = [{"include-path": "/v1/usage",
               "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401"]}}},
              {"include-path-regex": "completions$",
               "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401", "404", "429"]}}}]
# The Files, Batches, Responses and Conversations APIs read their bodies themselves (a
# multipart upload; JSON checked further than its schema says: a batch's input file must
# exist, input items must be well formed, a previous response stored): a schema-valid
# body may be a 400 (or a 404 for a model the tenant may not use, or an unknown id).
OPERATIONS += [{"include-name": name,
                "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401", "404", "413"]}}}
               for name in ("POST /v1/files", "POST /v1/batches", "POST /v1/responses", "POST /v1/conversations",
                            "POST /v1/conversations/{conversation_id}",
                            "POST /v1/conversations/{conversation_id}/items")]
schema = schemathesis.openapi.from_dict(openapi(), config=fuzz_config("apiKey", KEY, operations=OPERATIONS))


@asynccontextmanager
async def activator(root: Path, store_url: str) -> AsyncIterator[str]:
    engine_port, feed_port, port = free_port(), free_port(), free_port()
    started = [await serve(FakeEngine("fuzz").app, engine_port),
               await serve(route_feed(f"http://127.0.0.1:{engine_port}"), feed_port)]
    # The Files API's store: moto's S3 on loopback, with the config's bucket.
    store = boto3.client("s3", region_name=REGION, endpoint_url=store_url, **CREDS)
    store.create_bucket(Bucket="thaw")
    app = create_app(config(root), f"http://127.0.0.1:{feed_port}", activator_id="fuzz", files_client=store)
    started.append(await serve(app, port))
    try:
        await until("the activator's first route table", lambda: app.state.routes.feed.version >= 1)
        yield f"http://127.0.0.1:{port}"
    finally:
        for server, task in reversed(started):
            server.should_exit = True
            await task


@pytest.fixture(scope="module")
def activator_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="thaw-fuzz-") as root, moto_server() as store_url, \
            running(lambda: activator(Path(root), store_url)) as url:
        yield url


def aim(case: Case) -> None:
    """Most cases name a model that exists (random names would all be 404s): a served
    name in the body, and in the path of the /m/{model}/ routes."""
    pick = MODELS[hash(repr(case.body)) % 2] if isinstance(case.body, dict) else MODELS[0]
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str) and len(case.body["model"]) % 4:
        case.body["model"] = pick
    if case.path_parameters and isinstance(case.path_parameters.get("model"), str) \
            and len(case.path_parameters["model"]) % 4:
        case.path_parameters["model"] = pick


@schema.parametrize()
def test_activator_api(case: Case, activator_url: str) -> None:
    aim(case)
    response = case.call_and_validate(base_url=activator_url, timeout=30)
    if response.status_code >= 400 and case.path not in ("/healthz", "/metrics"):
        err = response.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, response.text
        assert isinstance(err["message"], str) and err["message"], response.text
