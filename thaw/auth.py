"""The cluster token: every control-plane call between Thaw's services carries it.

Where it comes from, first found wins: ``THAW_CLUSTER_TOKEN`` in the environment,
``cluster.token`` in the config, the Secrets Manager secret named by
``cluster.token_secret`` (or ``THAW_CLUSTER_TOKEN_SECRET``), the SSM parameter named by
``cluster.token_ssm_parameter`` (or ``THAW_CLUSTER_TOKEN_SSM_PARAMETER``), else
``<data_dir>/cluster-token``, generated on first use (mode 0600) so that services on one
machine share it.

Servers check it with :class:`ClusterAuth` (an ASGI middleware: every path but the open
ones answers 401 without it); clients send it with :func:`bearer`. The token is never
logged, and nothing here puts it in a repr.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from thaw.config import ThawConfig
from thaw.private_files import open_private
from thaw.wire import ErrorReply

TOKEN_ENV = "THAW_CLUSTER_TOKEN"
SSM_ENV = "THAW_CLUSTER_TOKEN_SSM_PARAMETER"
SECRET_ENV = "THAW_CLUSTER_TOKEN_SECRET"
TOKEN_FILE = "cluster-token"
OPEN_PATHS = frozenset({"/healthz"})
# The security scheme's name in the controller's and the workers' /openapi.json.
SCHEME = "clusterToken"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TokenError(RuntimeError):
    """The cluster token cannot be had (unreadable file, SSM refused...)."""


def token_file(cfg: ThawConfig) -> Path:
    return cfg.data_dir / TOKEN_FILE


def cluster_token(cfg: ThawConfig, *, ssm_client: Any = None, secrets_client: Any = None) -> str:
    """The cluster token for this deployment (see the module docstring for the order)."""
    env = os.environ.get(TOKEN_ENV)
    if env:
        return env
    if cfg.cluster.token is not None:
        return cfg.cluster.token.get_secret_value()
    secret = os.environ.get(SECRET_ENV) or cfg.cluster.token_secret
    if secret:
        return _from_secrets_manager(secret, secrets_client)
    param = os.environ.get(SSM_ENV) or cfg.cluster.token_ssm_parameter
    if param:
        return _from_ssm(param, ssm_client)
    return _from_file(token_file(cfg))


def _from_ssm(name: str, client: Any) -> str:
    import boto3
    import botocore.exceptions

    try:
        client = client or boto3.client("ssm")
        value = client.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise TokenError(f"cannot read the cluster token from SSM parameter {name!r}: {exc}") from None
    if not value:
        raise TokenError(f"SSM parameter {name!r} is empty")
    return str(value)


def _from_secrets_manager(secret_id: str, client: Any) -> str:
    import boto3
    import botocore.exceptions

    try:
        client = client or boto3.client("secretsmanager")
        value = client.get_secret_value(SecretId=secret_id).get("SecretString")
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise TokenError(f"cannot read the cluster token from secret {secret_id!r}: {exc}") from None
    if not value or not value.strip():
        raise TokenError(f"secret {secret_id!r} has no SecretString")
    return str(value).strip()


def _from_file(path: Path) -> str:
    """Read the token file, creating it first if nobody has (O_EXCL: one writer wins).
    Created 0600 in a directory nobody else may write to (see thaw.private_files)."""
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TokenError(f"cannot create the cluster token at {path}: {exc}") from None
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    try:
        # A reader may race the writer between open and write: wait for the bytes.
        for _ in range(50):
            value = path.read_text().strip()
            if value:
                return value
            time.sleep(0.02)
    except OSError as exc:
        raise TokenError(f"cannot read the cluster token at {path}: {exc.strerror}") from None
    raise TokenError(f"the cluster token file {path} is empty")


def local_token(data_dir: Path) -> str:
    """The token a `thaw up` (or any service) generated in ``data_dir`` (tools on the same
    machine: benchmarks, probes)."""
    return _from_file(Path(data_dir) / TOKEN_FILE)


def bearer(token: str) -> dict[str, str]:
    """Headers for a control-plane call."""
    return {"Authorization": f"Bearer {token}"}


class ClusterAuth:
    """ASGI middleware: 401 for any request without the cluster token, but on
    ``open_paths``. The comparison takes the same time wherever the tokens differ."""

    def __init__(self, app: ASGIApp, token: str, open_paths: frozenset[str] = OPEN_PATHS, *,
                 also: Callable[[str, bytes], bool] | None = None) -> None:
        """``also(path, authorization)``: another credential this path admits (the
        controller's admin keys on ``/v1/admin/``)."""
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.open_paths = open_paths
        self._also = also

    def __repr__(self) -> str:
        return f"ClusterAuth(open_paths={sorted(self.open_paths)})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        got = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                got = value
                break
        if hmac.compare_digest(got, self._expected) or (self._also is not None and self._also(scope["path"], got)):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "this endpoint needs the cluster token "
                                    "(Authorization: Bearer <token>)"}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]})
        await send({"type": "http.response.body", "body": body})


def document_cluster_auth(openapi: dict[str, Any], open_paths: frozenset[str] = OPEN_PATHS) -> dict[str, Any]:
    """Declare in an app's OpenAPI document what :class:`ClusterAuth` enforces: the
    bearer scheme on every operation but ``open_paths``, and their 401 answer."""
    openapi.setdefault("components", {}).setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http", "scheme": "bearer", "description": "The cluster token (see `thaw.auth`)."}
    refused = {"description": "No cluster token, or the wrong one",
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}}
    schemas = openapi["components"].setdefault("schemas", {})
    if "ErrorReply" not in schemas:
        schema = ErrorReply.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}), ErrorReply=schema)
    for path, operations in openapi.get("paths", {}).items():
        for operation in operations.values():
            if path in open_paths:
                operation["security"] = []
            else:
                operation["security"] = [{SCHEME: []}]
                operation.setdefault("responses", {}).setdefault("401", refused)
    return openapi
