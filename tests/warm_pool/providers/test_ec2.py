"""The ec2 provider against moto in server mode: real HTTP, real botocore.

Each test builds its own VPC, subnets and launch template and uses its own cluster
name, so tests never see each other's instances. Moto has no notion of capacity: a
``before-send`` handler on the provider's client answers chosen RunInstances calls
with EC2's capacity error (HTTP 500) instead of sending them; every other call goes
over the wire to moto.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.warm_pool.moto_ec2 import REGION, TOKEN_PARAM, Aws, NoCapacity
from thaw.config import Ec2Pool
from warm_pool.providers.ec2 import BOOTSTRAP_SCRIPT, Ec2Provider, client_token
from warm_pool.providers.provider import CapacityError, InstanceState

pytestmark = pytest.mark.integration

async def test_launch_tags_user_data_and_first_choice(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # A token where a careless provider might pick it up; it must not reach user data.
    token = "tok-3f9c2e7d1a5b4c8e"
    monkeypatch.setenv("THAW_CLUSTER_TOKEN", token)
    provider = aws.provider(package="thaw-serve[gpu]==0.1.0", config_uri="s3://thaw-test/thaw.yaml")
    try:
        inst = await provider.launch("gpu", "w-1")
    finally:
        await provider.close()
    [raw] = aws.described()
    assert raw["InstanceId"] == inst.instance_id
    # AWS (and moto) add aws:ec2launchtemplate:* tags of their own.
    assert {t["Key"]: t["Value"] for t in raw["Tags"] if not t["Key"].startswith("aws:")} == {
        "Name": f"thaw-{aws.cluster}-w-1", "thaw:cluster": aws.cluster, "thaw:pool": "gpu",
        "thaw:shape": "gpu", "thaw:worker-id": "w-1",
    }
    assert (raw["SubnetId"], raw["InstanceType"]) == (aws.subnets[0], "g5.xlarge")
    # Moto records the token without enforcing it; AWS dedupes a retried call by it.
    assert raw["ClientToken"] == client_token(aws.cluster, "w-1", "g5.xlarge", aws.subnets[0], "on-demand")
    assert len(raw["ClientToken"]) <= 64
    assert (inst.worker_id, inst.shape, inst.control_url) == ("w-1", "gpu", None)
    assert dict(inst.detail)["subnet"] == aws.subnets[0]
    attr = aws.ec2.describe_instance_attribute(InstanceId=inst.instance_id, Attribute="userData")
    user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
    assert user_data.startswith("#!/bin/bash\n") and user_data.endswith(BOOTSTRAP_SCRIPT.read_text())
    assert "THAW_CONTROLLER_URL=http://controller.internal:8100" in user_data
    assert f"THAW_TOKEN_SSM_PARAMETER={TOKEN_PARAM}" in user_data
    for line in ("THAW_CLUSTER=" + aws.cluster, "THAW_SHAPE=gpu", "THAW_WORKER_ID=w-1", "THAW_WORKER_PORT=8200",
                 "THAW_PACKAGE='thaw-serve[gpu]==0.1.0'", "THAW_CONFIG_URI=s3://thaw-test/thaw.yaml"):
        assert f"\n{line}\n" in user_data
    # The token's name is there; no token value and no variable that would hold one.
    assert token not in user_data
    assert "THAW_CLUSTER_TOKEN=" not in user_data and "with-decryption" not in user_data


async def test_launch_template_by_name(aws: Aws) -> None:
    provider = aws.provider(aws.pool(launch_template=aws.launch_template_name))
    try:
        inst = await provider.launch("gpu", "w-1")
    finally:
        await provider.close()
    [raw] = aws.described()
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert (raw["InstanceId"], tags["aws:ec2launchtemplate:id"]) == (inst.instance_id, aws.launch_template)


async def test_launch_twice_same_worker_one_instance(aws: Aws) -> None:
    provider = aws.provider()
    try:
        first = await provider.launch("gpu", "w-1")
        again = await provider.launch("gpu", "w-1")
        other = await provider.launch("gpu", "w-2")
    finally:
        await provider.close()
    assert again.instance_id == first.instance_id != other.instance_id
    assert len(aws.described("w-1")) == 1
    assert provider.status()["gpu"]["outcome"] == "launched"  # w-2's launch was the last


async def test_a_launch_names_the_leader_term_that_decided_it(aws: Aws) -> None:
    # warm_pool.fencing: the term is on the instance (a restarted controller, and a history
    # checker, read which term launched what) and in the idempotency token.
    provider = aws.provider()
    try:
        inst = await provider.launch("gpu", "w-1", term=7)
        [listed] = await provider.instances()
    finally:
        await provider.close()
    [raw] = aws.described()
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["thaw:term"] == "7"
    assert inst.term == listed.term == 7
    assert raw["ClientToken"] == client_token(aws.cluster, "w-1", "g5.xlarge", aws.subnets[0], "on-demand", 7)
    assert raw["ClientToken"] != client_token(aws.cluster, "w-1", "g5.xlarge", aws.subnets[0], "on-demand", 8)


async def test_instances_lists_pages_and_drops_terminated(aws: Aws) -> None:
    describes: list[int] = []

    def count(client: Any) -> None:
        client.meta.events.register("before-call.ec2.DescribeInstances", lambda **_: describes.append(1))

    provider = aws.provider(page_size=2, on_client=count)
    try:
        launched = {(await provider.launch("gpu", f"w-{i}")).instance_id: f"w-{i}" for i in range(5)}
        gone = next(iter(launched))
        await provider.terminate(gone)
        describes.clear()
        listed = await provider.instances()
    finally:
        await provider.close()
    # 4 live instances at 2 a page: at least 2 pages, and moto may page over more.
    assert len(describes) >= 2
    assert {i.instance_id: i.worker_id for i in listed} == {k: v for k, v in launched.items() if k != gone}
    assert {i.shape for i in listed} == {"gpu"}
    assert {i.state for i in listed} <= {InstanceState.PENDING, InstanceState.RUNNING}


async def test_instances_skips_untagged(aws: Aws) -> None:
    # In the cluster, but no worker id: not something this provider launched.
    aws.ec2.run_instances(
        LaunchTemplate={"LaunchTemplateId": aws.launch_template}, SubnetId=aws.subnets[0], MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "thaw:cluster", "Value": aws.cluster}]}],
    )
    provider = aws.provider()
    try:
        inst = await provider.launch("gpu", "w-1")
        assert [i.instance_id for i in await provider.instances()] == [inst.instance_id]
    finally:
        await provider.close()


S1, S2 = 0, 1  # subnet indexes


@pytest.mark.parametrize(
    ("market", "failing", "want_attempts", "want_market"),
    [
        # first subnet has none -> second subnet, same type
        ("on-demand", {(S1, "g5.xlarge", "on-demand")},
         [(S1, "g5.xlarge", "on-demand"), (S2, "g5.xlarge", "on-demand")], "on-demand"),
        # no g5.xlarge in any subnet -> g5.2xlarge, from the first subnet again
        ("on-demand", {(S1, "g5.xlarge", "on-demand"), (S2, "g5.xlarge", "on-demand")},
         [(S1, "g5.xlarge", "on-demand"), (S2, "g5.xlarge", "on-demand"), (S1, "g5.2xlarge", "on-demand")],
         "on-demand"),
        # no spot anywhere -> on-demand, from the first type and subnet
        ("spot", {(s, t, "spot") for s in (S1, S2) for t in ("g5.xlarge", "g5.2xlarge")},
         [(S1, "g5.xlarge", "spot"), (S2, "g5.xlarge", "spot"), (S1, "g5.2xlarge", "spot"),
          (S2, "g5.2xlarge", "spot"), (S1, "g5.xlarge", "on-demand")], "on-demand"),
        # spot found in the second subnet: no on-demand attempt
        ("spot", {(S1, "g5.xlarge", "spot")}, [(S1, "g5.xlarge", "spot"), (S2, "g5.xlarge", "spot")], "spot"),
    ],
    ids=["subnet-fallback", "type-fallback", "spot-to-on-demand", "spot-second-subnet"],
)
async def test_capacity_fallback_order(aws: Aws, market: str, failing: set[tuple[int, str, str]],
                                       want_attempts: list[tuple[int, str, str]], want_market: str) -> None:
    bad = {(aws.subnets[s], t, m) for s, t, m in failing}
    nocap = NoCapacity(lambda s, t, m: (s, t, m) in bad)
    provider = aws.provider(aws.pool(market=market), on_client=nocap.register)
    try:
        inst = await provider.launch("gpu", "w-1")
        [listed] = await provider.instances()
    finally:
        await provider.close()
    assert nocap.attempts == [(aws.subnets[s], t, m) for s, t, m in want_attempts]
    want_subnet, want_type = aws.subnets[want_attempts[-1][0]], want_attempts[-1][1]
    [raw] = aws.described()
    assert (raw["InstanceId"], raw["SubnetId"], raw["InstanceType"]) == (inst.instance_id, want_subnet, want_type)
    # EC2 marks spot instances; on-demand ones carry no InstanceLifecycle.
    assert raw.get("InstanceLifecycle", "on-demand") == want_market
    want_detail = {"instance_type": want_type, "subnet": want_subnet, "market": want_market, "region": REGION}
    assert dict(inst.detail) == dict(listed.detail) == want_detail
    status = provider.status()["gpu"]
    assert status["outcome"] == "launched" and len(status["tried"]) == len(want_attempts)
    assert [t["error"] for t in status["tried"]] == ["InsufficientInstanceCapacity"] * (len(want_attempts) - 1) + [""]


@pytest.mark.parametrize(("market", "fallback", "want_tries"),
                         [("spot", False, 4), ("spot", True, 8), ("on-demand", True, 4)],
                         ids=["spot-no-fallback", "spot-then-on-demand", "on-demand"])
async def test_capacity_exhausted_raises_and_starts_nothing(aws: Aws, market: str, fallback: bool,
                                                            want_tries: int) -> None:
    # 2 subnets x 2 types = 4 per market; spot with fallback tries on-demand as well: 8
    nocap = NoCapacity(lambda s, t, m: True)
    provider = aws.provider(aws.pool(market=market, spot_fallback_to_on_demand=fallback),
                            on_client=nocap.register)
    try:
        with pytest.raises(CapacityError) as err:
            await provider.launch("gpu", "w-1")
    finally:
        await provider.close()
    assert err.value.shape == "gpu"
    assert len(nocap.attempts) == want_tries
    assert {m for _, _, m in nocap.attempts} == ({"spot", "on-demand"} if fallback and market == "spot" else {market})
    assert "InsufficientInstanceCapacity" in str(err.value) and aws.subnets[1] in str(err.value)
    assert aws.described() == []
    status = provider.status()["gpu"]
    assert status["outcome"] == "no_capacity" and status["instance_id"] is None
    assert json.loads(json.dumps(status))["last_error"].startswith("InsufficientInstanceCapacity: ")


async def test_other_client_errors_propagate(aws: Aws) -> None:
    # A subnet that does not exist is a config error, not a capacity problem: no fallback.
    attempts = NoCapacity(lambda s, t, m: False)
    provider = aws.provider(aws.pool(subnets=["subnet-00000000", *aws.subnets]), on_client=attempts.register)
    try:
        with pytest.raises(ClientError):
            await provider.launch("gpu", "w-1")
    finally:
        await provider.close()
    assert len(attempts.attempts) == 1
    assert aws.described() == []


async def test_stop_start_terminate(aws: Aws) -> None:
    provider = aws.provider()
    try:
        inst = await provider.launch("gpu", "w-1")
        await provider.stop(inst.instance_id)
        assert [i.state for i in await provider.instances()] == [InstanceState.STOPPED]
        await provider.start(inst.instance_id)
        assert [i.state for i in await provider.instances()] in ([InstanceState.RUNNING], [InstanceState.PENDING])
        await provider.terminate(inst.instance_id)
        assert await provider.instances() == []
        # Again, and an id never seen: both only logged.
        await provider.terminate(inst.instance_id)
        await provider.terminate("i-0123456789abcdef0")
    finally:
        await provider.close()
    [raw] = aws.described()
    assert raw["State"]["Name"] == "terminated"


async def test_stop_start_find_instance_without_launch(aws: Aws) -> None:
    # A restarted controller knows the id only from instances(), or not at all.
    first = aws.provider()
    try:
        inst = await first.launch("gpu", "w-1")
    finally:
        await first.close()
    second = aws.provider()
    try:
        await second.stop(inst.instance_id)
    finally:
        await second.close()
    [raw] = aws.described()
    assert raw["State"]["Name"] == "stopped"


async def test_close_terminates_nothing(aws: Aws) -> None:
    provider = aws.provider()
    inst = await provider.launch("gpu", "w-1")
    await provider.close()
    [raw] = aws.described()
    assert raw["State"]["Name"] in ("pending", "running")
    # A new provider (a restarted controller) adopts it, by tags alone.
    again = aws.provider()
    try:
        assert [(i.instance_id, i.worker_id) for i in await again.instances()] == [(inst.instance_id, "w-1")]
        assert (await again.launch("gpu", "w-1")).instance_id == inst.instance_id
        assert again.status()["gpu"]["outcome"] == "adopted"
    finally:
        await again.close()


def test_needs_token_parameter_name() -> None:
    pool = Ec2Pool(region=REGION, launch_template="lt-0", subnets=["s"], instance_types=["t"])
    with pytest.raises(ValueError, match="token_secret .* or cluster.token_ssm_parameter"):
        Ec2Provider(cluster="c", pools={"gpu": pool}, controller_url="http://c", token_ssm_parameter=None)


async def test_workers_are_told_the_token_secret_when_the_token_is_in_secrets_manager(aws: Aws) -> None:
    secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:thaw/token-AbCdEf"
    provider = aws.provider(token_ssm_parameter=None, token_secret=secret)
    try:
        inst = await provider.launch("gpu", "w-s")
    finally:
        await provider.close()
    attr = aws.ec2.describe_instance_attribute(InstanceId=inst.instance_id, Attribute="userData")
    user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
    values = user_data.removesuffix(BOOTSTRAP_SCRIPT.read_text())
    assert f"\nTHAW_TOKEN_SECRET={secret}\n" in values and "THAW_TOKEN_SSM_PARAMETER" not in values
