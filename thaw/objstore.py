"""How to reach the object store: endpoint and credentials, resolved from config; and
reading a model's config.json from it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from thaw.config import ThawConfig
from thaw.s3errors import is_missing_key
from thaw.s3uri import join_key, parse_s3_uri


class StoreConfigError(RuntimeError):
    pass


@dataclass(frozen=True)
class S3Endpoint:
    """How to reach an S3 store: everything a client (boto3, runai streamer) needs.

    Without keys, clients use the AWS default credential chain (an instance role).
    """

    endpoint_url: str | None
    access_key: str | None
    # Never in a repr (logs, tracebacks).
    secret_key: str | None = field(repr=False)
    region: str = "us-east-1"

    def client(self, **config: object):  # type: ignore[no-untyped-def]
        """A boto3 S3 client, path-style, with retries suited to a local store."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=botocore.config.Config(
                **{
                    "s3": {"addressing_style": "path"},
                    "retries": {"max_attempts": 5, "mode": "standard"},
                    **config,
                }  # type: ignore[arg-type]
            ),
        )

    def env(self) -> dict[str, str]:
        """Environment for child processes (vLLM with the runai streamer, the AWS CLI)."""
        env = {
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        }
        if self.access_key and self.secret_key:
            # Explicit keys: nothing should look for an instance role.
            env.update({"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                        "AWS_EC2_METADATA_DISABLED": "true"})
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        return env



def worker_endpoint(cfg: ThawConfig, environ: dict[str, str] | None = None) -> S3Endpoint:
    """How a worker reaches the store: the config's endpoint with credentials from the
    worker's own environment (the local provider puts the store's keys there), else the
    AWS default chain (the instance role). Never from the controller."""
    env = os.environ if environ is None else environ
    access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    store = cfg.object_store
    return S3Endpoint(store.resolved_endpoint_url, access or None, secret or None, store.region)


def embedded_store_root(cfg: ThawConfig) -> Path:
    return cfg.data_dir / "store"


def resolve_endpoint(cfg: ThawConfig) -> S3Endpoint:
    """Endpoint and credentials for ``cfg.object_store``.

    For the embedded store the credentials are the generated ones kept under the data
    dir (created by `thaw store up`); for S3 they come from the environment, a file, or
    (``role``) boto3's default chain.
    """
    store = cfg.object_store
    creds = store.credentials
    if creds.source == "generated":
        path = embedded_store_root(cfg) / "credentials.json"
        if not path.exists():
            raise StoreConfigError(f"no credentials at {path}: start the store first (`thaw store up`)")
        data = json.loads(path.read_text())
        access, secret = data["access_key"], data["secret_key"]
    elif creds.source == "role":
        return S3Endpoint(store.resolved_endpoint_url, None, None, store.region)
    elif creds.source == "file":
        assert creds.file is not None
        path = creds.file if creds.file.is_absolute() else cfg.data_dir / creds.file
        try:
            data = json.loads(path.read_text())
            access, secret = data["access_key"], data["secret_key"]
        except (OSError, ValueError, KeyError) as exc:
            raise StoreConfigError(
                f"object_store.credentials.file {path}: cannot read access_key/secret_key ({exc})"
            ) from None
    else:
        access = os.environ.get(creds.access_key_env, "")
        secret = os.environ.get(creds.secret_key_env, "")
        if not access or not secret:
            raise StoreConfigError(
                f"object_store.credentials: set {creds.access_key_env} and {creds.secret_key_env}"
            )
    return S3Endpoint(store.resolved_endpoint_url, access, secret, store.region)


# The manifest `thaw push` writes last next to a model's files (weight_streaming.manifest).
MANIFEST_NAME = "thaw-manifest.json"


def read_json_object(client: Any, uri: str, name: str) -> Any | None:
    """The JSON object ``name`` under the model prefix ``uri``, or None when the store has
    no such key. ``client``: a boto3 S3 client. Blocking."""
    bucket, prefix = parse_s3_uri(uri)
    try:
        obj = client.get_object(Bucket=bucket, Key=join_key(prefix, name))
    except botocore.exceptions.ClientError as exc:
        if is_missing_key(exc):
            return None
        raise
    return json.loads(obj["Body"].read())


def read_model_config(client: Any, uri: str) -> dict[str, Any] | None:
    """The model's ``config.json`` at ``uri`` (a few KiB), or None when it has none.
    ``client``: a boto3 S3 client. Blocking."""
    config = read_json_object(client, uri, "config.json")
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"{uri}/config.json is not a JSON object")
    return config


def read_weights_bytes(client: Any, uri: str) -> int | None:
    """The bytes of the model's files at ``uri`` as its manifest says (``total_bytes``),
    or None when it has no manifest. ``client``: a boto3 S3 client. Blocking."""
    manifest = read_json_object(client, uri, MANIFEST_NAME)
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("total_bytes"), int):
        raise ValueError(f"{uri}/{MANIFEST_NAME} has no total_bytes")
    return int(manifest["total_bytes"])


class WeightsProblem(ValueError):
    """The weights at a URI cannot be served as they are: no manifest, a malformed one,
    or files that are missing or differ from what it lists."""


@dataclass(frozen=True)
class WeightsCheck:
    """Weights found complete: the sha256 of their manifest (it names every file's
    sha256, so it names the weights) and their bytes."""

    manifest_sha256: str
    total_bytes: int


def check_weights(client: Any, uri: str) -> WeightsCheck:
    """Check that the store holds the model at ``uri`` as its manifest lists it: every
    file present with the size and ETag the manifest gives (a HEAD each, no data read).
    Raises :class:`WeightsProblem`. ``client``: a boto3 S3 client. Blocking."""
    import hashlib

    bucket, prefix = parse_s3_uri(uri)
    try:
        raw = client.get_object(Bucket=bucket, Key=join_key(prefix, MANIFEST_NAME))["Body"].read()
    except botocore.exceptions.ClientError as exc:
        if is_missing_key(exc):
            raise WeightsProblem(f"no manifest at {uri.rstrip('/')}/{MANIFEST_NAME}: push the model with "
                                 "`thaw push DIR URI` (an interrupted push leaves none)") from None
        raise
    try:
        manifest = json.loads(raw)
        files = manifest["files"]
        total = int(manifest["total_bytes"])
        entries = [(str(f["path"]), int(f["size"]), str(f["etag"]).strip('"')) for f in files]
    except (ValueError, KeyError, TypeError) as exc:
        raise WeightsProblem(f"the manifest at {uri} is malformed ({type(exc).__name__}: {exc})") from None
    if not entries:
        raise WeightsProblem(f"the manifest at {uri} lists no files")
    for path, size, etag in entries:
        key = join_key(prefix, path)
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if is_missing_key(exc):
                raise WeightsProblem(f"{uri.rstrip('/')}/{path} is listed in the manifest but not in the "
                                     "store") from None
            raise
        got_size, got_etag = int(head["ContentLength"]), str(head["ETag"]).strip('"')
        if got_size != size or got_etag != etag:
            raise WeightsProblem(f"{uri.rstrip('/')}/{path} does not match the manifest (size {got_size} of "
                                 f"{size}, ETag {got_etag} of {etag}): pushed again since? push the model again")
    return WeightsCheck(hashlib.sha256(raw).hexdigest(), total)
