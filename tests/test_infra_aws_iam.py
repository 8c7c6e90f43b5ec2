"""The stack's IAM, enforced: each service runs its own code with its own role's policies
against a moto server that holds every call to them (``tests.aws_iam``), and does its
job; each is refused a call outside its role, so this test fails if a policy is widened.

- the controller (the ec2 provider, configured by `thaw aws config`) launches a worker
  from the stack's launch template, stops, starts and terminates it; it cannot terminate
  another cluster's instance nor launch from a launch template outside the stack; its
  batch runner reads a batch's input file and writes the output file, and nothing else;
- the worker reads its model (manifest, files and the weights, streamed and verified),
  writes a snapshot and reads the cluster token; it cannot write under the models prefix;
- the activator reads the model's tokenizer, ships a usage segment and keeps a tenant's
  uploaded file (the Files API); it cannot read the weights;
- and as a fleet: `thaw controller` runs with the config `thaw aws config` wrote (with
  the loopback's addresses and a CPU shape put in) and the controller's keys: it reads
  the cluster token from Secrets Manager, launches its standby from the stack's launch
  template, and a `thaw worker` with the worker's keys, standing in for that instance,
  reads the token and registers; the first model is deployed (the controller checks its
  files in the store with its role).

moto's STS cannot assume a role whose trust names the EC2 service, so each service runs
as an IAM user that holds exactly its role's inline policies as the stack made them.
moto cannot make the Secrets Manager secrets either: the test creates the cluster token
under the template's name and puts its ARN where the policies ``Ref`` it (moto drops a
``Ref`` to a resource it cannot make; test_infra_aws checks the template names it).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aioboto3
import boto3
import botocore.exceptions
import httpx
import pytest
import yaml

from activator.batch.files import store_upload
from activator.ledger import Ledger, UsageRecord
from activator.shipping import UsageShipper
from activator.tokens import TokenCounter, s3_fetcher
from snapshotter.archive import create_archive
from snapshotter.store import SnapshotLocation, read_snapshot_manifest, upload_snapshot
from tests.moto_stack import STACK_NAME, as_list, client, deploy, role_policies
from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer
from tests.waiting import wait_until
from tests.warm_pool.moto_ec2 import CREDS, REGION, moto_server
from thaw.aws_stack import token_secret_name
from thaw.config import BatchConfig, parse_config
from thaw.embedded_store import free_port
from thaw.process import stop_group
from thaw.wire import NewBatch, NewFile
from warm_pool.batch.files import FileIndex
from warm_pool.batch.runner import BatchRunner
from warm_pool.batch.store import BatchStore
from warm_pool.db import Db
from warm_pool.providers.ec2 import Ec2Provider
from weight_streaming.fetch import fetch_model_files
from weight_streaming.push import push_model, read_manifest
from weight_streaming.s3_loader import load_s3, manifest_sha256

pytestmark = pytest.mark.integration

TOKEN = "token-from-secrets-manager"


@pytest.fixture(scope="module")
def aws(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The stack in a moto server that enforces IAM, the demo model pushed, the cluster
    token stored, and one IAM user per service role holding that role's policies."""
    with moto_server(enforce_iam=True) as url:
        stack = deploy(url)
        assert stack["status"] == "CREATE_COMPLETE"
        bucket = stack["outputs"]["BucketName"]
        secret = client(stack, "secretsmanager").create_secret(
            Name=token_secret_name("prod"), SecretString=TOKEN)["ARN"]
        push_model(client(stack, "s3"), demo_model_dir, f"s3://{bucket}/models/demo")
        iam = client(stack, "iam")
        keys = {}
        for role in ("ControllerRole", "WorkerRole", "ActivatorRole"):
            user = f"thaw-{role.lower()}"
            iam.create_user(UserName=user)
            for n, doc in enumerate(role_policies(stack, role)):
                for st in doc["Statement"]:
                    if "secretsmanager:GetSecretValue" in as_list(st["Action"]):
                        st["Resource"] = secret
                iam.put_user_policy(UserName=user, PolicyName=f"p{n}", PolicyDocument=json.dumps(doc))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[role] = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
        raw = _config(stack, tmp_path_factory.mktemp("aws-iam"))
        yield {**stack, "bucket": bucket, "keys": keys, "secret": secret, "raw": raw, "config": parse_config(raw),
               "url": url}


