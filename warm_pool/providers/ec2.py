"""The ``ec2`` provider: GPU instances launched from a launch template, found by tags.

Every instance carries ``thaw:cluster``, ``thaw:pool``, ``thaw:shape`` and
``thaw:worker-id`` from the moment it exists (tags are part of ``RunInstances``), so
after a controller restart ``instances()`` rebuilds the fleet from EC2 alone. The
instance boots ``infra/worker-bootstrap.sh`` from its user data; that starts
``thaw worker``, which registers with the controller by heartbeat. The cluster token
never appears in user data: the worker reads it from SSM with its instance role.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from thaw.config import Ec2Pool
from thaw.log import get_logger
from warm_pool.providers.provider import CapacityError, Instance, InstanceState

log = get_logger()

# Codes after which another subnet, instance type or market may still succeed.
CAPACITY_ERRORS = frozenset({
    "InsufficientInstanceCapacity",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
})

BOOTSTRAP_SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "worker-bootstrap.sh"

_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})

Client = Any  # an aiobotocore EC2 client (untyped)
_Endpoint = tuple[str, str | None]  # (region, endpoint_url)


def render_user_data(script: str, values: Mapping[str, str]) -> str:
    """User data for one instance: ``values`` as shell assignments, then ``script``.

    The script's own shebang stays as a comment line; ours must come first for
    cloud-init to run the whole thing as a shell script.
    """
    lines = ["#!/bin/bash", "# Set by thaw's ec2 provider for this instance."]
    lines += [f"{name}={shlex.quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n\n" + script


def client_token(cluster: str, worker_id: str, instance_type: str, subnet: str, market: str,
                 term: int | None = None) -> str:
    """``RunInstances`` idempotency token: the same call retried never starts a second
    instance on AWS. It names the decision (its worker id) and the leader's term it was
    taken in (``warm_pool.fencing``). Each fallback step gets its own token, since AWS
    rejects a token reused with different parameters."""
    parts = (cluster, worker_id, instance_type, subnet, market)
    key = "\0".join(parts if term is None else (*parts, str(term)))
    return hashlib.sha256(key.encode()).hexdigest()  # 64 hex chars, AWS's maximum


def _no_capacity_retry(response: tuple[Any, dict[str, Any]] | None = None, **_: Any) -> None:
    # EC2 answers capacity errors with HTTP 500, which botocore's standard mode retries
    # as transient (with backoff, drawing on the retry quota that throttled calls need).
    # Another subnet or instance type is the useful retry: raising here ends the call.
    if response is not None and response[1].get("Error", {}).get("Code") in CAPACITY_ERRORS:
        raise ClientError(response[1], "RunInstances")


class Ec2Provider:
    """Instances for the pools whose provider is ``ec2`` (keyed by shape)."""

    kind = "ec2"

    def __init__(
        self,
        *,
        cluster: str,
        pools: Mapping[str, Ec2Pool],
        controller_url: str,
        token_ssm_parameter: str | None,
        token_secret: str | None = None,
        session: aioboto3.Session | None = None,
        clock: Callable[[], float] = time.time,
        bootstrap_script: str | None = None,
        package: str | None = None,
        config_uri: str | None = None,
        page_size: int | None = None,
        on_client: Callable[[Client], None] | None = None,
    ) -> None:
        """``token_secret`` (a Secrets Manager secret's name or ARN) or
        ``token_ssm_parameter`` (an SSM parameter's name): where workers read the token.
        ``bootstrap_script`` defaults to ``infra/worker-bootstrap.sh`` in the source
        tree (pass it when the package is installed without it). ``package`` is the
        pip spec workers install (the script's default: ``thaw-serve[gpu]``); ``config_uri`` the
        s3:// URI of the config file they fetch (else the AMI's). ``page_size``
        sets DescribeInstances' MaxResults. ``on_client`` sees each new EC2 client
        before its first call: a hook for tests to register botocore event handlers.
        """
        if not (token_secret or token_ssm_parameter):
            raise ValueError("the ec2 provider needs cluster.token_secret (Secrets Manager) or "
                             "cluster.token_ssm_parameter (SSM): workers read the cluster token there, it is "
                             "never put in user data")
        if bootstrap_script is None:
            try:
                bootstrap_script = BOOTSTRAP_SCRIPT.read_text()
            except OSError as exc:
                raise FileNotFoundError(f"worker bootstrap script not readable at {BOOTSTRAP_SCRIPT} "
                                        f"({exc.strerror}); pass bootstrap_script") from None
        self.cluster = cluster
        self.pools = dict(pools)
        self.controller_url = controller_url
        self.token_ssm_parameter = token_ssm_parameter
        self.token_secret = token_secret
        self.bootstrap_script = bootstrap_script
        self.package = package
        self.config_uri = config_uri
        self.page_size = page_size
        self._session = session or aioboto3.Session()
        self._clock = clock
        self._on_client = on_client
        self._config = AioConfig(retries={"mode": "standard"})  # throttling: botocore retries
        self._stack = AsyncExitStack()
        self._clients: dict[_Endpoint, Client] = {}
        self._client_lock = asyncio.Lock()
        self._where: dict[str, _Endpoint] = {}
        self._status: dict[str, dict[str, Any]] = {}

    async def launch(self, shape: str, worker_id: str, *, term: int | None = None) -> Instance:
        """Start one instance for ``worker_id`` (or return the one already started),
        trying subnets, then instance types, then on-demand after spot."""
        pool = self._pool(shape)
        endpoint = (pool.region, pool.endpoint_url)
        client = await self._client(endpoint)
        # Before RunInstances: moto ignores ClientToken, and a controller that died
        # between the call and its answer retries with the same worker id.
        found = await self._describe(client, [
            {"Name": "tag:thaw:worker-id", "Values": [worker_id]},
            {"Name": "instance-state-name", "Values": _LIVE_STATES},
        ])
        if found:
            instance = self._to_instance(found[0], endpoint)
            if instance is not None:
                self._record(shape, "adopted", [], None, instance.instance_id)
                log.info("ec2_launch_adopted", shape=shape, worker_id=worker_id, instance_id=instance.instance_id)
                return instance
        markets = [pool.market]
        if pool.market == "spot" and pool.spot_fallback_to_on_demand:
            markets.append("on-demand")
        tried: list[dict[str, str]] = []
        last_error = ""
        # Subnets vary fastest, then instance types, then the market.
        for market, instance_type, subnet in itertools.product(markets, pool.instance_types, pool.subnets):
            args = self._run_args(shape, pool, worker_id, instance_type, subnet, market, term)
            try:
                resp = await client.run_instances(**args)
            except ClientError as exc:
                err = exc.response.get("Error", {})
                code = str(err.get("Code", ""))
                if code not in CAPACITY_ERRORS:
                    raise
                last_error = f"{code}: {err.get('Message', '')}"
                tried.append({"instance_type": instance_type, "subnet": subnet, "market": market, "error": code})
                log.warning("ec2_capacity_fallback", shape=shape, worker_id=worker_id,
                            instance_type=instance_type, subnet=subnet, market=market, error=code)
                continue
            tried.append({"instance_type": instance_type, "subnet": subnet, "market": market, "error": ""})
            instance = self._to_instance(resp["Instances"][0], endpoint, shape, worker_id, market)
            assert instance is not None  # shape and worker id are passed in
            self._record(shape, "launched", tried, last_error or None, instance.instance_id)
            log.info("ec2_launched", shape=shape, worker_id=worker_id, instance_id=instance.instance_id,
                     instance_type=instance_type, subnet=subnet, market=market)
            return instance
        self._record(shape, "no_capacity", tried, last_error, None)
        what = ", ".join(f"{t['instance_type']}/{t['subnet']}/{t['market']}" for t in tried)
        raise CapacityError(shape, f"no EC2 capacity for shape {shape!r}; tried {what}; last error {last_error}")

    async def instances(self) -> list[Instance]:
        """Every non-terminated instance tagged with this cluster, in every region and
        endpoint the pools use."""
        out: list[Instance] = []
        for endpoint in dict.fromkeys((p.region, p.endpoint_url) for p in self.pools.values()):
            client = await self._client(endpoint)
            for raw in await self._describe(client, [{"Name": "instance-state-name", "Values": _LIVE_STATES}]):
                instance = self._to_instance(raw, endpoint)
                if instance is None:
                    log.warning("ec2_instance_untagged", instance_id=raw.get("InstanceId"), cluster=self.cluster,
                                reason="no thaw:worker-id or thaw:shape tag")
                    continue
                out.append(instance)
        return out

    async def terminate(self, instance_id: str) -> None:
        """Terminate an instance; one already gone (or never known) is not an error."""
        try:
            await self._call("terminate_instances", instance_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _NOT_FOUND:
                raise
            log.info("ec2_terminate_unknown", instance_id=instance_id)
            return
        log.info("ec2_terminated", instance_id=instance_id)

    async def stop(self, instance_id: str) -> None:
        """Stop (not terminate) an instance: its disk stays, no compute cost."""
        await self._call("stop_instances", instance_id)
        log.info("ec2_stopped", instance_id=instance_id)

    async def start(self, instance_id: str) -> None:
        """Start a stopped instance again; its worker registers as after a launch."""
        await self._call("start_instances", instance_id)
        log.info("ec2_started", instance_id=instance_id)

    async def close(self) -> None:
        """Close the EC2 clients; instances are left as they are (a restart adopts them)."""
        await self._stack.aclose()
        self._clients.clear()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per shape, the outcome of its last launch: JSON-able, for `thaw pool status`."""
        return {shape: {**s, "tried": [dict(t) for t in s["tried"]]} for shape, s in self._status.items()}

    def _pool(self, shape: str) -> Ec2Pool:
        try:
            return self.pools[shape]
        except KeyError:
            raise KeyError(f"no ec2 pool for shape {shape!r}; ec2 pools: {sorted(self.pools)}") from None

    async def _client(self, endpoint: _Endpoint) -> Client:
        async with self._client_lock:
            if endpoint not in self._clients:
                region, url = endpoint
                client = await self._stack.enter_async_context(
                    self._session.client("ec2", region_name=region, endpoint_url=url, config=self._config))
                client.meta.events.register_first("needs-retry.ec2.RunInstances", _no_capacity_retry)
                if self._on_client is not None:
                    self._on_client(client)
                self._clients[endpoint] = client
            return self._clients[endpoint]

    async def _describe(self, client: Client, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        paging = {"PageSize": self.page_size} if self.page_size else {}
        pages = client.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:thaw:cluster", "Values": [self.cluster]}, *filters],
            PaginationConfig=paging,
        )
        return [inst async for page in pages for res in page["Reservations"] for inst in res["Instances"]]

    async def _call(self, method: str, instance_id: str) -> None:
        # The endpoint the instance was seen at first; else each one, until one knows it.
        known = self._where.get(instance_id)
        endpoints: Iterable[_Endpoint] = dict.fromkeys(
            [*([known] if known else []), *((p.region, p.endpoint_url) for p in self.pools.values())])
        last: ClientError | None = None
        for endpoint in endpoints:
            client = await self._client(endpoint)
            try:
                await getattr(client, method)(InstanceIds=[instance_id])
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in _NOT_FOUND:
                    raise
                last = exc
                continue
            self._where[instance_id] = endpoint
            return
        if last is None:
            raise LookupError(f"{instance_id}: no ec2 pools configured to look for it in")
        raise last

    def _run_args(self, shape: str, pool: Ec2Pool, worker_id: str, instance_type: str, subnet: str,
                  market: str, term: int | None = None) -> dict[str, Any]:
        key = "LaunchTemplateId" if pool.launch_template.startswith("lt-") else "LaunchTemplateName"
        named = {
            "Name": f"thaw-{self.cluster}-{worker_id}",
            "thaw:cluster": self.cluster,
            "thaw:pool": shape,
            "thaw:shape": shape,
            "thaw:worker-id": worker_id,
        }
        if term is not None:
            named["thaw:term"] = str(term)  # the leader's term that decided it (warm_pool.fencing)
        tags = [{"Key": k, "Value": v} for k, v in named.items()]
        values = {
            "THAW_CONTROLLER_URL": self.controller_url,
            "THAW_CLUSTER": self.cluster,
            "THAW_SHAPE": shape,
            "THAW_WORKER_ID": worker_id,
            "THAW_WORKER_PORT": str(pool.worker_port),
        }
        if self.token_secret:
            values["THAW_TOKEN_SECRET"] = self.token_secret
        else:
            values["THAW_TOKEN_SSM_PARAMETER"] = self.token_ssm_parameter or ""
        if self.package:
            values["THAW_PACKAGE"] = self.package
        if self.config_uri:
            values["THAW_CONFIG_URI"] = self.config_uri
        args: dict[str, Any] = {
            "LaunchTemplate": {key: pool.launch_template, "Version": pool.launch_template_version},
            "InstanceType": instance_type,
            "SubnetId": subnet,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(self.cluster, worker_id, instance_type, subnet, market, term),
            "TagSpecifications": [{"ResourceType": r, "Tags": tags} for r in ("instance", "volume")],
            # botocore base64-encodes UserData for RunInstances.
            "UserData": render_user_data(self.bootstrap_script, values),
        }
        if market == "spot":
            args["InstanceMarketOptions"] = {"MarketType": "spot"}
        return args

    def _to_instance(self, raw: dict[str, Any], endpoint: _Endpoint, shape: str | None = None,
                     worker_id: str | None = None, market: str | None = None) -> Instance | None:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        worker_id = worker_id or tags.get("thaw:worker-id")
        shape = shape or tags.get("thaw:shape")
        if not worker_id or not shape:
            return None
        instance_id = raw["InstanceId"]
        self._where[instance_id] = endpoint
        launched = raw.get("LaunchTime")
        market = market or ("spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand")
        return Instance(
            instance_id=instance_id,
            worker_id=worker_id,
            shape=shape,
            launched_at=launched.timestamp() if launched is not None else self._clock(),
            state=InstanceState(raw["State"]["Name"]),
            detail=(("instance_type", str(raw.get("InstanceType", ""))), ("subnet", str(raw.get("SubnetId", ""))),
                    ("market", market), ("region", endpoint[0])),
            term=int(tags["thaw:term"]) if tags.get("thaw:term", "").isdigit() else None,
        )

    def _record(self, shape: str, outcome: str, tried: list[dict[str, str]], last_error: str | None,
                instance_id: str | None) -> None:
        self._status[shape] = {"at": self._clock(), "outcome": outcome, "instance_id": instance_id,
                               "tried": tried, "last_error": last_error}
