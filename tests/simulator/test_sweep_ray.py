"""Sweeps on Ray (`--backend ray`, simulator/ray_backend.py): the same points as the local
backend on one local Ray instance, which cluster a run joins and that it leaves it (on a
stand-in for Ray), and the errors when Ray is missing or the cluster cannot be reached."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from simulator import ray_backend, sweep
from simulator.run import Inputs
from simulator.sweep import UNLIMITED, Axes
from tests.simulator import support
from thaw.cli.main import main
from thaw.exits import EXIT_FAILED, EXIT_INVALID, EXIT_OK

# Three models' requests a minute or more apart, over 90 minutes, so the variants
# differ: m0 every 60 s for the first half hour, m1 every 240 s (warm under a 300 s idle
# grace, cold under 30 s), m2 every 900 s (cold but under always-on).
ROWS = sorted([(float(t), "m0", 500, 100) for t in range(0, 1800, 60)]
              + [(float(t), "m1", 500, 100) for t in range(30, 5400, 240)]
              + [(float(t), "m2", 500, 100) for t in range(45, 5400, 900)])
RANGES = ["--budgets", "0,none", "--idle-grace-s", "30,300", "--keep-alive", "fixed,histogram"]
AXES = Axes((0.0, UNLIMITED), (30.0, 300.0), ("fixed", "histogram"))


def config() -> Any:
    return support.config(3, standby_min=1, standby_max=1, max_instances=4, budget=5.0)


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """One local Ray instance of 2 CPUs for the module; the runs find it connected and
    leave it so. Ray sets a few environment variables in this process: put back after."""
    import ray

    env = dict(os.environ)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()
        for k in set(os.environ) - set(env):
            del os.environ[k]
        os.environ.update(env)


# -- the same points as the local backend -------------------------------------------------


def test_ray_gives_the_local_backends_summaries(ray_instance: None) -> None:
    cfg = config()
    inputs = Inputs(cfg, support.trace(ROWS), support.costs(cfg))
    variants = [*sweep.baseline_variants(), *sweep.sweep_variants(AXES)]
    local = sweep.run_variants(inputs, variants, jobs=1)
    # jobs=2: two tasks in flight at most, so the run waits on the cluster between submissions
    on_ray = sweep.run_variants(inputs, variants, jobs=2, backend="ray")
    assert [p.name for p in on_ray] == [v.name for v in variants]  # the variants' order
    assert [(p.summary, p.frontier) for p in on_ray] == [(p.summary, p.frontier) for p in local]
    assert len({p.summary["cold_starts"] for p in local}) > 1  # the variants do differ


def test_the_cli_on_ray_writes_the_local_sweeps_points(ray_instance: None, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    args = [*support.cli_args(tmp_path, config(), ROWS, prefill=1000.0, tpot_s=0.01), "--sweep", *RANGES]
    docs = {}
    for backend, extra in (("local", ["--jobs", "1"]), ("ray", [])):
        out = tmp_path / backend
        assert main([*args, "--backend", backend, *extra, "--out-dir", str(out)]) == EXIT_OK
        docs[backend] = json.loads((out / "sweep.json").read_text())
    assert len(docs["ray"]["points"]) == 4 + 2 * 2 * 2  # baselines + budgets x idle graces x keep-alives
    assert docs["ray"]["points"] == docs["local"]["points"]
    assert docs["ray"]["frontier"] == docs["local"]["frontier"]
    assert "12 variants (4 baselines)" in capsys.readouterr().err.splitlines()[-1]


# -- which cluster, and leaving it (a stand-in for Ray) ------------------------------------


class FakeRay:
    """The part of Ray's API that ray_backend calls: a task runs when submitted and its
    reference is its result; it records the connection's life and the waits."""

    def __init__(self, *, initialized: bool = False, init_error: Exception | None = None,
                 get_error: Exception | None = None) -> None:
        self.initialized, self.init_error, self.get_error = initialized, init_error, get_error
        self.calls: list[tuple[str, ...]] = []
        self.waits: list[int] = []  # how many tasks were in flight at each wait

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, address: str, **_: Any) -> None:
        self.calls.append(("init", address))
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))
        self.initialized = False

    def put(self, obj: Any) -> Any:
        return obj

    def remote(self, fn: Callable[[Any, Any], Any]) -> Any:
        class Task:
            @staticmethod
            def remote(shared: Any, item: Any) -> Any:
                return fn(shared, item)
        return Task

    def wait(self, pending: Sequence[Any], num_returns: int) -> tuple[list[Any], list[Any]]:
        self.waits.append(len(pending))
        return list(pending[:num_returns]), list(pending[num_returns:])

    def get(self, refs: Sequence[Any]) -> list[Any]:
        if self.get_error is not None:
            raise self.get_error
        return list(refs)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeRay]:
    def install(**kw: Any) -> FakeRay:
        fake = FakeRay(**kw)
        monkeypatch.setitem(sys.modules, "ray", fake)
        return fake
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return install


