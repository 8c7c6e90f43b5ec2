"""Pure pieces of the worker: the derived state, launch flags, events, metrics parsing."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from thaw.config import EngineArgs
from worker.engine_client import parse_in_flight
from worker.launch import (
    LaunchCommand,
    decode_event,
    encode_event,
    engine_env,
    extra_flag,
    root_cause,
    vllm_argv,
)
from worker.state import Assignment, Facts, WorkerState, derive_state

A = Assignment("a1", "demo", "s3://thaw/models/demo", "demo", assigned_at=100.0)
# An engine host that has paid its imports.
UP = Facts(host_running=True, host_imported=True)

S = WorkerState


P = pytest.param


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        P(Facts(), S.STARTING, id="no-host"),
        P(Facts(host_running=True), S.STARTING, id="host-importing"),
        P(Facts(host_running=False, host_imported=True), S.STARTING, id="host-died-after-import"),
        P(UP, S.STANDBY, id="host-imported"),
        # Loading until the engine answers, whatever else is known by then.
        P(replace(UP, assignment=A), S.LOADING, id="assigned-not-launched"),
        P(replace(UP, assignment=A, launched_at=101.0, weights_loaded_at=103.0), S.LOADING,
          id="assigned-weights-loaded"),
        P(replace(UP, host_imported=False, assignment=A, launched_at=101.0), S.LOADING,
          id="assigned-host-not-imported"),
        P(replace(UP, assignment=A, launched_at=101.0, engine_ready_at=104.0), S.READY, id="engine-answered"),
        # A failure wins over loading and ready, and shows without an assignment too.
        P(replace(UP, assignment=A, launched_at=101.0, failure="boom"), S.FAILED, id="failed-loading"),
        P(replace(UP, assignment=A, engine_ready_at=104.0, failure="died"), S.FAILED, id="failed-serving"),
        P(Facts(host_running=True, failure="host died in standby"), S.FAILED, id="failed-no-assignment"),
        # A release in progress is draining, even if the engine failed meanwhile.
        P(replace(UP, assignment=A, engine_ready_at=104.0, release_requested_at=110.0), S.DRAINING,
          id="release-from-ready"),
        P(Facts(assignment=A, engine_ready_at=104.0, release_requested_at=110.0, failure="x"), S.DRAINING,
          id="release-engine-died"),
        P(Facts(assignment=A, release_requested_at=110.0), S.DRAINING, id="release-from-loading-host-gone"),
    ],
)
def test_derive_state(facts: Facts, expected: WorkerState) -> None:
    assert derive_state(facts) is expected


def _cmd(**engine: object) -> LaunchCommand:
    return LaunchCommand(uri="s3://thaw/m", served_model_name="m", max_model_len=512,
                         engine=EngineArgs(**engine), port=4321, env={})  # type: ignore[arg-type]


def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


def test_vllm_argv_carries_every_setting() -> None:
    f = _flags(vllm_argv(_cmd(dtype="bfloat16", enforce_eager=True, load_format="runai_streamer",
                              extra={"max_num_seqs": 8})))
    assert f["--model"] == "s3://thaw/m"
    assert f["--load-format"] == "runai_streamer"
    assert f["--served-model-name"] == "m"
    assert f["--max-model-len"] == "512"
    assert f["--dtype"] == "bfloat16"
    assert f["--host"] == "127.0.0.1" and f["--port"] == "4321"
    assert f["--seed"] == "0"
    assert "--enforce-eager" in f
    assert f["--max-num-seqs"] == "8"


def test_vllm_argv_without_enforce_eager() -> None:
    assert "--enforce-eager" not in vllm_argv(_cmd())


@pytest.mark.parametrize(
    ("key", "value", "flags"),
    [
        ("max_num_seqs", 8, ["--max-num-seqs", "8"]),
        ("enable_prefix_caching", True, ["--enable-prefix-caching"]),
        ("enable_prefix_caching", False, ["--no-enable-prefix-caching"]),
        ("kv_cache_dtype", None, []),
        ("override_generation_config", {"temperature": 0.5}, ["--override-generation-config", '{"temperature": 0.5}']),
    ],
)
def test_extra_flag(key: str, value: object, flags: list[str]) -> None:
    assert extra_flag(key, value) == flags


@pytest.mark.parametrize(("gib", "env_value"), [(1.0, "1"), (4.0, "4"), (0.5, "1"), (2.5, "3")])
def test_engine_env_kv_cache_rounds_up_to_whole_gib(gib: float, env_value: str) -> None:
    env = engine_env(EngineArgs(cpu_kvcache_gib=gib), {"AWS_ENDPOINT_URL": "http://s3"}, "/data")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == env_value
    assert env["AWS_ENDPOINT_URL"] == "http://s3"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"].startswith("/data/")
    assert env["VLLM_ASSETS_CACHE"].startswith("/data/")


def test_events_round_trip_and_other_output_is_not_an_event() -> None:
    line = encode_event("weights_loaded").decode()
    assert line.endswith("\n")
    ev = decode_event(line)
    assert ev is not None and ev["event"] == "weights_loaded" and isinstance(ev["t"], float)
    assert decode_event("INFO 11-30 loading model") is None
    assert decode_event('{"event": "something_else"}') is None
    assert decode_event('{"event": "imported"') is None  # cut short
    assert decode_event(json.dumps(["imported"])) is None


def test_encoded_event_stays_one_atomic_write() -> None:
    # A pipe write up to PIPE_BUF (4096) bytes is atomic: lines from the engine core
    # and the engine host never interleave.
    assert len(encode_event("failed", error="x" * 100_000, where="engine_core")) < 4096


def test_root_cause_names_the_innermost_exception() -> None:
    try:
        try:
            raise FileNotFoundError("s3://thaw/m/model.safetensors: NoSuchKey")
        except FileNotFoundError as inner:
            raise RuntimeError("Engine core initialization failed") from inner
    except RuntimeError as exc:
        msg = root_cause(exc)
    assert msg.startswith("FileNotFoundError: s3://thaw/m/model.safetensors: NoSuchKey")
    assert "RuntimeError: Engine core initialization failed" in msg
    assert root_cause(ValueError("bad")) == "ValueError: bad"


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 2.0
vllm:num_requests_running{engine="1",model_name="demo"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo"} 4.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="demo",reason="capacity"} 9.0
"""