def _config(stack: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """`thaw aws config` for the stack, pointed at the moto server."""
    env = {"PATH": str(Path(sys.executable).parent), "AWS_ENDPOINT_URL": stack["kw"]["endpoint_url"],
           "AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": CREDS["aws_secret_access_key"],
           "AWS_DEFAULT_REGION": REGION, "HOME": "/nonexistent"}
    out = tmp / "thaw.yaml"
    made = subprocess.run([sys.executable, "-m", "thaw.cli.main", "aws", "config", "--stack", STACK_NAME,
                           "--redis-url", "redis://127.0.0.1:6379/0", "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    data = yaml.safe_load(out.read_text())
    for pool in data["pools"]:
        pool["ec2"]["endpoint_url"] = stack["kw"]["endpoint_url"]
    return data  # type: ignore[no-any-return]


def as_role(aws: dict[str, Any], role: str, service: str) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=aws["url"], **aws["keys"][role])


def denied(exc: pytest.ExceptionInfo[botocore.exceptions.ClientError]) -> bool:
    return exc.value.response["Error"]["Code"] in ("AccessDenied", "UnauthorizedOperation",
                                                     "AccessDeniedException")


# -- the controller --------------------------------------------------------------------------


def controller(aws: dict[str, Any]) -> Ec2Provider:
    cfg = aws["config"]
    keys = aws["keys"]["ControllerRole"]
    return Ec2Provider(
        cluster=cfg.cluster.name, pools={p.shape: p.ec2 for p in cfg.pools if p.ec2 is not None},
        controller_url=cfg.controller.resolved_urls[0], token_ssm_parameter=None,
        token_secret=cfg.cluster.token_secret,
        session=aioboto3.Session(aws_access_key_id=keys["aws_access_key_id"],
                                 aws_secret_access_key=keys["aws_secret_access_key"], region_name=REGION))


def test_the_controller_runs_only_this_clusters_workers(aws: dict[str, Any]) -> None:
    cfg = aws["config"]
    shape = cfg.pools[0].shape
    ec2 = client(aws, "ec2")

    async def lifecycle() -> str:
        provider = controller(aws)
        try:
            launched = await provider.launch(shape, "w-iam-1")
            assert [i.instance_id for i in await provider.instances()] == [launched.instance_id]
            await provider.stop(launched.instance_id)
            await provider.start(launched.instance_id)
            await provider.terminate(launched.instance_id)
            return launched.instance_id
        finally:
            await provider.close()

    instance_id = asyncio.run(lifecycle())
    [made] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"]
    tags = {t["Key"]: t["Value"] for t in made["Tags"]}
    assert tags["thaw:cluster"] == "prod" and tags["thaw:worker-id"] == "w-iam-1"
    assert made["State"]["Name"] == "terminated"

    mine = as_role(aws, "ControllerRole", "ec2")
    # Another cluster's instance: refused, and it keeps running.
    other = ec2.run_instances(ImageId=made["ImageId"], MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "thaw:cluster", "Value": "staging"}]}])["Instances"][0]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        mine.terminate_instances(InstanceIds=[other["InstanceId"]])
    assert denied(info), info.value
    with pytest.raises(botocore.exceptions.ClientError) as info:
        mine.stop_instances(InstanceIds=[other["InstanceId"]])
    assert denied(info), info.value
    assert ec2.describe_instances(InstanceIds=[other["InstanceId"]])["Reservations"][0]["Instances"][0][
        "State"]["Name"] == "running"
    # A launch template outside the stack, though tagged as the cluster's: refused.
    foreign = ec2.create_launch_template(LaunchTemplateName="not-the-stacks", LaunchTemplateData={
        "ImageId": made["ImageId"], "InstanceType": "g6e.xlarge"})["LaunchTemplate"]["LaunchTemplateId"]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        mine.run_instances(LaunchTemplate={"LaunchTemplateId": foreign}, MinCount=1, MaxCount=1,
                           SubnetId=cfg.pools[0].ec2.subnets[0], TagSpecifications=[
                               {"ResourceType": "instance", "Tags": [{"Key": "thaw:cluster", "Value": "prod"}]}])
    assert denied(info), info.value
    # The stack's template without the cluster's tag: refused.
    with pytest.raises(botocore.exceptions.ClientError) as info:
        mine.run_instances(LaunchTemplate={"LaunchTemplateId": cfg.pools[0].ec2.launch_template}, MinCount=1,
                           MaxCount=1, SubnetId=cfg.pools[0].ec2.subnets[0])
    assert denied(info), info.value