def _add(shared: int, item: int) -> int:
    return shared + item


@pytest.mark.parametrize(("address", "env", "joined"), [
    pytest.param(None, None, "local", id="neither: a local instance"),
    pytest.param(None, "head:6379", "head:6379", id="RAY_ADDRESS"),
    pytest.param("other:6379", "head:6379", "other:6379", id="the address over RAY_ADDRESS"),
])
def test_a_run_joins_the_cluster_asked_for_and_leaves_it(address: str | None, env: str | None, joined: str,
                                                         fake_ray: Callable[..., FakeRay],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if env is not None:
        monkeypatch.setenv("RAY_ADDRESS", env)
    fake = fake_ray()
    assert ray_backend.map_shared(_add, 10, [1, 2, 3], address=address) == [11, 12, 13]
    assert fake.calls == [("init", joined), ("shutdown",)]


def test_a_failed_task_still_leaves_the_cluster(fake_ray: Callable[..., FakeRay]) -> None:
    fake = fake_ray(get_error=ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        ray_backend.map_shared(_add, 10, [1, 2])
    assert fake.calls == [("init", "local"), ("shutdown",)]


def test_a_connected_driver_is_used_and_left_connected(fake_ray: Callable[..., FakeRay]) -> None:
    fake = fake_ray(initialized=True)
    assert ray_backend.map_shared(_add, 10, [1]) == [11]
    assert fake.calls == [] and fake.initialized


def test_jobs_caps_the_tasks_in_flight(fake_ray: Callable[..., FakeRay]) -> None:
    fake = fake_ray()
    assert ray_backend.map_shared(_add, 0, [1, 2, 3, 4, 5], max_in_flight=2) == [1, 2, 3, 4, 5]
    # 5 tasks, 2 at a time: a wait, on 2 in flight, before the 3rd, 4th and 5th go
    assert fake.waits == [2, 2, 2]


# -- errors -------------------------------------------------------------------------------

COMMANDS = [
    pytest.param(["--sweep"], id="simulate --sweep"),
    pytest.param(["--ttft-p99-s", "10"], id="pool recommend"),
]


def _cli(tmp_path: Path, command: list[str]) -> list[str]:
    """`thaw simulate --sweep` or `thaw pool recommend` (``command``'s own options) on Ray."""
    simulate, *inputs = support.cli_args(tmp_path, config(), ROWS, prefill=1000.0, tpot_s=0.01)
    verb = [simulate] if command[0] == "--sweep" else ["pool", "recommend"]
    return [*verb, *inputs, *command, *RANGES, "--backend", "ray", "--out-dir", str(tmp_path / "out")]


@pytest.mark.parametrize("command", COMMANDS)
def test_without_ray_the_cli_names_the_extra_to_install(command: list[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(_cli(tmp_path, command)) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "thaw: error: --backend ray needs Ray, which is not installed: pip install 'thaw-serve[ray]'" in err
    assert not (tmp_path / "out" / "sweep.json").exists()


def test_an_unreachable_cluster_fails_the_run(tmp_path: Path, fake_ray: Callable[..., FakeRay],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    fake = fake_ray(init_error=ConnectionError("no GCS"))
    assert main([*_cli(tmp_path, ["--sweep"]), "--ray-address", "nowhere:1"]) == EXIT_FAILED
    assert "thaw: error: could not join the Ray cluster at 'nowhere:1': no GCS" in capsys.readouterr().err
    assert fake.calls == [("init", "nowhere:1"), ("shutdown",)]


def test_an_unknown_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--sweep", "--backend", "dask"])
    assert exc.value.code == EXIT_INVALID
    # (newer argparse quotes the choices)
    assert re.search(r"invalid choice: 'dask' \(choose from '?local'?, '?ray'?\)", capsys.readouterr().err)


def test_a_ray_address_without_the_ray_backend_is_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in _cli(tmp_path, ["--sweep"]) if a not in ("--backend", "ray")]
    assert main([*args, "--ray-address", "head:6379"]) == EXIT_INVALID
    assert "thaw: error: --ray-address is for --backend ray" in capsys.readouterr().err
