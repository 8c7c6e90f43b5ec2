"""`thaw models deploy` on a CPU shape: eager unless told otherwise, and said in one
line (warm_pool.registry.models.eager_on_cpu decides; the CLI reads the revision the
controller answers). End to end against a real controller (no pools) over the session's
store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.thaw.controller_proc import controller_with_demo
from thaw.cli.main import main
from thaw.cli.models import eager_note
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint


def record(engine: dict[str, Any] | None, shape: str = "cpu-local") -> dict[str, Any]:
    spec: dict[str, Any] = {"uri": "s3://thaw/models/mine", "shape": shape}
    if engine is not None:
        spec["engine"] = engine
    return {"name": "mine", "revision": 1, "revisions": [{"revision": 1, "spec": spec}]}


def test_a_default_eager_engine_is_said_with_how_to_compile() -> None:
    note = eager_note({"uri": "s3://thaw/models/mine", "shape": "cpu-local"}, record({"enforce_eager": True}))
    assert note is not None and "\n" not in note
    assert "eager" in note and "'cpu-local'" in note and "--engine-arg enforce_eager=false" in note


@pytest.mark.parametrize(("sent", "engine"), [
    ({"engine": {"enforce_eager": True}}, {"enforce_eager": True}),  # asked for: nothing to say
    ({"engine": {"enforce_eager": False}}, {"enforce_eager": False}),  # compiled, as asked
    ({}, None),  # a GPU shape: the controller left it compiled
    ({"engine": {"dtype": "bfloat16"}}, {"dtype": "bfloat16"}),
])
def test_nothing_is_said_when_the_user_chose_or_nothing_was_chosen(sent: dict[str, Any],
                                                                    engine: dict[str, Any] | None) -> None:
    assert eager_note(sent, record(engine)) is None


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory, store: EmbeddedStore, s3: S3Endpoint,
               demo_model_dir: Path) -> Iterator[tuple[list[str], str]]:
    with controller_with_demo(tmp_path_factory.mktemp("deploy-default"), store, s3, demo_model_dir) as c:
        yield c


def thaw(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``thaw ARGV`` in this process: its stdout."""
    capsys.readouterr()
    assert main(list(argv)) == 0, capsys.readouterr()
    return capsys.readouterr().out


def test_a_deploy_on_a_cpu_shape_runs_eager_unless_told_compiled(
        controller: tuple[list[str], str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    c, uri = controller
    monkeypatch.delenv("THAW_ADMIN_KEY", raising=False)
    out = thaw(capsys, "models", "deploy", "first", "--uri", uri, "--shape", "cpu-local", *c).splitlines()
    assert out[0].startswith("deployed first revision 1") and len(out) == 2
    assert "eager" in out[1] and "--engine-arg enforce_eager=false" in out[1]
    shown = json.loads(thaw(capsys, "models", "show", "first", "--json", *c))
    assert shown["revisions"][-1]["spec"]["engine"] == {"enforce_eager": True}
    out = thaw(capsys, "models", "deploy", "compiled", "--uri", uri, "--shape", "cpu-local",
               "--engine-arg", "enforce_eager=false", *c).splitlines()
    assert len(out) == 1 and out[0].startswith("deployed compiled revision 1")
    shown = json.loads(thaw(capsys, "models", "show", "compiled", "--json", *c))
    assert shown["revisions"][-1]["spec"]["engine"] == {"enforce_eager": False}
