"""moto's EC2 in server mode on loopback, and what one test sets up in it (shared by the
provider's and the controller's EC2 tests; the fixtures are in conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import aioboto3
from aiobotocore.awsrequest import AioAWSResponse

from tests.waiting import wait_until
from thaw.config import Ec2Pool
from thaw.embedded_store import free_port
from warm_pool.providers.ec2 import Ec2Provider

REGION = "us-east-1"
CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
TOKEN_PARAM = "/thaw/test/token"


@contextmanager
def moto_server(*, enforce_iam: bool = False) -> Iterator[str]:
    """A moto server on loopback, stopped on the way out (it starts in about a second).
    ``enforce_iam``: every caller but the account's own keys (:data:`CREDS`) is held to its
    IAM user's policies (``tests.aws_iam``)."""
    port = free_port()
    argv = ["-m", "tests.aws_iam", str(port)] if enforce_iam else ["-m", "moto.server", "-H", "127.0.0.1",
                                                                    "-p", str(port)]
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=None if enforce_iam else subprocess.DEVNULL,
                            cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}"
    try:
        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    return True
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"moto server exited with {proc.returncode}") from None
                return False

        wait_until("the moto server to answer", answers, 30, 0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Aws:
    """What one test set up in moto, and a plain boto3 client to check with."""

    url: str
    ec2: Any
    subnets: list[str]
    launch_template: str
    launch_template_name: str
    cluster: str

    def pool(self, **overrides: Any) -> Ec2Pool:
        fields: dict[str, Any] = {
            "region": REGION, "launch_template": self.launch_template, "subnets": self.subnets,
            "instance_types": ["g5.xlarge", "g5.2xlarge"], "endpoint_url": self.url,
        }
        return Ec2Pool(**{**fields, **overrides})

    def provider(self, pool: Ec2Pool | None = None, **kwargs: Any) -> Ec2Provider:
        return Ec2Provider(
            cluster=self.cluster, pools={"gpu": pool or self.pool()},
            controller_url="http://controller.internal:8100",
            session=aioboto3.Session(region_name=REGION, **CREDS), **{"token_ssm_parameter": TOKEN_PARAM, **kwargs},
        )

    def described(self, worker_id: str | None = None) -> list[dict[str, Any]]:
        """This cluster's instances (any state; one worker id's if given), as boto3 sees them."""
        filters = [{"Name": "tag:thaw:cluster", "Values": [self.cluster]}]
        if worker_id is not None:
            filters.append({"Name": "tag:thaw:worker-id", "Values": [worker_id]})
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self) -> bytes:
        return self._data


@dataclass
class NoCapacity:
    """Answers RunInstances for chosen (subnet, instance type, market) as EC2 does when it
    has no capacity (HTTP 500, InsufficientInstanceCapacity) instead of sending it to
    moto, so botocore's parsing and retry logic see a real error response. Records every
    request that reached the wire, retries included."""

    fails: Callable[[str, str, str], bool]
    attempts: list[tuple[str, str, str]] = field(default_factory=list)

    def register(self, client: Any) -> None:
        client.meta.events.register("before-send.ec2.RunInstances", self._handle)

    def _handle(self, request: Any, **_: Any) -> AioAWSResponse | None:
        body = request.body.decode() if isinstance(request.body, bytes) else request.body
        params = dict(parse_qsl(body))
        attempt = (params["SubnetId"], params["InstanceType"],
                   params.get("InstanceMarketOptions.MarketType", "on-demand"))
        self.attempts.append(attempt)
        if not self.fails(*attempt):
            return None
        xml = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error>"
               "<Code>InsufficientInstanceCapacity</Code>"
               f"<Message>We currently do not have sufficient {attempt[1]} capacity.</Message>"
               "</Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>")
        return AioAWSResponse(request.url, 500, {"content-type": "text/xml;charset=UTF-8"}, _Body(xml.encode()))
