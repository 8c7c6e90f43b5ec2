"""Fixtures for the warm-pool tests: moto's EC2 server (see moto_ec2.py), and the
controller's state database on each backend (a real PostgreSQL: tests/postgres_server.py).

Every store test takes its database the same way: ``state_db`` (SQLite and PostgreSQL,
a fresh database each test), or ``postgres_url`` where only PostgreSQL will do."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import boto3
import pytest

from tests.warm_pool.in_process import InProcessProvider
from tests.warm_pool.moto_ec2 import CREDS, REGION, Aws, moto_server
from thaw.embedded_store import free_port
from warm_pool.db import Db

_seq = itertools.count()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """One moto server on loopback for the module (it starts in about a second)."""
    with moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def ami(moto_url: str) -> str:
    """One of moto's default AMIs (listing them all takes ~2 s, so once)."""
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url, **CREDS)
    return str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


@pytest.fixture
def aws(moto_url: str, ami: str) -> Aws:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url, **CREDS)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24")["Subnet"]["SubnetId"] for i in (1, 2)]
    n = next(_seq)
    name = f"thaw-test-{n}-{time.time_ns()}"
    lt = ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": ami, "InstanceType": "t3.micro"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    return Aws(moto_url, ec2, subnets, lt, name, f"test-{n}-{time.time_ns() % 10**9}")


# A connection to one state database each call: a second call is a restarted
# controller, or a second controller, on the same state.
StateDb = Callable[[], Db]



@pytest.fixture(params=["sqlite", "postgres"])
def state_db(request: pytest.FixtureRequest, tmp_path: Path) -> StateDb:
    """The same store tests on SQLite and on PostgreSQL, each on an empty database."""
    if request.param == "sqlite":
        path = tmp_path / "registry.db"  # its name under data_dir/controller/
        return lambda: Db.sqlite(path)
    url = request.getfixturevalue("postgres_url")
    return lambda: Db.postgres(url)


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[InProcessProvider]:
    """Worker agents in this process (fake engines), for a controller on its port."""
    p = InProcessProvider(tmp_path, f"http://127.0.0.1:{free_port()}")
    try:
        yield p
    finally:
        await p.shutdown()

