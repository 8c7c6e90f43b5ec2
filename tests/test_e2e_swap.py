"""Engines built ahead, end to end: `thaw up` with a pool that pre-builds the demo
model's engine class. The controller learns the classes from the store, the standby
builds an engine, a request at zero for a fine-tune of the same class (another seed)
is served by a swap, through the activator, with the official openai client; released,
the replica goes back to standby with its engine, and the next model takes it by swap
again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_stack import Stack, push_demo, running_stack
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

IDLE_GRACE_S = 3


def model(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in st["models"] if m["name"] == name)


def kept_engine(st: dict[str, Any]) -> dict[str, Any] | None:
    """The built engine of a worker standing by with one ready (None: none yet; the
    pool's worker may not even be launched)."""
    states = {r["id"]: r["state"] for r in st["workers"]}
    for w in st["worker_details"]:
        p = w.get("prebuilt")
        if states.get(w["id"]) == "standby" and p and p["state"] == "ready":
            return p  # type: ignore[no-any-return]
    return None


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("swap-e2e")
    tuned_uri = push_demo(s3, tmp, "tuned", seed=7)

    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["engine"] = {**demo.get("engine", {}), "enforce_eager": True}
        demo["autoscaling"].update({"idle_grace_s": IDLE_GRACE_S, "activation_timeout_s": 240})
        cfg["models"].append({**demo, "name": "tuned", "served_name": "tuned", "uri": tuned_uri})
        cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 1, "prebuild": ["demo"]})

    with running_stack(store, s3, demo_model_dir, tmp, configure) as s:
        s.wait_for("a standby holding a built engine", kept_engine, timeout_s=300)
        yield s


def test_a_request_at_zero_is_served_by_a_swap_and_the_engine_is_kept(stack: Stack) -> None:
    st = stack.state()
    built = kept_engine(st)
    assert built is not None and built["model"] == "demo"
    # The operators' view names the class both models share (thaw models ls shows it).
    assert model(st, "demo")["engine_class"] == model(st, "tuned")["engine_class"] == built["engine_class"]
    out = stack.client().chat.completions.create(model="tuned", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in out if c.choices)
    assert text
    record = stack.wait_for("the cold start recorded", lambda s: model(s, "tuned")["last_cold_start"])
    rec = model(record, "tuned")["last_cold_start"]
    assert rec["tier"] == "swap" and rec["weights_from"] in ("host", "disk", "s3"), rec
    # Idle: released, parked; the worker stands by with the engine, now holding tuned.
    st = stack.wait_for("back to standby with the engine",
                        lambda s: (p := kept_engine(s)) is not None and p["model"] == "tuned", timeout_s=120)
    assert kept_engine(st)["engine_class"] == built["engine_class"]  # type: ignore[index]
    # The next model of the class takes the same engine by swap.
    done = stack.client().completions.create(model="thaw-demo", prompt="Hello", max_tokens=3)
    assert done.choices[0].text is not None
    st = stack.wait_for("demo's cold start recorded", lambda s: model(s, "demo")["last_cold_start"])
    assert model(st, "demo")["last_cold_start"]["tier"] == "swap"
    assert len(st["workers"]) == 1  # one instance did all of it
