"""The config made from a CloudFormation stack's outputs (thaw.aws_stack), pure."""

from __future__ import annotations

import pytest

from thaw.aws_stack import (
    InstanceType,
    StackFacts,
    StackProblem,
    check_problems,
    config_from_stack,
    shape,
)
from thaw.config import parse_config

OUTPUTS = {"ClusterName": "prod", "ControllerUrl": "http://ctl.internal:8100", "BucketName": "thaw-prod",
           "ModelsPrefix": "models/", "DatabaseEndpoint": "db.internal", "Shape1LaunchTemplate": "lt-1",
           "PrivateSubnetIds": "subnet-a,subnet-b", "WorkerPackage": "thaw-serve[gpu]", "WorkerPort": "8200"}
G6E = InstanceType("g6e.xlarge", memory_mib=32768, gpu_name="L40S", gpu_count=1, gpu_memory_mib=45776,
                   instance_storage_gb=250)


def test_a_config_that_checks_with_the_price_from_the_catalog() -> None:
    data = config_from_stack(OUTPUTS, {"Shape1InstanceType": "g6e.xlarge"}, "eu-west-1", {"g6e.xlarge": G6E},
                             "rediss://r.internal:6379/0")
    cfg = parse_config(data)
    [s] = cfg.shapes
    assert (s.name, s.gpu_count, s.price_per_hour_usd, s.cache.max_gib) == ("g6e-xlarge", 1, 1.861, 200)
    assert cfg.cluster.token_secret == "thaw/prod/cluster-token" and cfg.state.backend == "postgres"
    assert cfg.pools[0].ec2 is not None and cfg.pools[0].ec2.region == "eu-west-1"


def test_what_the_stack_cannot_give_is_named() -> None:
    with pytest.raises(StackProblem, match="no output ControllerUrl, DatabaseEndpoint"):
        config_from_stack({k: v for k, v in OUTPUTS.items() if k not in ("ControllerUrl", "DatabaseEndpoint")},
                          {}, "eu-west-1", {}, "rediss://r:6379/0")
    with pytest.raises(StackProblem, match="does not describe instance type 'g9.huge'"):
        config_from_stack(OUTPUTS, {"Shape1InstanceType": "g9.huge"}, "eu-west-1", {}, "rediss://r:6379/0")
    with pytest.raises(StackProblem, match="has no GPU"):
        shape(InstanceType("c7i.large", 4096, "", 0, 0))
    # Not in the planner's catalog: priced 0 (budgets see it free until the operator sets it).
    assert shape(InstanceType("g7.xlarge", 65536, "X1", 1, 98304))["price_per_hour_usd"] == 0.0


def facts(**changes: object) -> StackFacts:
    base = {"status": "CREATE_COMPLETE", "offered": {"g6e.xlarge": frozenset({"eu-west-1a", "eu-west-1b"})},
            "subnet_zones": {"subnet-a": "eu-west-1a", "subnet-b": "eu-west-1b"},
            "template_profiles": {"lt-1": "arn:aws:iam::1:instance-profile/worker"},
            "worker_profile_arn": "arn:aws:iam::1:instance-profile/worker",
            "token_secret_arn": "arn:aws:secretsmanager:eu-west-1:1:secret:thaw/prod/cluster-token-AbCd",
            "secret_readers": {"worker": ["arn:aws:secretsmanager:eu-west-1:1:secret:thaw/prod/cluster-token-AbCd"],
                               "activator": ["arn:aws:secretsmanager:eu-west-1:1:secret:thaw/prod/cluster-token-*"]},
            "config_uploaded": True}
    return StackFacts(**{**base, **changes})  # type: ignore[arg-type]


def test_a_working_stack_has_no_problem_and_each_fault_is_named() -> None:
    assert check_problems(facts()) == []
    assert check_problems(facts(status="ROLLBACK_COMPLETE")) == ["the stack is ROLLBACK_COMPLETE, not complete"]
    assert check_problems(facts(subnet_zones={"subnet-a": "eu-west-1a", "subnet-c": "eu-west-1c"})) == [
        "g6e.xlarge is not offered in eu-west-1c (subnet-c): launches there fail; drop the subnet or the instance type"]
    assert check_problems(facts(template_profiles={"lt-1": None}))[0].startswith(
        "launch template lt-1 names no instance profile, not the worker profile")
    assert check_problems(facts(secret_readers={"controller": ["arn:aws:secretsmanager:eu-west-1:1:secret:other"]})) \
        == ["the controller role cannot read the cluster token "
            "(arn:aws:secretsmanager:eu-west-1:1:secret:thaw/prod/cluster-token-AbCd)"]
    assert check_problems(facts(token_secret_arn=None)) == ["the cluster token's secret does not exist"]
    assert check_problems(facts(config_uploaded=False))[0].startswith("no config at config/thaw.yaml")