async def test_the_controller_runs_a_batch_over_the_tenants_files(aws: dict[str, Any]) -> None:
    """The batch runner with the controller's role: reads an input file an activator
    stored, writes the output file; it may not write anywhere else."""
    bucket, db = aws["bucket"], Db.sqlite(None)
    files, store = FileIndex(db), BatchStore(db)
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "demo", "messages": []}}).encode() + b"\n"
    key = "files/acme/file-input0001"
    store_upload(as_role(aws, "ActivatorRole", "s3"), bucket, key, io.BytesIO(line), BatchConfig())
    files.add(NewFile(id="file-input0001", tenant="acme", filename="in.jsonl", purpose="batch", bytes=len(line),
                      lines=1, key=key), 1.0)
    runner = BatchRunner(store, files, lambda: as_role(aws, "ControllerRole", "s3"), bucket, "files/",
                         resolver=lambda tenant: {"demo": "demo"}.get, clock=time.time)
    batch = store.create(NewBatch(tenant="acme", input_file_id="file-input0001", endpoint="/v1/chat/completions"),
                         "batch_iam", time.time())
    await runner.tick()
    [leased] = store.lease("act", ["demo"], 1, time.time(), 60)
    store.finish(batch.id, leased.line, response={"status_code": 200, "request_id": "r", "body": {}}, at=time.time())
    await runner.tick()
    done = store.get("acme", batch.id)
    assert done is not None and done.status == "completed" and done.output_file_id is not None
    written = files.get("acme", done.output_file_id)
    assert written is not None and client(aws, "s3").head_object(Bucket=bucket, Key=written.key)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        as_role(aws, "ControllerRole", "s3").put_object(Bucket=bucket, Key="models/demo/x.json", Body=b"{}")
    assert denied(info), info.value


# -- the worker --------------------------------------------------------------------------------


def test_the_worker_reads_its_model_and_writes_a_snapshot_only(aws: dict[str, Any], tmp_path: Path) -> None:
    s3, bucket = as_role(aws, "WorkerRole", "s3"), aws["bucket"]
    uri = f"s3://{bucket}/models/demo"
    manifest = read_manifest(s3, uri)
    assert manifest is not None
    files = fetch_model_files(s3, uri, tmp_path / "files")
    assert (files / "config.json").exists()
    loaded = load_s3(s3, uri, verify_sha256=manifest_sha256(manifest))
    assert loaded.tensors

    cache = tmp_path / "cache"
    (cache / "torchinductor").mkdir(parents=True)
    (cache / "torchinductor" / "kernel.so").write_bytes(b"\0" * 4096)
    info = create_archive(cache, tmp_path / "snap.tar.gz")
    loc = SnapshotLocation.for_model(uri, "demo", "f" * 16)
    upload_snapshot(s3, loc, info, {"model": "demo"}, created_by="w-iam")
    assert read_snapshot_manifest(s3, loc) is not None

    token = as_role(aws, "WorkerRole", "secretsmanager").get_secret_value(SecretId=token_secret_name("prod"))
    assert token["SecretString"] == TOKEN

    with pytest.raises(botocore.exceptions.ClientError) as info_:
        s3.put_object(Bucket=bucket, Key="models/demo/model.safetensors", Body=b"overwritten")
    assert denied(info_), info_.value
    with pytest.raises(botocore.exceptions.ClientError) as info_:
        s3.put_object(Bucket=bucket, Key="usage/forged/segment.ndjson", Body=b"{}")
    assert denied(info_), info_.value
    # It lists the models and snapshots it reads, not the tenants' usage or files.
    for prefix in ("usage/", "files/", ""):
        with pytest.raises(botocore.exceptions.ClientError) as info_:
            s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
        assert denied(info_), (prefix, info_.value)


# -- the activator -----------------------------------------------------------------------------


