"""infra/aws/thaw.yaml, the CloudFormation stack: cfn-lint clean, deployed into a moto
server (CreateStack over the real wire protocol), and each resource checked as moto made
it. Where moto cannot make a resource type the test names it and checks that resource's
properties in the template instead.

Least privilege is checked on the roles as made: no ``*`` action, ``*`` as a resource
only where the service has no resource-level form, each service's writes confined to
its prefix, and the controller's EC2 rights bound to its cluster's tag, its stack's
launch templates and the worker role."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from moto.cloudformation.parsing import get_model_map

from tests.moto_stack import TEMPLATE, TEMPLATES, as_list, client, deploy, statements
from tests.warm_pool.moto_ec2 import CREDS, REGION, moto_server
from thaw.aws_stack import token_secret_name

# What moto's CloudFormation cannot make (checked from the template below); when moto
# learns one, this test says so and the resource is checked as made.
NOT_IN_MOTO = {"AWS::S3::BucketPolicy", "AWS::SecretsManager::Secret", "AWS::ElastiCache::SubnetGroup",
               "AWS::ElastiCache::ReplicationGroup"}


class _Cfn(yaml.SafeLoader):
    """YAML with CloudFormation's short-form tags read as their long forms."""


def _tag(loader: _Cfn, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_Cfn.add_multi_constructor("!", _tag)


def template() -> dict[str, Any]:
    return yaml.load(TEMPLATE.read_text(), Loader=_Cfn)  # noqa: S506 - a SafeLoader subclass


def test_every_template_is_cfn_lint_clean() -> None:
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    files = sorted(str(p) for p in TEMPLATES.glob("*.yaml"))
    assert files
    r = subprocess.run([str(cfn_lint), *files], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr
    # No rule is switched off without a comment saying why.
    for f in files:
        text = Path(f).read_text()
        assert "cfn-lint" not in text or re.search(r"cfn-lint.*#", text), f


def test_nothing_of_one_account_is_baked_in() -> None:
    text = TEMPLATE.read_text()
    assert not re.search(r"\b\d{12}\b", text), "an account id"
    assert not re.search(r"\bami-[0-9a-f]{8,}", text), "an AMI id"
    assert not re.search(r"\b(us|eu|ap|sa|ca|me|af)-(east|west|north|south|central|northeast|southeast)-\d\b", text)
    params = template()["Parameters"]
    for name in ("ServiceImageId", "WorkerImageId"):
        assert params[name]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
        assert params[name]["Default"].startswith("/aws/service/")


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    """The stack deployed into moto with a second GPU shape; its clients and outputs."""
    with moto_server() as url:
        yield deploy(url)


def test_the_stack_is_made_and_says_what_thaw_needs(stack: dict[str, Any]) -> None:
    assert stack["status"] == "CREATE_COMPLETE"
    made = {t["Type"] for t in template()["Resources"].values()}
    assert made - set(get_model_map()) == NOT_IN_MOTO, "moto learned (or lost) a resource type: update NOT_IN_MOTO"
    out = stack["outputs"]
    assert out["ApiEndpoint"].startswith("https://") and out["ApiEndpoint"].endswith("/v1")
    assert out["ControllerUrl"].startswith("http://") and out["ControllerUrl"].endswith(":8100")
    assert out["ClusterName"] == "prod" and out["ModelsPrefix"] == "models/"
    assert out["Shape1LaunchTemplate"] == stack["resources"]["Shape1LaunchTemplate"]
    assert out["Shape2LaunchTemplate"] == stack["resources"]["Shape2LaunchTemplate"]
    assert out["PrivateSubnetIds"] == stack["params"]["PrivateSubnetIds"]
    assert out["DatabaseEndpoint"].endswith(".rds.amazonaws.com")
    # Outputs of resources moto cannot make are absent there; the template has them.
    outputs = template()["Outputs"]
    assert outputs["ClusterTokenSecret"]["Value"] == {"Ref": "ClusterToken"}
    assert outputs["RedisReplicationGroup"]["Value"] == {"Ref": "Cache"}


def test_the_bucket_is_encrypted_versioned_private_and_tls_only(stack: dict[str, Any]) -> None:
    s3, bucket = client(stack, "s3"), stack["outputs"]["BucketName"]
    rule = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    # moto's bucket takes only encryption and tags from a template; the rest, and the
    # bucket policy it cannot make, are checked in the template.
    props = template()["Resources"]["Bucket"]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    tls = template()["Resources"]["BucketTlsOnly"]["Properties"]["PolicyDocument"]["Statement"]
    assert tls == [{"Sid": "TlsOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                    "Resource": [{"Fn::Sub": "arn:${AWS::Partition}:s3:::${Bucket}"},
                                 {"Fn::Sub": "arn:${AWS::Partition}:s3:::${Bucket}/*"}],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]


def test_secrets_and_redis_from_the_template(stack: dict[str, Any]) -> None:
    res = template()["Resources"]
    # The token is generated by Secrets Manager: never a parameter, never in user data.
    token = res["ClusterToken"]["Properties"]
    assert "SecretString" not in token and token["GenerateSecretString"]["PasswordLength"] >= 32
    assert not [p for p in template()["Parameters"] if "token" in p.lower() or "password" in p.lower()]
    assert "thaw-token" not in TEMPLATE.read_text().lower()
    db = res["Database"]["Properties"]
    assert db["MasterUserPassword"] == {"Fn::Sub": "{{resolve:secretsmanager:${DatabaseSecret}:SecretString:password}}"}
    cache = res["Cache"]["Properties"]
    assert cache["Engine"] == "redis" and cache["TransitEncryptionEnabled"] and cache["AtRestEncryptionEnabled"]
    assert cache["MultiAZEnabled"] and cache["AutomaticFailoverEnabled"]
    assert cache["SecurityGroupIds"] == [{"Ref": "CacheSecurityGroup"}]


def test_each_security_group_admits_exactly_the_documented_paths(stack: dict[str, Any]) -> None:
    ec2, r = client(stack, "ec2"), stack["resources"]
    groups = {g["GroupId"]: g for g in ec2.describe_security_groups(
        GroupIds=[r[n] for n in ("LoadBalancerSecurityGroup", "ActivatorSecurityGroup", "ControllerSecurityGroup",
                                 "ControlBalancerSecurityGroup", "WorkerSecurityGroup", "DatabaseSecurityGroup",
                                 "CacheSecurityGroup")])["SecurityGroups"]}

    def admits(name: str) -> set[tuple[int, int, str]]:
        out = set()
        for p in groups[r[name]]["IpPermissions"]:
            for pair in p.get("UserIdGroupPairs", []):
                source = next(k for k, v in r.items() if v == pair["GroupId"])
                out.add((p["FromPort"], p["ToPort"], source))
            for cidr in p.get("IpRanges", []):
                out.add((p["FromPort"], p["ToPort"], cidr["CidrIp"]))
        return out

    assert admits("LoadBalancerSecurityGroup") == {(443, 443, "203.0.113.0/24")}
    assert admits("ActivatorSecurityGroup") == {(8000, 8000, "LoadBalancerSecurityGroup")}
    assert admits("ControllerSecurityGroup") == {
        (8100, 8100, "ActivatorSecurityGroup"), (8100, 8100, "WorkerSecurityGroup"),
        (8100, 8100, "ControlBalancerSecurityGroup"), (8100, 8100, "ControllerSecurityGroup")}
    # Operators reach the controllers' internal load balancer from the OperatorCidr only.
    assert admits("ControlBalancerSecurityGroup") == {(8100, 8100, "ActivatorSecurityGroup"),
                                                      (8100, 8100, "WorkerSecurityGroup"),
                                                      (8100, 8100, "10.0.9.0/24")}
    assert admits("WorkerSecurityGroup") == {(8200, 8200, "ControllerSecurityGroup"),
                                             (8200, 65535, "ActivatorSecurityGroup")}
    assert admits("DatabaseSecurityGroup") == {(5432, 5432, "ControllerSecurityGroup")}
    assert admits("CacheSecurityGroup") == {(6379, 6379, "ActivatorSecurityGroup")}


def test_roles_are_least_privilege(stack: dict[str, Any]) -> None:
    bucket = f"arn:aws:s3:::{stack['outputs']['BucketName']}"
    roles = {name: statements(stack, name) for name in ("WorkerRole", "ControllerRole", "ActivatorRole")}
    for role, sts in roles.items():
        for sid, st in sts.items():
            assert st["Effect"] == "Allow"
            assert not any(a == "*" or a.endswith(":*") for a in as_list(st["Action"])), (role, sid)
            if "*" in as_list(st.get("Resource", [])):
                # Only what has no resource-level form.
                assert as_list(st["Action"]) == ["ec2:DescribeInstances"], (role, sid)

    worker = roles["WorkerRole"]
    assert {a for st in worker.values() for a in as_list(st["Action"])} == {
        "s3:ListBucket", "s3:GetObject", "s3:PutObject", "secretsmanager:GetSecretValue"}
    assert worker["WriteCapturedSnapshots"]["Resource"] == f"{bucket}/snapshots/*"
    assert set(worker["ReadWeightsSnapshotsAndConfig"]["Resource"]) == {
        f"{bucket}/models/*", f"{bucket}/snapshots/*", f"{bucket}/config/*"}
    assert worker["ListModelsAndSnapshots"]["Condition"] == {
        "StringLike": {"s3:prefix": ["models/*", "snapshots/*"]}}

    ctl = roles["ControllerRole"]
    account = "123456789012"
    templates = {f"arn:aws:ec2:{REGION}:{account}:launch-template/{stack['resources'][n]}"
                 for n in ("Shape1LaunchTemplate", "Shape2LaunchTemplate")}
    assert set(as_list(ctl["LaunchFromTheStacksTemplates"]["Condition"]["ArnEquals"]["ec2:LaunchTemplate"])) \
        == templates
    assert ctl["InstancesAndVolumesOfTheClusterOnly"]["Condition"] == {
        "StringEquals": {"aws:RequestTag/thaw:cluster": "prod"}}
    assert ctl["OnlyTheClustersInstances"]["Condition"] == {"StringEquals": {"ec2:ResourceTag/thaw:cluster": "prod"}}
    assert sorted(ctl["OnlyTheClustersInstances"]["Action"]) == [
        "ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"]
    assert ctl["TagOnlyAtLaunch"]["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances"
    worker_role = client(stack, "iam").get_role(RoleName=stack["resources"]["WorkerRole"])["Role"]["Arn"]
    assert ctl["PassOnlyTheWorkerRole"]["Resource"] == worker_role
    # The controller writes only batches' output and error files.
    assert {r for st in ctl.values() if any(a.startswith("s3:Put") for a in as_list(st["Action"]))
            for r in as_list(st["Resource"])} == {f"{bucket}/files/*"}

    act = roles["ActivatorRole"]
    writes = {r for st in act.values() for r in as_list(st.get("Resource", []))
              if {"s3:PutObject", "s3:DeleteObject"} & set(as_list(st["Action"]))}
    assert writes == {f"{bucket}/usage/*", f"{bucket}/files/*"}  # usage segments; tenants' uploaded files
    assert all("/models/*/" in r or r.endswith("/config/*")
               for r in act["ReadTokenizerFiles"]["Resource"]), "activators read tokenizer files, not weights"
    assert not any(r.endswith("/models/*") for st in act.values() for r in as_list(st.get("Resource", [])))
    # moto drops a Ref to a resource it cannot make (the secret): the template names it.
    res = template()["Resources"]
    for role, sid in (("WorkerRole", "ReadTheClusterToken"), ("ActivatorRole", "ReadTheClusterToken")):
        doc = res[role]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
        assert next(s for s in doc if s["Sid"] == sid)["Resource"] == {"Ref": "ClusterToken"}
    doc = res["ControllerRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    assert next(s for s in doc if s["Sid"] == "ReadTheTokenAndTheDatabasePassword")["Resource"] == [
        {"Ref": "ClusterToken"}, {"Ref": "DatabaseSecret"}]


def test_launch_templates_groups_balancers_database_and_logs(stack: dict[str, Any]) -> None:
    ec2, r = client(stack, "ec2"), stack["resources"]
    iam = client(stack, "iam")
    for name, itype, profile in (("Shape1LaunchTemplate", "g6e.xlarge", "WorkerInstanceProfile"),
                                 ("Shape2LaunchTemplate", "p5.48xlarge", "WorkerInstanceProfile"),
                                 ("ControllerLaunchTemplate", "t3.medium", "ControllerInstanceProfile"),
                                 ("ActivatorLaunchTemplate", "c7i.large", "ActivatorInstanceProfile")):
        data = ec2.describe_launch_template_versions(LaunchTemplateId=r[name])["LaunchTemplateVersions"][0][
            "LaunchTemplateData"]
        assert data["InstanceType"] == itype and data["MetadataOptions"]["HttpTokens"] == "required", name
        arn = iam.get_instance_profile(InstanceProfileName=r[profile])["InstanceProfile"]["Arn"]
        assert data["IamInstanceProfile"]["Arn"] == arn, name

    asg = client(stack, "autoscaling")
    groups = {g["AutoScalingGroupName"]: g for g in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[r["Controllers"], r["Activators"]])["AutoScalingGroups"]}
    ctl, act = groups[r["Controllers"]], groups[r["Activators"]]
    assert (ctl["MinSize"], ctl["MaxSize"]) == (2, 2)  # a leader and a standby
    assert (act["MinSize"], act["MaxSize"]) == (3, 8)

    elb = client(stack, "elbv2")
    api = elb.describe_target_groups(TargetGroupArns=[r["ActivatorTargets"]])["TargetGroups"][0]
    assert api["HealthCheckPath"] == "/healthz" and api["Port"] == 8000
    # moto takes no target group attributes from a template: the drain is checked there
    # (an activator leaving the balancer drains the longest stream).
    drain = template()["Resources"]["ActivatorTargets"]["Properties"]["TargetGroupAttributes"]
    assert drain == [{"Key": "deregistration_delay.timeout_seconds", "Value": {"Ref": "LongestStreamSeconds"}}]
    listener = elb.describe_listeners(ListenerArns=[r["ApiListener"]])["Listeners"][0]
    assert (listener["Protocol"], listener["Port"]) == ("HTTPS", 443)
    assert listener["Certificates"][0]["CertificateArn"] == stack["params"]["CertificateArn"]
    balancer = elb.describe_load_balancers(LoadBalancerArns=[r["ControlBalancer"]])["LoadBalancers"][0]
    assert balancer["Scheme"] == "internal"

    db = client(stack, "rds").describe_db_instances(DBInstanceIdentifier=r["Database"])["DBInstances"][0]
    assert db["Engine"] == "postgres" and db["StorageEncrypted"] and not db["PubliclyAccessible"]
    assert db["MultiAZ"]

    logs = client(stack, "logs").describe_log_groups(logGroupNamePrefix="/thaw/prod/")["logGroups"]
    assert {(g["logGroupName"], g.get("retentionInDays")) for g in logs} == {
        (f"/thaw/prod/{s}", 30) for s in ("controller", "activator", "worker")}


def thaw_cli(stack: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """A `thaw` command talking to the moto server as it would to AWS."""
    env = {"PATH": str(Path(sys.executable).parent), "AWS_ENDPOINT_URL": stack["kw"]["endpoint_url"],
           "AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": CREDS["aws_secret_access_key"],
           "AWS_DEFAULT_REGION": REGION, "HOME": "/nonexistent"}
    return subprocess.run([sys.executable, "-m", "thaw.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_thaw_aws_config_writes_a_config_that_checks(stack: dict[str, Any], tmp_path: Path) -> None:
    # moto cannot make the ElastiCache group, so the stack has no output naming it:
    # the command says so, and takes the Redis URL given instead.
    refused = thaw_cli(stack, "aws", "config", "--stack", "thaw-test")
    assert refused.returncode == 2 and "no output RedisReplicationGroup; give --redis-url" in refused.stderr
    out = tmp_path / "thaw.yaml"
    made = thaw_cli(stack, "aws", "config", "--stack", "thaw-test", "--redis-url", "rediss://limits.internal:6379/0",
                    "-o", str(out))
    assert made.returncode == 0, made.stderr
    as_json = thaw_cli(stack, "aws", "config", "--stack", "thaw-test", "--redis-url", "rediss://limits.internal:6379/0",
                       "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["config"] == yaml.safe_load(out.read_text())
    checked = thaw_cli(stack, "config", "check", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    cfg = yaml.safe_load(out.read_text())
    o, r = stack["outputs"], stack["resources"]
    assert cfg["cluster"]["name"] == "prod" and cfg["controller"]["urls"] == [o["ControllerUrl"]]
    assert cfg["state"] == {"backend": "postgres", "url": f"postgresql://thaw@{o['DatabaseEndpoint']}:5432/thaw"}
    assert cfg["limits"]["url"] == "rediss://limits.internal:6379/0"
    assert cfg["object_store"]["bucket"] == o["BucketName"] and cfg["object_store"]["credentials"] == {
        "source": "role"}
    assert cfg["object_store"]["allowed_prefixes"] == [f"s3://{o['BucketName']}/models/"]
    # A shape and an ec2 pool per launch template, as EC2 describes the instance type.
    assert [(s["name"], s["gpu_type"], s["gpu_count"], s["host_memory_gib"]) for s in cfg["shapes"]] == [
        ("g6e-xlarge", "l40s-45gb", 1, 32.0), ("p5-48xlarge", "h100-80gb", 8, 2048.0)]
    assert [(p["ec2"]["launch_template"], p["ec2"]["instance_types"]) for p in cfg["pools"]] == [
        (r["Shape1LaunchTemplate"], ["g6e.xlarge"]), (r["Shape2LaunchTemplate"], ["p5.48xlarge"])]
    assert all(p["ec2"]["subnets"] == stack["params"]["PrivateSubnetIds"].split(",") for p in cfg["pools"])
    # Names and addresses only: no secret value in it (the token is read by each service),
    # the secret named as the template names it.
    assert "token" not in cfg["cluster"] and cfg["cluster"]["token_secret"] == token_secret_name("prod")
    assert template()["Resources"]["ClusterToken"]["Properties"]["Name"] == {
        "Fn::Sub": token_secret_name("${ClusterName}")}
    missing = thaw_cli(stack, "aws", "config", "--stack", "nope", "--redis-url", "rediss://x:6379/0")
    assert missing.returncode == 1 and "cannot read stack 'nope'" in missing.stderr


def test_thaw_aws_check_says_what_is_missing(stack: dict[str, Any], tmp_path: Path) -> None:
    first = thaw_cli(stack, "aws", "check", "--stack", "thaw-test")
    assert first.returncode == 1
    # moto cannot make the secret, and the config is not uploaded yet.
    assert first.stdout.splitlines() == [
        "- the cluster token's secret does not exist",
        "- no config at config/thaw.yaml in the bucket: write it with `thaw aws config` and upload it"]
    as_json = thaw_cli(stack, "aws", "check", "--stack", "thaw-test", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout) == {
        "stack": "thaw-test", "ok": False, "problems": [line.removeprefix("- ") for line in first.stdout.splitlines()]}
    secret = client(stack, "secretsmanager").create_secret(Name=token_secret_name("prod"), SecretString="t")["ARN"]
    client(stack, "s3").put_object(Bucket=stack["outputs"]["BucketName"], Key="config/thaw.yaml", Body=b"x")
    second = thaw_cli(stack, "aws", "check", "--stack", "thaw-test")
    # Made outside the stack, the secret is not the one its roles name (moto drops a Ref to
    # a resource it cannot make): the check reads the roles as they are and says so.
    assert second.returncode == 1 and second.stdout.splitlines() == [
        f"- the {role} role cannot read the cluster token ({secret})" for role in ("activator", "controller", "worker")]
