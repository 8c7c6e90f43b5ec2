"""infra/aws/thaw.yaml deployed into a moto server (CreateStack over the real wire
protocol), shared by the stack's tests and its IAM test."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import boto3

from tests.warm_pool.moto_ec2 import CREDS, REGION

TEMPLATES = Path(__file__).resolve().parents[1] / "infra" / "aws"
TEMPLATE = TEMPLATES / "thaw.yaml"
# moto's SSM holds no Deep Learning AMI parameter (and, as AWS, refuses to make one
# under /aws/): the stack is deployed with the workers' default pointed at one it holds.
DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
STACK_NAME = "thaw-test"


def deploy(url: str, **overrides: str) -> dict[str, Any]:
    """The stack (cluster ``prod``, a second GPU shape) created in the moto server at
    ``url`` with the account's own keys: its status, parameters, resources and outputs."""
    kw = {"region_name": REGION, "endpoint_url": url, **CREDS}
    ec2, cfn = boto3.client("ec2", **kw), boto3.client("cloudformation", **kw)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=zones[i % 2])
               ["Subnet"]["SubnetId"] for i in range(4)]
    cert = boto3.client("acm", **kw).request_certificate(DomainName="api.example.com")["CertificateArn"]
    params = {"ClusterName": "prod", "VpcId": vpc, "PrivateSubnetIds": ",".join(subnets[:2]),
              "PublicSubnetIds": ",".join(subnets[2:]), "CertificateArn": cert, "ClientCidr": "203.0.113.0/24",
              "OperatorCidr": "10.0.9.0/24", "Shape2InstanceType": "p5.48xlarge", "LongestStreamSeconds": "1200", "ActivatorMinSize": "3",
              **overrides}
    cfn.create_stack(StackName=STACK_NAME, TemplateBody=TEMPLATE.read_text().replace(DLAMI, AL2023),
                     Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()],
                     Capabilities=["CAPABILITY_IAM"])
    described = cfn.describe_stacks(StackName=STACK_NAME)["Stacks"][0]
    resources = {r["LogicalResourceId"]: r.get("PhysicalResourceId")
                 for r in cfn.describe_stack_resources(StackName=STACK_NAME)["StackResources"]
                 if r.get("LogicalResourceId")}
    return {"kw": kw, "status": described["StackStatus"], "params": params, "resources": resources,
            "outputs": {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}}


def client(stack: dict[str, Any], service: str) -> Any:
    return boto3.client(service, **stack["kw"])


def policy(doc: Any) -> dict[str, Any]:
    """A policy document as moto returns it (a dict, JSON, or a Python literal)."""
    if isinstance(doc, dict):
        return doc
    try:
        return json.loads(doc)  # type: ignore[no-any-return]
    except ValueError:
        return ast.literal_eval(doc)  # type: ignore[no-any-return]


def role_policies(stack: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """A role's inline policy documents as the stack made them."""
    iam, name = client(stack, "iam"), stack["resources"][role]
    return [policy(iam.get_role_policy(RoleName=name, PolicyName=pn)["PolicyDocument"])
            for pn in iam.list_role_policies(RoleName=name)["PolicyNames"]]


def statements(stack: dict[str, Any], role: str) -> dict[str, dict[str, Any]]:
    """A role's inline policies' statements by Sid."""
    return {st["Sid"]: st for doc in role_policies(stack, role) for st in doc["Statement"]}


def as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]