def test_the_activator_reads_tokenizers_and_ships_usage_only(aws: dict[str, Any], tmp_path: Path) -> None:
    s3, bucket = as_role(aws, "ActivatorRole", "s3"), aws["bucket"]
    uri = f"s3://{bucket}/models/demo"
    tokenizer = asyncio.run(TokenCounter(s3_fetcher(s3)).get(uri))
    assert tokenizer is not None

    ledger_path = tmp_path / "ledger.db"

    async def write() -> None:
        ledger = Ledger(ledger_path)
        try:
            await ledger.append(UsageRecord(
                request_id="r1", tenant="t", model="demo", status=200, error_code=None, prompt_tokens=3,
                completion_tokens=4, cached_tokens=0, usage_source="engine", queue_ms=0.0, ttft_ms=1.0,
                duration_ms=2.0, cold_start=False, cancelled=False, stream=True, replica="demo-1",
                started_at=1.0, finished_at=2.0))
        finally:
            ledger.close()

    asyncio.run(write())
    shipper = UsageShipper(ledger_path, "a-iam", s3, bucket, prefix="usage/")
    assert shipper.ship_blocking() == 1
    shipped = client(aws, "s3").list_objects_v2(Bucket=bucket, Prefix="usage/a-iam/")["Contents"]
    assert shipped

    # The Files API's store calls: an upload kept, read back and deleted.
    key = "files/acme/file-0123456789abcdef"
    assert store_upload(s3, bucket, key, io.BytesIO(b'{"custom_id": "a"}\n'), BatchConfig()) == (19, 1)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b'{"custom_id": "a"}\n'
    s3.delete_object(Bucket=bucket, Key=key)

    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.get_object(Bucket=bucket, Key="models/demo/model.safetensors")
    assert denied(info), info.value
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.put_object(Bucket=bucket, Key="snapshots/demo/x/manifest.json", Body=b"{}")
    assert denied(info), info.value
    with pytest.raises(botocore.exceptions.ClientError) as info:
        store_upload(s3, bucket, "models/demo/forged.jsonl", io.BytesIO(b"{}\n"), BatchConfig())
    assert denied(info), info.value


# -- the fleet, with the config `thaw aws config` wrote ------------------------------------


def role_env(aws: dict[str, Any], role: str) -> dict[str, str]:
    keys = aws["keys"][role]
    return {**os.environ, "AWS_ENDPOINT_URL": aws["url"], "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": keys["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": keys["aws_secret_access_key"]}


@contextmanager
def thaw_process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "thaw.cli.main", *argv], stdout=f, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc, 30)


def wait_for(what: str, pred: Any, procs: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float = 90) -> Any:
    def found() -> Any:
        for proc, log in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{log.stem} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        return pred()

    return wait_until(what, found, timeout_s, 0.2,
                      detail=lambda: "\n" + "\n".join(log.read_text()[-2000:] for _, log in procs))


