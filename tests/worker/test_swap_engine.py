"""Weight swaps on real vLLM (CPU), through a real agent process and the store.

Two demo models of one engine class (different seeds); the second has its own chat
template and generation defaults. A swap must answer exactly as a freshly started
engine of the model it swapped in, in both orders, with everything around the
weights the new model's (served name, chat template, generation defaults); a prompt
cached under the previous model is no prefix-cache hit under the next; a released
replica goes back to standby with its engine and takes the next model by swap; a
swap that fails half-way (a shard failing its sha256, a shard the store no longer
has, a tensor of another shape) never serves.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BUCKET
from tests.faults.support import flip_byte
from tests.waiting import wait_until
from tests.worker.agent_process import Agent, running_agent
from tests.worker.shards import split_in_two_shards
from thaw.config import EngineArgs
from thaw.demo_model import build_demo_model
from thaw.engine_class import engine_class_of
from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

ENGINE = {"enforce_eager": True, "cpu_kvcache_gib": 1}
MAX_LEN = 512
LOAD_S = 240
PROMPT = "The quick brown fox jumps over the lazy dog and then it runs into the forest"
# The tensor the "lacking" model's checkpoint does not have.
LACKING = "model.layers.1.self_attn.v_proj.weight"
# Long enough for several prefix-cache blocks.
LONG = " ".join(f"Line {i}: the river carries old leaves past the mill at dawn." for i in range(14))


@pytest.fixture(scope="module")
def models(s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Model URIs in the store: a and b (one class), and broken: b's weights in two
    shards, the second corrupt, so a swap fails half-way (the first shard is in the
    engine when the second fails its sha256)."""
    root = tmp_path_factory.mktemp("swap-models")
    a, b = root / "a", root / "b"
    build_demo_model(a, seed=1)
    build_demo_model(b, seed=2)
    # b's own chat template (a prefix on every turn) and generation defaults.
    tc = json.loads((b / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{{ 'model b says: ' }}" + tc["chat_template"]
    (b / "tokenizer_config.json").write_text(json.dumps(tc))
    gc = json.loads((b / "generation_config.json").read_text())
    (b / "generation_config.json").write_text(json.dumps({**gc, "max_new_tokens": 5}))
    base = f"s3://{BUCKET}/tests/swap-{root.name}"
    uris = {"a": f"{base}/a", "b": f"{base}/b", "broken": f"{base}/broken"}
    for name, d in (("a", a), ("b", b)):
        push_model(s3.client(), d, uris[name])
    broken = root / "broken"
    shutil.copytree(b, broken)
    second = split_in_two_shards(broken)
    push_model(s3.client(), broken, uris["broken"])
    flip_byte(s3.client(), BUCKET, f"{uris['broken'].removeprefix(f's3://{BUCKET}/')}/{second}")
    # gone: the same two shards, the second deleted from the store after the push (the
    # manifest still lists it): the store fails the swap half-way.
    uris["gone"] = f"{base}/gone"
    push_model(s3.client(), broken, uris["gone"])
    s3.client().delete_object(Bucket=BUCKET, Key=f"{uris['gone'].removeprefix(f's3://{BUCKET}/')}/{second}")
    # misshapen: the second shard's first tensor one row short (its manifest agrees with
    # it, config.json does not): the shapes do not match the engine's.
    misshapen = root / "misshapen"
    shutil.copytree(broken, misshapen)
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(misshapen / second))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first][:-1].clone()
    save_file(tensors, str(misshapen / second), metadata={"format": "pt"})
    uris["misshapen"] = f"{base}/misshapen"
    push_model(s3.client(), misshapen, uris["misshapen"])
    # lacking: b without one layer's v_proj (its manifest agrees with it): every tensor
    # it has is whole and named as pushed, but the engine's fused qkv_proj of that layer
    # would keep the previous model's values where v goes.
    lacking = root / "lacking"
    shutil.copytree(b, lacking)
    tensors = load_file(str(lacking / "model.safetensors"))
    del tensors[LACKING]
    save_file(tensors, str(lacking / "model.safetensors"), metadata={"format": "pt"})
    uris["lacking"] = f"{base}/lacking"
    push_model(s3.client(), lacking, uris["lacking"])
    shutil.rmtree(root)
    return uris


