"""vLLM (CPU) loads the demo model straight from the store with the runai streamer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from thaw.objstore import S3Endpoint
from weight_streaming.push import push_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], load_format="runai_streamer", enforce_eager=True,
              max_model_len=512, seed=0)
    outs = llm.chat([{"role": "user", "content": "Hello, who are you?"}],
                    SamplingParams(max_tokens=6, temperature=0))
    o = outs[0]
    print("RESULT " + json.dumps({
        "prompt": o.prompt, "prompt_token_ids": list(o.prompt_token_ids),
        "text": o.outputs[0].text, "token_ids": list(o.outputs[0].token_ids),
        "finish_reason": o.outputs[0].finish_reason,
    }))
    """
)


def test_vllm_loads_demo_model_from_store_with_runai_streamer(
    s3: S3Endpoint, demo_model_dir: Path, s3_prefix: str, tmp_path: Path
) -> None:
    push_model(s3.client(), demo_model_dir, s3_prefix)
    env = {
        **os.environ,
        **s3.env(),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # The streamer's local copies of config/tokenizer files land here, not in ~/.cache.
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "VLLM_ASSETS_CACHE": str(tmp_path / "vllm-cache" / "assets"),
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, s3_prefix], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT "):])

    # The chat template rendered the conversation with the tokenizer's special tokens.
    assert "<|start_header_id|>user<|end_header_id|>" in result["prompt"]
    assert "Hello, who are you?" in result["prompt"]
    assert result["prompt_token_ids"][0] == 0  # <|begin_of_text|>
    # Random weights say nothing useful, but the engine generated tokens.
    assert 1 <= len(result["token_ids"]) <= 6
    assert result["finish_reason"] in ("length", "stop")
    # The only copy of the model was in the store: vLLM pulled config and tokenizer
    # through the streamer into its cache (weights go straight to memory).
    pulled = list((tmp_path / "vllm-cache").rglob("config.json"))
    assert pulled and "model_streamer" in str(pulled[0])
    assert not list((tmp_path / "vllm-cache").rglob("*.safetensors"))
