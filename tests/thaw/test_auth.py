"""The cluster token: where it comes from, and the middleware that requires it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from thaw.auth import ClusterAuth, TokenError, cluster_token, local_token, token_file
from thaw.config import ConfigError, ThawConfig, parse_config

SHAPES = [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}]


def cfg(tmp_path: Path, **cluster: object) -> ThawConfig:
    return parse_config({"data_dir": str(tmp_path), "shapes": SHAPES, "cluster": cluster})


def test_generated_once_mode_0600_and_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)
    c = cfg(tmp_path)
    first = cluster_token(c)
    assert len(first) >= 32
    assert stat.S_IMODE(os.stat(token_file(c)).st_mode) == 0o600
    # Every service on the machine reads the same one.
    assert cluster_token(c) == first == local_token(tmp_path)


def test_order_env_then_config_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)
    assert cluster_token(cfg(tmp_path, token="from-config")) == "from-config"
    monkeypatch.setenv("THAW_CLUSTER_TOKEN", "from-env")
    assert cluster_token(cfg(tmp_path, token="from-config")) == "from-env"
    assert not token_file(cfg(tmp_path)).exists()


def test_from_ssm_by_parameter_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)

    class Ssm:
        def get_parameter(self, Name: str, WithDecryption: bool) -> dict[str, dict[str, str]]:  # noqa: N803
            assert WithDecryption and Name == "/thaw/prod/token"
            return {"Parameter": {"Value": "from-ssm"}}

    assert cluster_token(cfg(tmp_path, token_ssm_parameter="/thaw/prod/token"), ssm_client=Ssm()) == "from-ssm"


def test_from_secrets_manager_before_ssm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)
    monkeypatch.delenv("THAW_CLUSTER_TOKEN_SECRET", raising=False)

    class Secrets:
        def get_secret_value(self, SecretId: str) -> dict[str, str]:  # noqa: N803
            assert SecretId == "thaw/prod/token"
            return {"SecretString": "from-secret\n"}

    c = cfg(tmp_path, token_secret="thaw/prod/token")
    assert cluster_token(c, secrets_client=Secrets()) == "from-secret"
    with pytest.raises(ConfigError, match="not both"):
        cfg(tmp_path, token_secret="a", token_ssm_parameter="b")

    class Empty:
        def get_secret_value(self, SecretId: str) -> dict[str, str]:  # noqa: N803
            return {"SecretBinary": "x"}

    with pytest.raises(TokenError, match="has no SecretString"):
        cluster_token(c, secrets_client=Empty())


def test_an_unreadable_token_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)
    c = cfg(tmp_path)
    token_file(c).write_text("")
    with pytest.raises(TokenError, match="is empty"):
        cluster_token(c)


def test_the_token_is_not_in_the_config_repr(tmp_path: Path) -> None:
    c = cfg(tmp_path, token="s3cret-token-value")
    assert "s3cret-token-value" not in repr(c) and "s3cret-token-value" not in c.model_dump_json()


async def test_middleware_401_everywhere_but_healthz() -> None:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/v1/state")
    async def state() -> dict[str, bool]:
        return {"secret": True}

    app.add_middleware(ClusterAuth, token="t0k")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as c:
        assert (await c.get("/healthz")).status_code == 200
        for headers in ({}, {"Authorization": "Bearer t0"}, {"Authorization": "Bearer t0kk"},
                        {"Authorization": "t0k"}, {"Authorization": "Basic t0k"}):
            r = await c.get("/v1/state", headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "cluster token" in r.json()["error"]
        assert (await c.get("/v1/state", headers={"Authorization": "Bearer t0k"})).json() == {"secret": True}
        # Unknown paths are refused before routing too (nothing is learnt without it).
        assert (await c.get("/nope")).status_code == 401