@pytest.fixture(scope="module")
def engine_class(models: dict[str, str], s3: S3Endpoint) -> str:
    from thaw.objstore import read_model_config

    config = read_model_config(s3.client(), models["a"])
    assert config is not None
    return engine_class_of(config, EngineArgs(**ENGINE), max_model_len=MAX_LEN).id  # type: ignore[arg-type]


@pytest.fixture
def agent(s3: S3Endpoint, tmp_path: Path) -> Iterator[Agent]:
    with running_agent(tmp_path, "swap", s3) as a:
        a.wait_state("standby", timeout_s=180)
        yield a


def engine_processes_without(agent: Agent, library: str) -> list[str]:
    """The agent's Python descendants (the engine's processes) that do not map
    ``library``; fails when the machine lacks tcmalloc, which the set-up installs."""
    from worker.allocator import INSTALL_HINT, find_tcmalloc

    assert find_tcmalloc() is not None, f"tcmalloc is not installed: {INSTALL_HINT}"
    out = []
    for p in psutil.Process(agent.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "python" in Path(p.exe()).name and not any(library in m.path for m in p.memory_maps()):
                out.append(f"{p.pid} {p.name()}: {' '.join(p.cmdline())[:80]}")
    return out


def post_assign(agent: Agent, aid: str, uri: str, served: str, engine_class: str | None) -> None:
    with agent.http() as c:
        r = c.post("/assign", json={"assignment_id": aid, "model": served, "uri": uri, "served_model_name": served,
                                    "max_model_len": MAX_LEN, "engine": ENGINE, "engine_class": engine_class})
        assert r.status_code == 202, r.text


def assign(agent: Agent, aid: str, uri: str, served: str, engine_class: str | None) -> dict[str, Any]:
    post_assign(agent, aid, uri, served, engine_class)
    body, _ = agent.wait_state("ready", "failed", timeout_s=LOAD_S)
    assert body["state"] == "ready", body
    return body


def assign_failing(agent: Agent, aid: str, uri: str, served: str, engine_class: str) -> dict[str, Any]:
    """An assignment that must fail (never ready): the agent's state after it."""
    post_assign(agent, aid, uri, served, engine_class)
    failed, seen = agent.wait_state("failed", "ready", timeout_s=LOAD_S)
    assert failed["state"] == "failed" and "ready" not in seen, (failed, seen)
    assert "swapping the model into the engine failed" in failed["error"], failed["error"]
    return failed


def release(agent: Agent) -> dict[str, Any]:
    with agent.http() as c:
        assert c.post("/release", json={"drain_timeout_s": 5}).status_code == 202
    body, _ = agent.wait_state("standby", timeout_s=180)
    return body


def prebuild(agent: Agent, uri: str, engine_class: str) -> dict[str, Any]:
    with agent.http() as c:
        r = c.post("/prebuild", json={"model": "a", "uri": uri, "served_model_name": "a", "max_model_len": MAX_LEN,
                                      "engine": ENGINE, "engine_class": engine_class})
        assert r.status_code == 202, r.text

    def built() -> dict[str, Any] | None:
        body = agent.state()
        if (body.get("prebuilt") or {}).get("state") == "ready":
            return body
        assert body["state"] == "standby", (body, agent.log_tail())
        return None

    got: dict[str, Any] = wait_until("the prebuilt engine ready", built, LOAD_S, 0.2, detail=agent.log_tail)
    return got


def tensor_count(s3: S3Endpoint, uri: str) -> int:
    """How many tensors the model's manifest records."""
    from weight_streaming.push import read_manifest

    manifest = read_manifest(s3.client(), uri)
    assert manifest is not None
    return sum(len(f.tensors) for f in manifest.safetensors.values())


def answers(engine_url: str, served: str) -> dict[str, Any]:
    """Greedy answers: a completion's token ids, a chat's prompt size and default length."""
    with httpx.Client(base_url=engine_url, timeout=60, trust_env=False) as c:
        comp = c.post("/v1/completions", json={"model": served, "prompt": PROMPT, "max_tokens": 16,
                                               "temperature": 0, "return_token_ids": True})
        assert comp.status_code == 200, comp.text
        chat = c.post("/v1/chat/completions", json={"model": served, "temperature": 0,
                                                    "messages": [{"role": "user", "content": "Say hello."}]})
        assert chat.status_code == 200, chat.text
        names = [m["id"] for m in c.get("/v1/models").json()["data"]]
    return {"tokens": comp.json()["choices"][0]["token_ids"], "chat_prompt": chat.json()["usage"]["prompt_tokens"],
            "chat_len": chat.json()["usage"]["completion_tokens"], "names": names}


def prefix_hits(engine_url: str) -> float:
    text = httpx.get(f"{engine_url}/metrics", timeout=10, trust_env=False).text
    return sum(s.value for fam in text_string_to_metric_families(text) if fam.name == "vllm:prefix_cache_hits"
               for s in fam.samples if s.name.endswith("_total"))


def long_prompt(engine_url: str, served: str) -> None:
    r = httpx.post(f"{engine_url}/v1/completions", timeout=60, trust_env=False,
                   json={"model": served, "prompt": LONG, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text


def test_a_swap_answers_as_a_fresh_engine_in_both_orders(agent: Agent, models: dict[str, str],
                                                         engine_class: str, s3: S3Endpoint) -> None:
    # Fresh engines (no class named: nothing kept) give the reference answers.
    fresh = {}
    for name in ("a", "b"):
        body = assign(agent, f"fresh-{name}", models[name], name, None)
        assert body["load"]["swap"] is False and body["prebuilt"] is None
        fresh[name] = answers(body["engine_url"], name)
        release(agent)
    assert fresh["a"]["tokens"] != fresh["b"]["tokens"]
    # b's chat template and generation defaults differ from a's.
    assert fresh["b"]["chat_prompt"] > fresh["a"]["chat_prompt"] and fresh["b"]["chat_len"] <= 5 < fresh["a"]["chat_len"]

    prebuild(agent, models["a"], engine_class)
    swapped_b = assign(agent, "swap-b", models["b"], "b", engine_class)
    assert swapped_b["load"]["swap"] is True and swapped_b["phases"]["engine_ready"] is not None
    # Every tensor of b was checked against b's manifest, and the check was timed.
    assert swapped_b["load"]["tensors_verified"] == tensor_count(s3, models["b"])
    assert 0 < swapped_b["load"]["steps_s"]["verify_s"] <= swapped_b["load"]["steps_s"]["weights_s"]
    got = answers(swapped_b["engine_url"], "b")
    # The engine (host, forkserver, engine core, where the reload ran) runs on tcmalloc.
    assert engine_processes_without(agent, "libtcmalloc_minimal") == []
    assert got == {**fresh["b"], "names": ["b"]}
    # Released: back to standby with the engine (parked), then a takes it by swap.
    parked = release(agent)
    assert parked["prebuilt"]["state"] == "ready" and parked["prebuilt"]["model"] == "b"
    park = parked["prebuilt"]["park_steps_s"]
    assert set(park) == {"prefix_cache_s", "total_s"} and 0 < park["prefix_cache_s"] <= park["total_s"]
    swapped_a = assign(agent, "swap-a", models["a"], "a", engine_class)
    assert swapped_a["load"]["swap"] is True and swapped_a["engine_url"] == swapped_b["engine_url"]
    assert swapped_a["load"]["tensors_verified"] == tensor_count(s3, models["a"])
    assert answers(swapped_a["engine_url"], "a") == {**fresh["a"], "names": ["a"]}
    # The previous served name is gone with its model.
    r = httpx.post(f"{swapped_a['engine_url']}/v1/completions", timeout=30, trust_env=False,
                   json={"model": "b", "prompt": PROMPT, "max_tokens": 1})
    assert r.status_code == 404


def test_no_prefix_cache_hit_crosses_a_swap_and_a_failed_swap_never_serves(
        agent: Agent, models: dict[str, str], engine_class: str) -> None:
    prebuild(agent, models["a"], engine_class)
    a = assign(agent, "pc-a", models["a"], "a", engine_class)
    url = a["engine_url"]
    long_prompt(url, "a")
    before = prefix_hits(url)
    long_prompt(url, "a")
    assert prefix_hits(url) > before, "the same prompt under the same model is a hit (the probe works)"
    release(agent)
    b = assign(agent, "pc-b", models["b"], "b", engine_class)
    assert b["engine_url"] == url and b["load"]["swap"] is True
    before = prefix_hits(url)
    long_prompt(url, "b")
    assert prefix_hits(url) == before, "a prompt cached under a is no hit under b"
    long_prompt(url, "b")
    assert prefix_hits(url) > before
    release(agent)

    # b's weights in two shards, one byte of the second flipped: the first shard's
    # tensors are in the engine when the second fails the manifest's sha256. The
    # half-swapped engine is never served, and a fresh engine host follows.
    failed = assign_failing(agent, "broken", models["broken"], "broken", engine_class)
    assert "swapping the model into the engine failed (weights)" in failed["error"] and "sha256" in failed["error"]
    assert failed["engine_url"] is None and failed["prebuilt"] is None
    with pytest.raises(httpx.TransportError):
        # The dirty engine's process group is gone: nothing answers there any more.
        httpx.post(f"{url}/v1/completions", timeout=5, trust_env=False,
                   json={"model": "broken", "prompt": PROMPT, "max_tokens": 1})
    back = release(agent)
    assert back["prebuilt"] is None


@pytest.mark.parametrize("bad, kind", [("gone", "store"), ("misshapen", None), ("lacking", None)])
def test_a_swap_failing_half_way_in_the_store_or_on_shapes_never_serves(
        agent: Agent, models: dict[str, str], engine_class: str, bad: str, kind: str | None) -> None:
    # A kept engine of the class, then a model whose second shard the store cannot serve
    # (or whose tensors do not fit the engine's shapes): the first shard is in the engine
    # when the swap fails. Nothing is served from it; the engine goes with its host.
    prebuild(agent, models["a"], engine_class)
    failed = assign_failing(agent, bad, models[bad], bad, engine_class)
    if bad == "lacking":  # named: the layer, and the parts of it that did come
        assert ("the checkpoint does not fill every weight of these layers: model.layers.1.self_attn.qkv_proj "
                "(got weight[k], weight[q]: 98304/131072 elements)") in failed["error"], failed["error"]
        # q 256 x 256 and k 128 x 256 of the 256 + 128 + 128 rows of qkv_proj (v is the missing 128).
    if kind is not None:
        assert failed["failure_kind"] == kind, failed
    assert failed["engine_url"] is None and failed["prebuilt"] is None
    back = release(agent)
    assert back["prebuilt"] is None
    # The worker is whole again: the next model is served by a fresh engine.
    fresh = assign(agent, f"after-{bad}", models["a"], "a", None)
    assert answers(fresh["engine_url"], "a")["names"] == ["a"]


def test_a_byte_flipped_in_the_host_copy_after_the_fill_never_serves(
        s3: S3Endpoint, tmp_path: Path, models: dict[str, str], engine_class: str) -> None:
    """The worker's memory copy is checked when it is filled and not hashed again on a
    swap: one byte flipped in it afterwards is caught by its tensor's CRC-32, the swap
    fails naming the tensor, the engine goes, and the model is served right from the
    store next (its copy evicted)."""
    from weight_streaming.cache import DiskCache
    from weight_streaming.s3_loader import resolve_objects
    from weight_streaming.safetensors_header import read_header_from_file

    with running_agent(tmp_path, "swap-cached", s3, host_cache_gib=1) as agent:
        agent.wait_state("standby", timeout_s=180)
        fresh_a = answers(assign(agent, "fresh-a", models["a"], "a", None)["engine_url"], "a")
        release(agent)
        prebuild(agent, models["b"], engine_class)  # b from the store: a's copy stays in memory
        [obj] = resolve_objects(s3.client(), models["a"])
        host = DiskCache(tmp_path / "host-cache", 1 << 30)
        entry = host.lookup(obj.bucket, obj.key, obj.etag, obj.size)
        assert entry is not None, "a's weights are in the host tier"
        header = read_header_from_file(str(entry))
        name, t = next((n, t) for n, t in header.tensors.items() if "layers.1.mlp.down_proj" in n)
        with open(entry, "r+b") as f:
            f.seek(header.data_offset + t.begin + t.nbytes // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))

        failed = assign_failing(agent, "flipped", models["a"], "a", engine_class)
        assert f"tensor '{name}' does not match the manifest" in failed["error"], failed["error"]
        assert "(read from host)" in failed["error"] and failed["engine_url"] is None
        assert host.lookup(obj.bucket, obj.key, obj.etag, obj.size) is None  # evicted
        release(agent)
        again = assign(agent, "a-again", models["a"], "a", None)
        assert again["load"]["sources"] == {"s3": obj.size}
        assert answers(again["engine_url"], "a") == fresh_a

