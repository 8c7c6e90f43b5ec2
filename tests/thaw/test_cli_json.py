"""Every `thaw` command that lists or changes something answers --json with one JSON
document on stdout, and the old names still work, saying their new one: against a real
controller (`thaw controller`, no pools) over the session's store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.thaw.controller_proc import controller_with_demo
from thaw.cli.aliases import deprecation_line
from thaw.cli.main import main
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory, store: EmbeddedStore, s3: S3Endpoint,
               demo_model_dir: Path) -> Iterator[tuple[list[str], str]]:
    with controller_with_demo(tmp_path_factory.mktemp("cli-json"), store, s3, demo_model_dir) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THAW_ADMIN_KEY", raising=False)
    monkeypatch.delenv("THAW_CONFIG", raising=False)


def thaw(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> tuple[str, str]:
    """``thaw ARGV`` in this process: its stdout and stderr."""
    capsys.readouterr()
    assert main(list(argv)) == code, capsys.readouterr()
    out = capsys.readouterr()
    return out.out, out.err


def as_json(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> Any:
    out, err = thaw(capsys, *argv, "--json", code=code)
    return json.loads(out)  # one document, nothing else on stdout


def test_tenant_and_key_commands_answer_json(controller: tuple[list[str], str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    c, _ = controller
    made = as_json(capsys, "tenants", "create", "json-t", "--requests-per-minute", "60", *c)
    assert made["name"] == "json-t" and made["limits"]["requests_per_minute"] == 60
    key = as_json(capsys, "tenants", "keys", "add", "json-t", "--label", "ci", *c)
    assert key["key"].startswith("thaw-")  # the secret, once, in the document
    listed = as_json(capsys, "tenants", "ls", *c)["tenants"]
    mine = next(t for t in listed if t["name"] == "json-t")
    assert [(k["label"], k["status"]) for k in mine["keys"]] == [("ci", "active")]
    assert key["key"].startswith(mine["keys"][0]["key"])  # listed by its prefix only
    assert as_json(capsys, "tenants", "show", "json-t", *c)["name"] == "json-t"
    keys = as_json(capsys, "tenants", "keys", "ls", "json-t", *c)["keys"]
    assert [k["tenant"] for k in keys] == ["json-t"]
    assert as_json(capsys, "tenants", "limits", "set", "json-t", "--tokens-per-minute", "500",
                   *c)["limits"]["tokens_per_minute"] == 500
    assert as_json(capsys, "tenants", "models", "set", "json-t", "demo", *c)["allowed_models"] == ["demo"]
    assert as_json(capsys, "tenants", "keys", "revoke", key["key"], *c)["revoked"] == 1
    assert as_json(capsys, "tenants", "rm", "json-t", *c)["removed_at"] is not None
    admin = as_json(capsys, "admin-keys", "add", "--label", "ci", *c)
    assert admin["key"].startswith("thawadmin-")
    assert [k["label"] for k in as_json(capsys, "admin-keys", "ls", *c)["keys"]] == ["ci"]
    assert as_json(capsys, "admin-keys", "revoke", admin["key"], *c)["revoked"] == 1


def test_model_and_apply_commands_answer_json(controller: tuple[list[str], str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    c, uri = controller
    deployed = as_json(capsys, "models", "deploy", "json-m", "--uri", uri, "--shape", "cpu-local",
                       "--prompt-usd-per-mtok", "2", *c)
    assert deployed["name"] == "json-m" and deployed["revision"] == 1
    assert "json-m" in [m["name"] for m in as_json(capsys, "models", "ls", *c)]
    updated = as_json(capsys, "models", "update", "json-m", "--max-replicas", "2", *c)
    assert updated["revision"] == 2
    assert as_json(capsys, "models", "rollback", "json-m", *c)["revision"] == 3
    shown = as_json(capsys, "models", "show", "json-m", *c)
    assert [r["revision"] for r in shown["revisions"]] == [1, 2, 3]
    assert shown["revisions"][0]["spec"]["pricing"]["prompt_usd_per_mtok"] == 2
    assert as_json(capsys, "models", "rm", "json-m", *c)["revision"] is None
    declared = tmp_path / "tenants.yaml"
    declared.write_text(yaml.safe_dump({"tenants": [{"name": "json-apply"}]}))
    plan = as_json(capsys, "apply", "-f", str(declared), "--dry-run", *c)
    assert plan["applied"] is False and ("tenant", "json-apply", "create") in [
        (ch["kind"], ch["name"], ch["action"]) for ch in plan["changes"]]
    assert as_json(capsys, "apply", "-f", str(declared), *c)["applied"] is True


def test_pool_batch_and_config_commands_answer_json(controller: tuple[list[str], str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    c, _ = controller
    assert "models" in as_json(capsys, "pool", "status", *c)
    assert "events" in as_json(capsys, "pool", "events", *c)
    assert as_json(capsys, "pool", "budget", "set", "--total-budget-usd-per-hour", "7", *c)["total_usd_per_hour"] == 7
    assert as_json(capsys, "pool", "budget", "show", *c)["total_usd_per_hour"] == 7
    assert "now" in as_json(capsys, "pool", "clock", *c)
    assert as_json(capsys, "batches", "ls", *c)["data"] == []
    checked = as_json(capsys, "config", "check", str(EXAMPLE), "--assume-size", "20MiB")
    assert checked["ok"] is True and checked["problems"] == []


def test_config_check_json_says_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: 3\n")
    checked = as_json(capsys, "config", "check", str(bad), code=2)
    assert checked["ok"] is False and checked["problems"]


@pytest.mark.parametrize(("argv", "old", "new"), [
    (["tenants", "add", "json-old"], "'thaw tenants add'", "'thaw tenants keys add'"),
    (["models", "describe", "demo"], "'thaw models describe'", "'thaw models show'"),
    (["tenants", "limits", "set", "json-old", "--rpm", "30"], "--rpm", "--requests-per-minute"),
])
def test_old_names_still_work_and_say_the_new_one(controller: tuple[list[str], str], argv: list[str], old: str,
                                                  new: str, capsys: pytest.CaptureFixture[str]) -> None:
    c, _ = controller
    thaw(capsys, "tenants", "create", "json-old", *c)
    try:
        out, err = thaw(capsys, *argv, *c)
        assert out.strip()
        said = [line for line in err.splitlines() if line.startswith("thaw: ")]
        assert said == [deprecation_line(old, new)]
        assert said[0] == f"thaw: {old} is now {new}; the old name goes in the next release"
    finally:
        thaw(capsys, "tenants", "rm", "json-old", *c)
