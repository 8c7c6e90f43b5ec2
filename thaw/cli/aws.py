"""`thaw aws config|check --stack NAME`. config: the config a cluster made by infra/aws/thaw.yaml runs
with, from the stack's outputs and parameters, EC2's description of each GPU shape's
instance type and ElastiCache's of the Redis group (thaw.aws_stack composes it). The
result is checked as `thaw config check` would before it is written; it holds names and
addresses only, never a secret. Upload it to the bucket at config/thaw.yaml, where the
stack's controllers, activators and workers read it. check: what keeps the stack's
cluster from working (thaw.aws_stack.check_problems says it from what AWS reports)."""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from thaw.cli.aliases import add_renamed_flag
from thaw.cli.common import EXIT_FAILED, EXIT_INVALID, CliError, add_json_argument


def _aws(service: str, region: str | None) -> Any:
    import boto3

    return boto3.client(service, region_name=region)


def _stack(cfn: Any, name: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The stack as CloudFormation describes it, its outputs and its parameters (an SSM
    parameter's resolved value)."""
    found = cfn.describe_stacks(StackName=name)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in found.get("Outputs", [])}
    params = {p["ParameterKey"]: p.get("ResolvedValue") or p["ParameterValue"] for p in found["Parameters"]}
    return found, outputs, params


def _redis_url(outputs: dict[str, str], region: str | None) -> str:
    import botocore.exceptions

    group = outputs.get("RedisReplicationGroup")
    if not group:
        raise CliError("the stack has no output RedisReplicationGroup; give --redis-url", EXIT_INVALID)
    try:
        found = _aws("elasticache", region).describe_replication_groups(ReplicationGroupId=group)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise CliError(f"cannot describe the Redis group {group!r}: {exc}", EXIT_FAILED) from None
    primary = found["ReplicationGroups"][0]["NodeGroups"][0]["PrimaryEndpoint"]
    return f"rediss://{primary['Address']}:{primary['Port']}/0"


def stack_config(stack: str, region: str | None, redis_url: str | None) -> dict[str, Any]:
    import botocore.exceptions

    from thaw.aws_stack import InstanceType, StackProblem, config_from_stack

    try:
        cfn = _aws("cloudformation", region)
        found, outputs, params = _stack(cfn, stack)
        region = cfn.meta.region_name
        wanted = [t for t in (params.get("Shape1InstanceType"), params.get("Shape2InstanceType")) if t]
        described = _aws("ec2", region).describe_instance_types(InstanceTypes=wanted)["InstanceTypes"] \
            if wanted else []
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise CliError(f"cannot read stack {stack!r}: {exc}", EXIT_FAILED) from None
    types = {}
    for t in described:
        gpus = t.get("GpuInfo", {}).get("Gpus", [])
        types[t["InstanceType"]] = InstanceType(
            name=t["InstanceType"], memory_mib=t["MemoryInfo"]["SizeInMiB"],
            gpu_name=gpus[0]["Name"] if gpus else "", gpu_count=sum(g["Count"] for g in gpus),
            gpu_memory_mib=gpus[0]["MemoryInfo"]["SizeInMiB"] if gpus else 0,
            instance_storage_gb=t.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0))
    try:
        return config_from_stack(outputs, params, str(region), types, redis_url or _redis_url(outputs, region))
    except StackProblem as exc:
        raise CliError(str(exc), EXIT_INVALID) from None


def cmd_config(args: argparse.Namespace) -> int:
    from thaw.config import ConfigError, parse_config

    data = stack_config(args.stack, args.region, args.redis_url)
    try:
        parse_config(data)
    except ConfigError as exc:  # a stack this code does not understand: say so, write nothing
        raise CliError(f"the config made from stack {args.stack!r} does not check: {exc}", EXIT_FAILED) from None
    text = ("# Made by `thaw aws config --stack " + args.stack + "`; add models and tenants with `thaw models` "
            "and `thaw tenants`.\n" + yaml.safe_dump(data, sort_keys=False))
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}; upload it to s3://{data['object_store']['bucket']}/config/thaw.yaml",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"stack": args.stack, "wrote": args.out, "config": data}, indent=2))
    elif not args.out:
        sys.stdout.write(text)
    return 0


def _secret_readers(iam: Any, role: str) -> list[str]:
    """The resources a role's inline policies allow secretsmanager:GetSecretValue on."""
    out: list[str] = []
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        doc = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        if isinstance(doc, str):
            try:
                doc = json.loads(doc)
            except ValueError:  # moto keeps a CloudFormation-made inline policy as a Python literal
                doc = ast.literal_eval(doc)
        for st in doc.get("Statement", []):
            actions = st.get("Action", [])
            actions = [actions] if isinstance(actions, str) else actions
            if st.get("Effect") == "Allow" and any(a in ("secretsmanager:GetSecretValue", "secretsmanager:*", "*")
                                                   for a in actions):
                res = st.get("Resource") or []
                out += [r for r in ([res] if isinstance(res, str) else res) if isinstance(r, str)]
    return out


