"""The config a Thaw cluster on AWS runs with, from its CloudFormation stack
(``infra/aws/thaw.yaml``): pure, given what the stack says (its outputs and parameters)
and what EC2 says of each GPU shape's instance type. ``thaw aws config`` does the I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from thaw.planner import catalog

# The stack's outputs the config is made from (each named in the error when missing).
NEEDED = ("ClusterName", "ControllerUrl", "BucketName", "ModelsPrefix", "DatabaseEndpoint",
          "Shape1LaunchTemplate", "PrivateSubnetIds", "WorkerPackage", "WorkerPort")


def token_secret_name(cluster: str) -> str:
    """The cluster token's secret as the template names it (``ClusterToken``)."""
    return f"thaw/{cluster}/cluster-token"


class StackProblem(ValueError):
    """The stack cannot give a config (an output missing, an unknown instance type)."""


@dataclass(frozen=True)
class InstanceType:
    """What EC2 says of an instance type (DescribeInstanceTypes)."""

    name: str
    memory_mib: int
    gpu_name: str        # as EC2 names it: L40S, H100, A10G
    gpu_count: int
    gpu_memory_mib: int  # each GPU's
    instance_storage_gb: int = 0  # local NVMe (the weight cache); 0: none


# Without instance storage the cache is on the root volume the template gives (200 GB+).
ROOT_VOLUME_CACHE_GIB = 100


def shape_name(instance_type: str) -> str:
    return instance_type.replace(".", "-")


def shape(it: InstanceType) -> dict[str, Any]:
    """A config shape for an instance type: its GPUs as EC2 reports them, its price from
    the planner's catalog (0 with no catalog entry: set it before budgets mean anything)."""
    if it.gpu_count < 1:
        raise StackProblem(f"{it.name} has no GPU: a worker launch template needs a GPU instance type")
    try:
        price = catalog.instance(it.name).usd_per_hour
    except ValueError:
        price = 0.0
    return {"name": shape_name(it.name), "gpu_type": f"{it.gpu_name.lower()}-{round(it.gpu_memory_mib / 1024)}gb",
            "gpu_count": it.gpu_count, "gpu_memory_gib": round(it.gpu_memory_mib / 1024, 1),
            "host_memory_gib": round(it.memory_mib / 1024, 1), "price_per_hour_usd": price,
            # The bootstrap mounts the instance store there; most of it holds weights.
            "cache": {"dir": "/mnt/thaw-cache/weights",
                      "max_gib": int(it.instance_storage_gb * 0.8) or ROOT_VOLUME_CACHE_GIB}}


def config_from_stack(outputs: dict[str, str], parameters: dict[str, str], region: str,
                      instance_types: dict[str, InstanceType], redis_url: str) -> dict[str, Any]:
    """The config file (as data) for the cluster the stack made. ``instance_types``: each
    GPU shape's type (``Shape1InstanceType``, ``Shape2InstanceType``) as EC2 describes it;
    ``redis_url``: the limits store's (``rediss://`` for ElastiCache with TLS)."""
    missing = [k for k in NEEDED if not outputs.get(k)]
    if missing:
        raise StackProblem(f"the stack has no output {', '.join(missing)} (is it infra/aws/thaw.yaml, "
                           "created completely?)")
    bucket, prefix = outputs["BucketName"], outputs["ModelsPrefix"]
    subnets = [s for s in outputs["PrivateSubnetIds"].split(",") if s]
    shapes, pools = [], []
    for n in (1, 2):
        template = outputs.get(f"Shape{n}LaunchTemplate")
        itype = parameters.get(f"Shape{n}InstanceType")
        if not template or not itype:
            continue
        if itype not in instance_types:
            raise StackProblem(f"EC2 does not describe instance type {itype!r} (Shape{n}InstanceType)")
        s = shape(instance_types[itype])
        shapes.append(s)
        pools.append({"shape": s["name"], "provider": "ec2", "standby_min": 0, "standby_max": 1,
                      "max_instances": 4, "budget_usd_per_hour": None,
                      "ec2": {"region": region, "launch_template": template, "subnets": subnets,
                              "instance_types": [itype], "worker_port": int(outputs["WorkerPort"])}})
    name = outputs["ClusterName"]
    return {
        "data_dir": "/var/lib/thaw",
        "cluster": {"name": name, "token_secret": outputs.get("ClusterTokenSecret") or token_secret_name(name),
                    "worker_package": outputs["WorkerPackage"],
                    "worker_config_uri": f"s3://{bucket}/config/thaw.yaml"},
        "server": {"host": "0.0.0.0", "port": 8000},
        "controller": {"host": "0.0.0.0", "port": 8100, "urls": [outputs["ControllerUrl"]]},
        # The password: PGPASSWORD, which each controller reads from the stack's database secret.
        "state": {"backend": "postgres", "url": f"postgresql://thaw@{outputs['DatabaseEndpoint']}:5432/thaw"},
        "limits": {"backend": "redis", "url": redis_url, "key_prefix": f"thaw:{name}:limits"},
        "object_store": {"kind": "s3", "bucket": bucket, "region": region,
                         "allowed_prefixes": [f"s3://{bucket}/{prefix}"],
                         "credentials": {"source": "role"}},
        "ledger": {"ship": True, "ship_prefix": "usage/"},
        "shapes": shapes,
        "pools": pools,
        "models": [],
        "tenants": [],
    }


# -- `thaw aws check`: what the stack lacks, from what AWS says of it (pure) --------------


@dataclass(frozen=True)
class StackFacts:
    """What ``thaw aws check`` reads of a stack (the CLI gathers it)."""

    status: str
    # instance type -> the zones it is offered in; subnet -> its zone
    offered: dict[str, frozenset[str]]
    subnet_zones: dict[str, str]
    # launch template id -> the instance profile ARN it names (None: none)
    template_profiles: dict[str, str | None]
    worker_profile_arn: str
    # the token secret's ARN (None: it does not exist)
    token_secret_arn: str | None
    # role -> the resources its policies allow secretsmanager:GetSecretValue on
    secret_readers: dict[str, list[str]]
    config_uploaded: bool


def _covers(pattern: str, arn: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), arn) is not None


def check_problems(f: StackFacts) -> list[str]:
    """Each thing that keeps the stack's cluster from working, in words an operator acts on."""
    out = []
    if f.status not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        out.append(f"the stack is {f.status}, not complete")
    for itype, zones in sorted(f.offered.items()):
        for subnet, zone in sorted(f.subnet_zones.items()):
            if zone not in zones:
                out.append(f"{itype} is not offered in {zone} ({subnet}): launches there fail; drop the subnet or "
                           "the instance type")
    for template, profile in sorted(f.template_profiles.items()):
        if profile != f.worker_profile_arn:
            out.append(f"launch template {template} names {profile or 'no instance profile'}, not the worker "
                       f"profile {f.worker_profile_arn}: its workers cannot read weights or the token")
    if f.token_secret_arn is None:
        out.append("the cluster token's secret does not exist")
    else:
        for role, resources in sorted(f.secret_readers.items()):
            if not any(_covers(r, f.token_secret_arn) for r in resources):
                out.append(f"the {role} role cannot read the cluster token ({f.token_secret_arn})")
    if not f.config_uploaded:
        out.append("no config at config/thaw.yaml in the bucket: write it with `thaw aws config` and upload it")
    return out
