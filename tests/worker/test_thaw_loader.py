"""``--load-format thaw``: vLLM (CPU) loads the demo model from the store with Thaw's streamer.

- the same greedy tokens as with ``runai_streamer``, both from ``--model s3://...``;
- weights that are missing, malformed or incomplete fail the load with the URI and
  the reason, and through the engine host the engine never answers ``/health``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from weight_streaming.manifest import parse_s3_uri
from weight_streaming.push import push_model
from worker.launch import LaunchCommand, decode_event, engine_env

pytestmark = [pytest.mark.integration, pytest.mark.engine]

PROMPT = "The capital of France is"

# One engine per process: a fresh interpreter per load format.
GENERATE = textwrap.dedent(
    """
    import json, sys
    from weight_streaming.vllm_loader import register
    register()
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], load_format=sys.argv[2], enforce_eager=True, max_model_len=512, seed=0)
    out = llm.generate([sys.argv[3]], SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    print("RESULT " + json.dumps({"token_ids": list(out.token_ids), "text": out.text}))
    """
)


def _engine_env(s3: S3Endpoint, tmp: Path) -> dict[str, str]:
    return {
        **os.environ, **s3.env(),
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "VLLM_ASSETS_CACHE": str(tmp / "vllm-cache" / "assets"),
    }


def _generate(uri: str, load_format: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", GENERATE, uri, load_format, PROMPT], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{load_format}: vLLM failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])  # type: ignore[no-any-return]


def test_thaw_loader_generates_the_same_greedy_tokens_as_runai(
    s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path
) -> None:
    push_model(s3.client(), demo_model_dir, s3_prefix)
    env = _engine_env(s3, tmp_path)
    thaw = _generate(s3_prefix, "thaw", env)
    runai = _generate(s3_prefix, "runai_streamer", env)
    assert len(thaw["token_ids"]) == 12
    assert thaw["token_ids"] == runai["token_ids"]


# --- failures ---------------------------------------------------------------------------------


def _damage(s3: S3Endpoint, uri: str, name: str, body: bytes | None) -> None:
    """Replace (or with ``body`` None, delete) one file of a pushed model."""
    bucket, prefix = parse_s3_uri(uri)
    client = s3.client()
    if body is None:
        client.delete_object(Bucket=bucket, Key=f"{prefix}/{name}")
    else:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)


def _fake_model(names: list[str]) -> Any:
    """A module with one parameter per name whose ``load_weights`` reports what it got,
    as vLLM's models do."""
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.ParameterDict({n.replace(".", "_"): nn.Parameter(torch.zeros(1)) for n in names})

        def named_parameters(self, *a: Any, **kw: Any) -> Any:  # the checkpoint's names
            return iter((n, self.p[n.replace(".", "_")]) for n in names)

        def load_weights(self, weights: Any) -> set[str]:
            return {name for name, _ in weights if name in names}

    return Model()


@pytest.fixture(scope="module")
def vllm_loader() -> Any:
    return pytest.importorskip("weight_streaming.vllm_loader")


@pytest.fixture
def store_env(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    # The loader reads the store's endpoint and credentials from the environment.
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)


def test_missing_weights_fail_with_the_uri(
    vllm_loader: Any, store_env: None, s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str
) -> None:
    push_model(s3.client(), demo_model_dir, s3_prefix)
    _damage(s3, s3_prefix, "model.safetensors", None)
    from vllm.config.load import LoadConfig

    loader = vllm_loader.ThawModelLoader(LoadConfig(load_format="thaw"))
    cfg = SimpleNamespace(model="/unused", model_weights=s3_prefix, quantization=None)
    with pytest.raises(vllm_loader.ThawLoadError, match=r"no \*\.safetensors") as info:
        loader.download_model(cfg)
    assert s3_prefix in str(info.value)
    with pytest.raises(vllm_loader.ThawLoadError, match=r"no \*\.safetensors"):
        loader.load_weights(_fake_model(["a"]), cfg)


def test_a_parameter_the_checkpoint_lacks_fails_the_load(
    vllm_loader: Any, store_env: None, s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str
) -> None:
    from safetensors import safe_open

    push_model(s3.client(), demo_model_dir, s3_prefix)
    with safe_open(str(demo_model_dir / "model.safetensors"), "pt") as f:
        present = sorted(f.keys())
    from vllm.config.load import LoadConfig

    loader = vllm_loader.ThawModelLoader(LoadConfig(load_format="thaw"))
    cfg = SimpleNamespace(model="/unused", model_weights=s3_prefix, quantization=None)
    loader.load_weights(_fake_model(present), cfg)  # complete: fine
    with pytest.raises(vllm_loader.ThawLoadError, match="does not provide these parameters: extra.weight"):
        loader.load_weights(_fake_model([*present, "extra.weight"]), cfg)


def test_unknown_extra_config_is_refused_by_name(vllm_loader: Any) -> None:
    from vllm.config.load import LoadConfig

    with pytest.raises(ValueError, match=r"\['chunk_size'\].*valid: \["):
        vllm_loader.ThawModelLoader(LoadConfig(load_format="thaw", model_loader_extra_config={"chunk_size": 1}))
    opts = vllm_loader.StreamOptions.from_extra_config({"concurrency": 16, "chunk_mib": 4})
    assert (opts.concurrency, opts.chunk_bytes) == (16, 4 << 20)


def test_corrupt_weights_fail_the_engine_start_through_the_engine_host(
    s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path
) -> None:
    """The real path: the engine core reports the loader's reason and the engine host
    exits; /health never answers, so no replica ever serves a half-loaded model."""
    import httpx

    push_model(s3.client(), demo_model_dir, s3_prefix)
    # A header length far past the end of the file.
    _damage(s3, s3_prefix, "model.safetensors", (10**9).to_bytes(8, "little") + b"{}" * 64)
    env = {**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_NO_USAGE_STATS": "1",
           "PYTHONUNBUFFERED": "1", "THAW_AGENT_PID": str(os.getpid())}
    proc = subprocess.Popen([sys.executable, "-m", "worker.engine_host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        events = _events_until(proc, "imported")
        assert events[-1]["event"] == "imported"
        engine = EngineArgs(load_format="thaw", enforce_eager=True)
        port = free_port()
        cmd = LaunchCommand(uri=s3_prefix, served_model_name="demo", max_model_len=512, engine=engine,
                            port=port, env=engine_env(engine, s3.env(), str(tmp_path)))
        proc.stdin.write(cmd.model_dump_json().encode() + b"\n")
        proc.stdin.flush()
        events = _events_until(proc, "failed")
        failed = [e for e in events if e["event"] == "failed"]
        assert failed, f"no failed event: {events}"
        reason = failed[0]["error"]
        assert "ThawLoadError" in reason and s3_prefix in reason and "header" in reason, reason
        print(f"\nthe engine's reported failure: {reason}")
        assert proc.wait(timeout=60) == 1
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)


def _events_until(proc: subprocess.Popen[bytes], event: str, timeout_s: float = 300) -> list[dict[str, Any]]:
    """Events from the engine host's stdout up to and including the first ``event``
    (or until it exits)."""
    assert proc.stdout is not None
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = proc.stdout.readline()
        if not raw:
            return out
        ev = decode_event(raw.decode(errors="replace"))
        if ev is not None:
            out.append(ev)
            if ev["event"] == event:
                return out
    raise AssertionError(f"no {event!r} event within {timeout_s:.0f} s: {out}")


def test_a_swap_checks_every_tensor_and_refuses_a_corrupt_host_copy_naming_it(
    vllm_loader: Any, store_env: None, s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path
) -> None:
    """The weights a swap reads (FileByFileWeights): each tensor checked against the
    manifest; the worker's memory copy, checked when it was filled, is not hashed again,
    so one byte flipped in it after the fill is caught by its tensor's CRC-32, named,
    and the copy evicted (the next swap reads the store)."""
    import torch

    from tests.waiting import wait_until
    from weight_streaming.cache import DiskCache
    from weight_streaming.s3_loader import resolve_objects
    from weight_streaming.safetensors_header import read_header_from_file

    manifest = push_model(s3.client(), demo_model_dir, s3_prefix)
    n_tensors = sum(len(f.tensors) for f in manifest.safetensors.values())
    host_dir = tmp_path / "host"
    options = vllm_loader.StreamOptions.from_extra_config(
        {"host_cache_dir": str(host_dir), "host_cache_max_gib": 1, "verify_sha256": True})
    assert options.verify_tensors is True  # the default

    def swap_read() -> tuple[dict[str, Any], dict[str, bytes]]:
        weights = vllm_loader.FileByFileWeights(s3_prefix, options)
        got = {name: bytes(t.contiguous().view(-1).view(torch.uint8).numpy()) for name, t in weights}
        return weights.summary, got

    first, tensors = swap_read()
    assert first["sources"] == {"s3": manifest.total_bytes - _non_weight_bytes(manifest)}
    assert first["tensors_verified"] == n_tensors == len(tensors) and first["verify_s"] > 0
    [obj] = resolve_objects(s3.client(), s3_prefix)
    cache = DiskCache(host_dir, 1 << 30)
    entry = wait_until("the host copy committed", lambda: cache.lookup(obj.bucket, obj.key, obj.etag, obj.size))
    second, again = swap_read()
    assert second["sources"] == {"host": obj.size} and again == tensors  # mapped, not read
    assert 0 < second["read_s"] <= second["seconds"]

    # One byte of the last tensor's data, flipped in the memory copy after the fill.
    header = read_header_from_file(str(entry))
    last = max(header.tensors, key=lambda n: header.tensors[n].end)
    with open(entry, "r+b") as f:
        f.seek(header.data_offset + header.tensors[last].end - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(vllm_loader.ThawLoadError,
                       match=rf"tensor '{last}' does not match the manifest .* \(read from host\)"):
        swap_read()
    assert cache.lookup(obj.bucket, obj.key, obj.etag, obj.size) is None  # evicted
    third, fresh = swap_read()
    assert third["sources"] == {"s3": obj.size} and fresh == tensors


def _non_weight_bytes(manifest: Any) -> int:
    return sum(f.size for f in manifest.files if not f.path.endswith(".safetensors"))


def test_a_swap_reads_the_next_file_while_the_engine_takes_the_last_and_a_failing_one_stops_it(
    vllm_loader: Any, store_env: None, s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """FileByFileWeights reads one file ahead: the second shard's read begins while the
    engine still holds the first shard's first tensor (the consumer waits for it there,
    so without the read-ahead this test would time out). Every tensor comes, as pushed.
    A second shard that fails its sha256 in the store fails the iteration, naming it,
    after the first shard's tensors were handed over."""
    import shutil
    import threading

    import torch
    from safetensors.torch import load_file

    from tests.faults.support import flip_byte
    from tests.waiting import wait_until
    from tests.worker.shards import split_in_two_shards

    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    second = split_in_two_shards(model)
    expected = {**load_file(str(model / "model-00001-of-00002.safetensors")), **load_file(str(model / second))}
    first_names = set(load_file(str(model / "model-00001-of-00002.safetensors")))
    push_model(s3.client(), model, s3_prefix)

    reads: list[str] = []
    real_load_s3 = vllm_loader.load_s3

    def recording_load_s3(client: Any, objs: Any, **kw: Any) -> Any:
        reads.extend(o.key.rsplit("/", 1)[-1] for o in objs)
        return real_load_s3(client, objs, **kw)

    monkeypatch.setattr(vllm_loader, "load_s3", recording_load_s3)
    options = vllm_loader.StreamOptions(verify_sha256=True)
    weights = vllm_loader.FileByFileWeights(s3_prefix, options)
    got: dict[str, torch.Tensor] = {}
    for name, t in weights:
        if not got:
            wait_until("the second shard's read begun", lambda: second in reads, timeout_s=60)
            assert threading.current_thread() is threading.main_thread()
        got[name] = t.clone()
    assert set(got) == set(expected) and all(torch.equal(got[n], expected[n]) for n in expected)
    summary = weights.summary
    assert summary is not None and summary["tensors_verified"] == len(expected)
    assert 0 <= summary["wait_s"] <= summary["seconds"] and summary["read_s"] > 0

    bucket, prefix = parse_s3_uri(s3_prefix)
    flip_byte(s3.client(), bucket, f"{prefix}/{second}")
    handed: list[str] = []
    with pytest.raises(vllm_loader.ThawLoadError, match=rf"{second}: sha256"):
        for name, _ in vllm_loader.FileByFileWeights(s3_prefix, options):
            handed.append(name)
    assert set(handed) == first_names
