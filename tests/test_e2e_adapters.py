"""LoRA adapters as models, end to end: `thaw up` with the demo model as the base of two
adapters (built with `thaw demo-model --adapter-of`, pushed like any model), real vLLM on
the CPU, through the activator with the official openai client. An adapter's answers
differ from its base's and equal vLLM's own serving the same adapter; an adapter idles
out while its base keeps serving the other; usage is metered under the adapter's name;
a tenant cannot reach another tenant's adapter."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import BUCKET
from tests.e2e_stack import KEY, Stack, running_stack
from tests.faults.support import ledger_rows
from tests.waiting import wait_until
from thaw.demo_adapter import build_demo_adapter
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

OTHER_KEY = "thaw-other-tenant-key"
A1_IDLE_GRACE_S = 4
PROMPTS = ["Hello there", "The cat sat on", "Count to five:"]
MAX_LORA_RANK = 8


def model(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in st["models"] if m["name"] == name)


def complete(client: openai.OpenAI, name: str, prompt: str, rid: str | None = None) -> str:
    out = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0,
                                    extra_headers={"x-request-id": rid} if rid else None)
    return out.choices[0].text


@contextlib.contextmanager
def plain_vllm(base: Path, adapter: Path, tmp: Path) -> Iterator[str]:
    """vLLM's own OpenAI server with the adapter as a static LoRA module (no Thaw)."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    log = open(tmp / "plain-vllm.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(base), "--served-model-name",
         "base", "--enforce-eager", "--max-model-len", "2048", "--dtype", "bfloat16", "--seed", "0",
         "--port", str(port), "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16",
         "--lora-modules", f"a1={adapter}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, f"plain vLLM exited:\n{(tmp / 'plain-vllm.log').read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            return False

        wait_until("plain vLLM to start", healthy, 300, 0.5,
                   detail=lambda: (tmp / "plain-vllm.log").read_text()[-3000:])
        yield f"{url}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def adapters(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("adapters")
    out = {}
    for name, seed in (("a1", 1), ("a2", 2)):
        build_demo_adapter(tmp / name, demo_model_dir, rank=MAX_LORA_RANK, seed=seed)
        out[name] = tmp / name
    return out


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path, adapters: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("adapters-e2e")
    uris = {}
    for name, path in adapters.items():
        uris[name] = f"s3://{BUCKET}/e2e/adapter-{name}-{tmp.name}"
        push_model(s3.client(), path, uris[name])

    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["engine"] = {**demo.get("engine", {}), "enforce_eager": True}
        demo["autoscaling"].update({"idle_grace_s": 3600, "activation_timeout_s": 300})
        for name, grace in (("a1", A1_IDLE_GRACE_S), ("a2", 3600)):
            cfg["models"].append({"name": name, "base": "demo", "adapter_uri": uris[name],
                                  "autoscaling": {"idle_grace_s": grace, "activation_timeout_s": 300}})
        cfg["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 1})
        tenant = cfg["tenants"][0]
        tenant["allowed_models"] = ["demo", "a1"]
        cfg["tenants"].append({**tenant, "name": "other", "allowed_models": ["demo", "a2"],
                               "api_key_hashes": ["sha256:" + hashlib.sha256(OTHER_KEY.encode()).hexdigest()]})

    with running_stack(store, s3, demo_model_dir, tmp, configure) as s:
        yield s


def test_an_adapter_answers_as_vllm_serving_it_and_not_as_its_base(
        stack: Stack, demo_model_dir: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    client = stack.client()
    base = [complete(client, "thaw-demo", p) for p in PROMPTS]
    rid = uuid.uuid4().hex
    first = complete(client, "a1", PROMPTS[0], rid=rid)
    st = stack.wait_for("a1's cold start recorded", lambda s: model(s, "a1")["last_cold_start"])
    assert model(st, "a1")["last_cold_start"]["tier"] == "adapter"
    thaw = [first] + [complete(client, "a1", p) for p in PROMPTS[1:]]
    assert thaw != base, "the adapter changes nothing"
    with plain_vllm(demo_model_dir, adapters["a1"], tmp_path) as url:
        plain = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        assert [complete(plain, "a1", p) for p in PROMPTS] == thaw
        assert [complete(plain, "base", p) for p in PROMPTS] == base
    # Metered under the adapter's name, for its tenant.
    rows = wait_until("the adapter's request metered", lambda: ledger_rows(stack.data_dir).get(rid), 30, 0.3)
    assert rows[0]["model"] == "a1" and rows[0]["tenant"] == "demo", rows


def test_another_tenants_adapter_is_not_reachable(stack: Stack) -> None:
    other = openai.OpenAI(base_url=stack.base_url, api_key=OTHER_KEY, max_retries=0, timeout=300)
    with pytest.raises(openai.APIStatusError) as info:
        complete(other, "a1", "Hi")
    assert info.value.status_code in (403, 404), info.value
    with pytest.raises(openai.APIStatusError) as info:
        complete(stack.client(), "a2", "Hi")
    assert info.value.status_code in (403, 404), info.value
    assert complete(other, "a2", "Hi")


def test_an_adapter_scales_to_zero_while_its_base_serves_another(stack: Stack) -> None:
    client, other = stack.client(), openai.OpenAI(base_url=stack.base_url, api_key=OTHER_KEY, max_retries=0,
                                                  timeout=300)
    assert complete(client, "a1", "Hi") and complete(other, "a2", "Hi")

    def adapters_held(s: dict[str, Any]) -> dict[str, str]:
        return {a["model"]: a["state"] for d in s["worker_details"] for a in d.get("adapters", [])}

    stack.wait_for("both adapters ready", lambda s: adapters_held(s) == {"a1": "ready", "a2": "ready"})
    # a1 idles out (4 s); a2 is used meanwhile and stays, and so does the base.
    def a1_idled_out() -> bool:
        if "a1" not in adapters_held(stack.state()):
            return True
        assert complete(other, "a2", "Hi")
        return False

    wait_until("a1 to idle out while a2 is used", a1_idled_out, 90, 1,
               detail=lambda: str(stack.state()["worker_details"]))
    st = stack.state()
    assert adapters_held(st) == {"a2": "ready"}, st["worker_details"]
    assert model(st, "a1")["replicas"] == {} and model(st, "demo")["replicas"] == {"ready": 1}
    assert complete(client, "thaw-demo", "Hi") is not None
    # Asked again, it is loaded again.
    assert complete(client, "a1", "Hi")
    assert KEY
