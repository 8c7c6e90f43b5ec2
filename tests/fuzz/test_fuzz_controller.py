"""Schema fuzzing of the controller's API (warm_pool.api) with schemathesis: a real
controller on loopback with in-process worker agents, the cluster token as the bearer.
No 5xx, every answer as /openapi.json documents it. See tests/fuzz/support.py for the
number of examples (THAW_FUZZ_EXAMPLES)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import schemathesis
from schemathesis import Case

from tests.fuzz.support import fuzz_config, running
from tests.warm_pool.in_process import (
    TOKEN,
    FakeStoreReader,
    InProcessProvider,
    controller,
    fleet_config,
    until,
)
from thaw.config import ThawConfig, parse_config
from thaw.embedded_store import free_port
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl


def config(root: Path) -> ThawConfig:
    data = fleet_config().model_dump(mode="json")
    data["data_dir"] = str(root / "data")
    return parse_config(data)


def openapi() -> dict[str, object]:
    """The controller's /openapi.json (its routes: nothing runs)."""
    with tempfile.TemporaryDirectory(prefix="thaw-fuzz-") as root:
        manager = build_pool(config(Path(root)), {}, HttpWorkerControl(TOKEN))
        return create_pool_app(manager, TOKEN).openapi()


# The internal APIs parse with pydantic's lax mode (false reads as 0.0, "1" as 1): a
# type the schema does not allow is not always refused, so that check is off here.
CHECKS = {"negative_data_rejection": {"enabled": False}}
# A budget change's cross-field rules (a pool's field needs its shape; something must
# change) are beyond the JSON schema: a schema-valid change may be refused with 422.
OPERATIONS = [{"include-path": "/v1/pool/budget", "include-method": "PUT",
               "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "422"]}}}]
# So are a model's (the whole config must stay valid with it: its shape, base, tenant,
# allowed prefixes, served name; its weights must be complete and fit) and a tenant's
# (the models it names must be deployed; one that owns models stays).
# (Filters of one entry match any of their values: an operation is named whole.)
OPERATIONS += [{"include-name": name,
                "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "409", "422"]}}}
               for name in ("POST /v1/admin/models", "PATCH /v1/admin/models/{name}",
                            "POST /v1/admin/models/{name}/rollback", "DELETE /v1/admin/models/{name}",
                            "POST /v1/admin/tenants", "PATCH /v1/admin/tenants/{name}",
                            "DELETE /v1/admin/tenants/{name}", "POST /v1/admin/apply")]
# A batch needs its tenant's batch file to exist (400 otherwise), an answer exactly one
# of response and error (422), a file id not indexed already (409).
OPERATIONS += [{"include-name": "POST /v1/batches",
                "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401"]}}},
               {"include-name": "POST /v1/batch-lines/{batch_id}/{line}/result",
                "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "422"]}}},
               {"include-name": "POST /v1/files",
                "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "409"]}}}]
schema = schemathesis.openapi.from_dict(
    openapi(), config=fuzz_config("clusterToken", TOKEN, checks=CHECKS, operations=OPERATIONS))


@asynccontextmanager
async def fleet(root: Path) -> AsyncIterator[str]:
    port = free_port()
    provider = InProcessProvider(root, f"http://127.0.0.1:{port}")
    try:
        async with controller(config(root), provider, port, state_dir=root / "state",
                              store_reader=FakeStoreReader()) as c:
            await until("the fleet adopted", lambda: c.manager.feed.table.version > 0, c.manager)
            yield c.url
    finally:
        await provider.shutdown()


@pytest.fixture(scope="module")
def controller_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="thaw-fuzz-") as root, running(lambda: fleet(Path(root))) as url:
        yield url


@schema.parametrize()
def test_controller_api(case: Case, controller_url: str) -> None:
    case.call_and_validate(base_url=controller_url, timeout=30)
