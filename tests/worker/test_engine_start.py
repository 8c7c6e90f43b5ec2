"""Starting an engine (``worker.engine_start``): its launch command, its client and URL
held in one place, and waiting for its /health on an injected clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.worker.fakes import World
from tests.worker.parts import engine, settings
from thaw.config import EngineArgs
from worker.caches import WeightCaches
from worker.engine_start import launch_command, wait_healthy
from worker.metrics import WorkerMetrics

ENGINE = EngineArgs(enforce_eager=True, cpu_kvcache_gib=2)  # type: ignore[call-arg]


def test_a_launch_command_carries_the_request_and_the_models_cache_root(tmp_path: Path) -> None:
    s = settings(tmp_path, host="0.0.0.0")
    cmd = launch_command(s, WeightCaches(s, WorkerMetrics()), "s3://thaw/models/demo", "demo-chat", 512, ENGINE,
                         8123, cache_root_of="demo", sleep_mode=True, swappable=True, serving=False)
    assert (cmd.uri, cmd.served_model_name, cmd.max_model_len, cmd.port, cmd.host) == (
        "s3://thaw/models/demo", "demo-chat", 512, 8123, "0.0.0.0")
    assert (cmd.sleep_mode, cmd.swappable, cmd.serving) == (True, True, False)
    # One compile cache per model (a snapshot holds that model's only); sleep mode needs dev mode.
    assert cmd.env["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm-cache" / "models" / "demo")
    assert cmd.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_a_plain_launch_serves_and_is_neither_swappable_nor_asleep(tmp_path: Path) -> None:
    s = settings(tmp_path)
    cmd = launch_command(s, WeightCaches(s, WorkerMetrics()), "s3://thaw/models/demo", "demo-chat", 512, ENGINE,
                         8123, cache_root_of="demo")
    assert (cmd.sleep_mode, cmd.swappable, cmd.serving) == (False, False, True)
    assert "VLLM_SERVER_DEV_MODE" not in cmd.env


class Clock:
    """Each reading is ``step_s`` later than the one before."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


class Health:
    def __init__(self, answers_after: int | None) -> None:
        self.answers_after, self.calls = answers_after, 0

    async def healthy(self) -> bool:
        self.calls += 1
        return self.answers_after is not None and self.calls > self.answers_after


async def test_wait_healthy_polls_until_the_engine_answers() -> None:
    engine_: Any = Health(answers_after=3)
    assert await wait_healthy(engine_, timeout_s=10.0, poll_s=0.0, clock=Clock(1.0))
    assert engine_.calls == 4


async def test_wait_healthy_gives_up_after_the_timeout() -> None:
    engine_: Any = Health(answers_after=None)
    # The deadline is read at 1 s: 1 + 3 = 4; the readings after the polls are 2, 3, 4, 5.
    assert not await wait_healthy(engine_, timeout_s=3.0, poll_s=0.0, clock=Clock(1.0))
    assert engine_.calls == 4


async def test_the_current_engine_keeps_its_client_and_url_together(tmp_path: Path) -> None:
    s = settings(tmp_path, host="0.0.0.0", advertise_host="10.0.0.7")
    current = engine(World(), s)
    assert (current.client, current.url) == (None, None)
    first = current.at(8001)
    # The agent reaches its engine on the loopback; the routes get the advertised address.
    assert first.base_url == "http://127.0.0.1:8001"  # type: ignore[attr-defined]
    assert current.url == "http://10.0.0.7:8001"
    # A kept engine's client stays across the models swapped into it.
    assert current.at(8001, reuse=True) is first
    fresh = current.at(8002)
    assert fresh is not first and current.client is fresh and current.url == "http://10.0.0.7:8002"
    await current.close()
    assert (current.client, current.url) == (None, None)
