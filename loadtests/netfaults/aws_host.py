"""EC2 for the fault harness: moto in server mode on a host of its own (the real botocore
wire protocol), a launch template and subnets in it, and a pool of the fleet's
controllers on it whose instances never boot a worker.

So a run has a provider that launches: the standby sizer launches the pool's standby,
it never registers, it is terminated after the shape's boot timeout and launched again,
over and over, through every fault. What the provider holds at the end (every instance,
terminated ones too, with its ``thaw:worker-id`` and ``thaw:term`` tags) goes to the
history checker: one instance per decision, and each launched in a term that had
written its launch action first (``warm_pool.fencing``)."""

from __future__ import annotations

from typing import Any

import boto3

from loadtests.netfaults.checker import Launched

PORT = 5000
REGION = "us-east-1"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
CLUSTER = "netfaults"
SHAPE = "ec2-none"  # its instances never boot a worker
BOOT_TIMEOUT_S = 8.0


def _client(url: str) -> Any:
    return boto3.client("ec2", region_name=REGION, endpoint_url=url, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def setup(url: str) -> dict[str, Any]:
    """A VPC, two subnets and a launch template in moto at ``url``; the pool's ``ec2``
    settings that use them."""
    ec2 = _client(url)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24")["Subnet"]["SubnetId"] for i in (1, 2)]
    lt = ec2.create_launch_template(LaunchTemplateName="thaw-netfaults",
                                    LaunchTemplateData={"ImageId": ami, "InstanceType": "t3.micro"})
    return {"region": REGION, "launch_template": lt["LaunchTemplate"]["LaunchTemplateId"], "subnets": subnets,
            "instance_types": ["g5.xlarge"], "endpoint_url": url}


def config(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shape and the pool to add to the controllers' config."""
    shape = {"name": SHAPE, "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 1.0,
             "boot_timeout_s": BOOT_TIMEOUT_S}
    pool = {"shape": SHAPE, "provider": "ec2", "standby_min": 1, "standby_max": 1, "max_instances": 2,
            "ec2": setup(url)}
    return shape, pool


def instances(url: str) -> list[Launched]:
    """Every instance of the cluster moto holds (terminated ones too), with its term."""
    pages = _client(url).get_paginator("describe_instances").paginate(
        Filters=[{"Name": "tag:thaw:cluster", "Values": [CLUSTER]}])
    out = []
    for page in pages:
        for r in page["Reservations"]:
            for i in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                term = tags.get("thaw:term")
                out.append(Launched(tags.get("thaw:worker-id", ""), i["InstanceId"],
                                    int(term) if term and term.isdigit() else None))
    return out