def stack_facts(stack: str, region: str | None) -> Any:
    import botocore.exceptions

    from thaw.aws_stack import StackFacts, token_secret_name

    try:
        cfn = _aws("cloudformation", region)
        region = cfn.meta.region_name
        found, outputs, params = _stack(cfn, stack)
        resources = {r["LogicalResourceId"]: r.get("PhysicalResourceId")
                     for r in cfn.describe_stack_resources(StackName=stack)["StackResources"]
                     if r.get("LogicalResourceId")}
        ec2, iam = _aws("ec2", region), _aws("iam", region)
        itypes = [t for t in (params.get("Shape1InstanceType"), params.get("Shape2InstanceType")) if t]
        offered: dict[str, set[str]] = {t: set() for t in itypes}
        if itypes:
            pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": itypes}])
            for page in pages:
                for o in page["InstanceTypeOfferings"]:
                    offered[o["InstanceType"]].add(o["Location"])
        subnets = [s for s in outputs.get("PrivateSubnetIds", "").split(",") if s]
        zones = {s["SubnetId"]: s["AvailabilityZone"]
                 for s in ec2.describe_subnets(SubnetIds=subnets)["Subnets"]} if subnets else {}
        templates = {}
        for name in ("Shape1LaunchTemplate", "Shape2LaunchTemplate"):
            if resources.get(name):
                data = ec2.describe_launch_template_versions(LaunchTemplateId=resources[name], Versions=["$Latest"])[
                    "LaunchTemplateVersions"][0]["LaunchTemplateData"]
                templates[resources[name]] = data.get("IamInstanceProfile", {}).get("Arn")
        profile = iam.get_instance_profile(InstanceProfileName=resources["WorkerInstanceProfile"])[
            "InstanceProfile"]["Arn"]
        try:
            secret = _aws("secretsmanager", region).describe_secret(
                SecretId=outputs.get("ClusterTokenSecret") or token_secret_name(params["ClusterName"]))["ARN"]
        except botocore.exceptions.ClientError:
            secret = None
        readers = {role.removesuffix("Role").lower(): _secret_readers(iam, resources[role])
                   for role in ("WorkerRole", "ControllerRole", "ActivatorRole")}
        try:
            _aws("s3", region).head_object(Bucket=outputs["BucketName"], Key="config/thaw.yaml")
            uploaded = True
        except botocore.exceptions.ClientError:
            uploaded = False
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, KeyError) as exc:
        raise CliError(f"cannot read stack {stack!r}: {exc}", EXIT_FAILED) from None
    return StackFacts(status=found["StackStatus"], offered={t: frozenset(z) for t, z in offered.items()},
                      subnet_zones=zones, template_profiles=templates, worker_profile_arn=profile,
                      token_secret_arn=secret, secret_readers=readers, config_uploaded=uploaded)


def cmd_check(args: argparse.Namespace) -> int:
    from thaw.aws_stack import check_problems

    problems = check_problems(stack_facts(args.stack, args.region))
    if args.json:
        print(json.dumps({"stack": args.stack, "ok": not problems, "problems": [str(p) for p in problems]}, indent=2))
        return EXIT_FAILED if problems else 0
    for p in problems:
        print(f"- {p}")
    if not problems:
        print(f"stack {args.stack}: nothing missing or wrong")
    return EXIT_FAILED if problems else 0


def add_parsers(sub: argparse._SubParsersAction, add: Any) -> None:  # type: ignore[type-arg]
    aws = sub.add_parser("aws", help="A cluster made by the CloudFormation stack (infra/aws/thaw.yaml).")
    a_sub = aws.add_subparsers(dest="aws_command", metavar="SUBCOMMAND", required=True)
    p = add(a_sub, "config", "Write the config the stack's services run with, from its outputs.", cmd_config,
            with_common=False)
    p.add_argument("--stack", required=True, metavar="NAME", help="the CloudFormation stack's name")
    p.add_argument("--region", default=None, help="default: the AWS default chain's")
    p.add_argument("--redis-url", default=None,
                   help="limits.url, in place of the stack's ElastiCache group (rediss://HOST:PORT/DB)")
    add_renamed_flag(p, "--output", "--out")
    p.add_argument("-o", "--out", default=None, metavar="FILE", help="write it here (default: standard output)")
    add_json_argument(p, "print the config as one JSON document (and the file written, if --out)")
    p = add(a_sub, "check", "Say what keeps the stack's cluster from working: zones without a shape's instance "
            "type, launch templates without the worker profile, a token secret a role cannot read, no config.",
            cmd_check, with_common=False)
    p.add_argument("--stack", required=True, metavar="NAME", help="the CloudFormation stack's name")
    p.add_argument("--region", default=None, help="default: the AWS default chain's")
    p.add_argument("--json", action="store_true",
                   help='print the verdict as one JSON document: {"stack", "ok", "problems"}')
