"""The config made from a CloudFormation stack's outputs (thaw.aws_stack), pure."""

from __future__ import annotations

import pytest

from thaw.aws_stack import InstanceType, StackProblem, config_from_stack, shape
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