def test_parse_in_flight_sums_running_and_waiting_over_label_sets() -> None:
    # 2 + 1 running, 4 waiting; the by-reason breakdown is not counted twice.
    assert parse_in_flight(METRICS) == 7


def test_parse_in_flight_unknown_without_the_gauges() -> None:
    assert parse_in_flight("# TYPE other gauge\nother 1.0\n") is None
    assert parse_in_flight("") is None


def test_load_view_names_the_slowest_source() -> None:
    from worker.state import load_view

    def tier(sources: dict[str, int]) -> str:
        return load_view("s3://b/m", {"bytes": sum(sources.values()), "seconds": 1.0, "sources": sources}).tier

    assert tier({"host": 10}) == "host"
    assert tier({"host": 10, "disk": 1}) == "disk"
    assert tier({"disk": 10, "s3": 1}) == "s3"
    assert tier({"host": 5, "s3": 0}) == "host"  # a source that gave nothing does not count
    assert load_view("s3://b/m", None).tier == "s3"  # a loader that reports nothing read the store
    assert load_view("/models/m", None).tier == "local"
    assert load_view("s3://b/m", {"sources": "junk"}).sources == {}


def test_a_swaps_load_view_carries_its_steps_and_the_tensors_checked() -> None:
    from worker.state import load_view

    report = {"bytes": 10, "seconds": 0.5, "sources": {"host": 10}, "tensors_verified": 7}
    plain = load_view("s3://b/m", report)
    assert (plain.swap, plain.steps_s, plain.tensors_verified) == (False, {}, 7)
    swap = load_view("s3://b/m", report, swap_steps={"weights_s": 0.4, "verify_s": 0.1, "odd": "x"})
    assert (swap.swap, swap.steps_s, swap.tier) == (True, {"weights_s": 0.4, "verify_s": 0.1}, "host")