def test_the_fleet_runs_with_the_generated_config(aws: dict[str, Any], postgres: PostgresServer,
                                                   tmp_path: Path, request: pytest.FixtureRequest) -> None:
    raw = json.loads(json.dumps(aws["raw"]))
    port = free_port()
    shape = raw["shapes"][0]
    # The loopback's addresses, and the first GPU shape made a CPU one so that a worker
    # process can stand in for its instance; the rest is as `thaw aws config` wrote it.
    raw["data_dir"] = str(tmp_path)
    raw["controller"].update({"host": "127.0.0.1", "port": port, "urls": [f"http://127.0.0.1:{port}"]})
    raw["state"]["url"] = postgres.database("thaw_aws_fleet")
    shape.pop("gpu_memory_gib")
    shape.update({"gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                  "cache": {"dir": str(tmp_path / "cache"), "max_gib": 1}})
    raw["pools"][0].update({"standby_min": 1, "standby_max": 1})
    raw["cluster"].update({"heartbeat_interval_s": 0.5, "worker_timeout_s": 30})
    # The limits store: a redis-server on loopback in place of ElastiCache.
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    request.addfinalizer(redis.stop)
    raw["limits"]["url"] = redis.url
    api_port = free_port()
    cfg_path = tmp_path / "thaw.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    assert parse_config(raw).cluster.token_secret == token_secret_name("prod")
    ec2 = client(aws, "ec2")
    template = aws["outputs"]["Shape1LaunchTemplate"]

    def standby() -> list[dict[str, Any]]:
        found = ec2.describe_instances(Filters=[{"Name": "tag:thaw:cluster", "Values": ["prod"]},
                                                {"Name": "tag:thaw:shape", "Values": [shape["name"]]},
                                                {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return [i for r in found["Reservations"] for i in r["Instances"]]

    ctl_log, worker_log = tmp_path / "controller.log", tmp_path / "worker.log"
    with thaw_process(["controller", "--config", str(cfg_path)], role_env(aws, "ControllerRole"), ctl_log) as ctl:
        procs = [(ctl, ctl_log)]
        [inst] = wait_for("the standby launched from the stack's template", standby, procs)
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        # EC2 (and moto) tag an instance with the launch template it came from.
        assert tags["aws:ec2launchtemplate:id"] == template
        worker_id = tags["thaw:worker-id"]
        argv = ["worker", "--config", str(cfg_path), "--shape", shape["name"], "--instance-id", inst["InstanceId"],
                "--worker-id", worker_id, "--port", str(free_port()), "--data-dir", str(tmp_path / "worker")]
        with thaw_process(argv, role_env(aws, "WorkerRole"), worker_log) as worker:
            procs.append((worker, worker_log))
            token = {"Authorization": f"Bearer {TOKEN}"}

            def registered() -> list[dict[str, Any]]:
                try:
                    state = httpx.get(f"http://127.0.0.1:{port}/v1/state", headers=token, timeout=5).json()
                except httpx.HTTPError:
                    return []
                return [w for w in state.get("workers", []) if w["id"] == worker_id and w["state"] == "standby"]

            [row] = wait_for("the worker registered, standing by", registered, procs, timeout_s=120)
            assert row["instance_id"] == inst["InstanceId"]
            # The first model: the controller reads its manifest and config.json and checks
            # each weight file is there, with its role.
            deploy = subprocess.run(
                [sys.executable, "-m", "thaw.cli.main", "models", "deploy", "demo", "--uri",
                 f"s3://{aws['bucket']}/models/demo", "--shape", shape["name"], "--config", str(cfg_path)],
                capture_output=True, text=True, timeout=60, env={**os.environ, "THAW_CLUSTER_TOKEN": TOKEN})
            assert deploy.returncode == 0, deploy.stdout + deploy.stderr
            state = httpx.get(f"http://127.0.0.1:{port}/v1/state", headers=token, timeout=5).json()
            assert [m["name"] for m in state["models"]] == ["demo"]

            # An activator with its role's keys: it reads the token from Secrets Manager,
            # follows the controller, and counts a prompt with the model's tokenizer read
            # from the store (a prompt past the context is refused before any engine).
            def thaw_cli(*argv: str) -> str:
                out = subprocess.run([sys.executable, "-m", "thaw.cli.main", *argv, "--config", str(cfg_path)],
                                     capture_output=True, text=True, timeout=60,
                                     env={**os.environ, "THAW_CLUSTER_TOKEN": TOKEN})
                assert out.returncode == 0, out.stdout + out.stderr
                return out.stdout

            thaw_cli("tenants", "create", "acme")  # every model, by default
            key = thaw_cli("tenants", "keys", "add", "acme").strip()
            act_log = tmp_path / "activator.log"
            argv = ["activator", "--config", str(cfg_path), "--host", "127.0.0.1", "--port", str(api_port),
                    "--id", "act-iam"]
            with thaw_process(argv, role_env(aws, "ActivatorRole"), act_log) as act:
                procs.append((act, act_log))
                api = f"http://127.0.0.1:{api_port}/v1"
                auth = {"Authorization": f"Bearer {key}"}

                def listed() -> list[str]:
                    try:
                        r = httpx.get(f"{api}/models", headers=auth, timeout=5)
                    except httpx.HTTPError:
                        return []
                    return [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []

                assert wait_for("the activator serving the catalog", listed, procs)
                long = {"model": listed()[0], "max_tokens": 4,
                        "messages": [{"role": "user", "content": "many words " * 20_000}]}
                r = httpx.post(f"{api}/chat/completions", headers=auth, json=long, timeout=60)
                assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    # Nothing was refused on the way.
    for log in (ctl_log, worker_log, tmp_path / "activator.log"):
        assert "AccessDenied" not in log.read_text(), log.read_text()[-2000:]
