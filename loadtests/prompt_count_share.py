"""How many requests of a real trace the activator would still count exactly.

    python -m loadtests.prompt_count_share --out counts.json [--context 8192,32768,131072] \\
        [--bytes-per-token 3,4,5] [--trace FILE ...]

The activator bounds a prompt's tokens from its bytes and counts it exactly only where
the bound cannot decide (docs/REQUEST_PATH.md, "Counting only when it matters"); with
no tenant token limit in the way, that is where the bound plus ``max_tokens`` passes
the model's context. The traces give each request's prompt and answer in tokens, not
its text, so each prompt is rebuilt as a chat (a short system turn, then the user's
turn) of ``tokens x bytes_per_token`` bytes, ``max_tokens`` its answer's length, and put
through the real bound (``activator.token_bound``, the demo model's tokenizer and chat
template as the activator measures them at load). Reported per trace, context and
bytes per token: the share counted exactly, and the share truly over the context (the
requests an exact count refuses), so the difference is what the bound's slack costs.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
DEFAULT_TRACES = ("azure_llm_2023_code.csv", "azure_llm_2023_conv.csv", "mooncake_fast25_conversation_trace.jsonl")
SYSTEM = "You are a helpful assistant."


def read_sizes(path: Path) -> Iterator[tuple[int, int]]:
    """(prompt tokens, answer tokens) of each request of an Azure CSV or a Mooncake JSONL."""
    if path.suffix == ".jsonl":
        with path.open() as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    yield int(r["input_length"]), int(r["output_length"])
        return
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            yield int(r["ContextTokens"]), int(r["GeneratedTokens"])


def demo_bound() -> Any:
    """The demo model's PromptBound, measured as the activator measures it at load."""
    from activator.tokens import TOKENIZER_FILES, build_tokenizer
    from thaw.demo_model import build_demo_model

    with tempfile.TemporaryDirectory(prefix="thaw-count-share-") as tmp:
        model = Path(tmp) / "m"
        build_demo_model(model)
        files = {name: (model / name).read_bytes() for name in TOKENIZER_FILES if (model / name).is_file()}
    tok = build_tokenizer(files)
    if tok.bound is None:
        raise SystemExit("the demo model's tokenizer has no bound: nothing to measure")
    return tok.bound


def shares(sizes: list[tuple[int, int]], bound: Any, context: int, bytes_per_token: float) -> dict[str, Any]:
    from activator.token_bound import fits, prompt_bounds

    exact = over = 0
    for prompt, answer in sizes:
        max_tokens = max(answer, 1)
        body = {"messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": "a" * round(prompt * bytes_per_token)}],
                "max_tokens": max_tokens}
        bounds = prompt_bounds("chat", body, bound)
        if bounds is None or not fits(bounds, max_tokens, context):
            exact += 1
        if prompt + answer > context:
            over += 1
    n = len(sizes)
    return {"context": context, "bytes_per_token": bytes_per_token, "requests": n,
            "exact_share": exact / n if n else None, "over_context_share": over / n if n else None}


def run(args: argparse.Namespace) -> int:
    bound = demo_bound()
    report: dict[str, Any] = {"benchmark": "prompt_count_share", "traces": {}}
    for trace in args.trace or [str(TRACES / t) for t in DEFAULT_TRACES]:
        path = Path(trace)
        if not path.is_file():
            print(f"no trace at {path}", file=sys.stderr)
            return 2
        sizes = list(read_sizes(path))
        rows = [shares(sizes, bound, c, b) for c in args.context for b in args.bytes_per_token]
        report["traces"][path.name] = rows
        for r in rows:
            print(f"{path.name:45} context {r['context']:>6}  {r['bytes_per_token']:.1f} B/token: "
                  f"counted exactly {100 * r['exact_share']:5.1f} %, over the context {100 * r['over_context_share']:5.1f} %")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _numbers(kind: type) -> Any:
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--trace", action="append", default=None, metavar="FILE",
                   help="an Azure LLM CSV or a Mooncake JSONL (default: the three in ../shared/traces)")
    p.add_argument("--context", type=_numbers(int), default=[8192, 32768, 131072],
                   help="model contexts in tokens (default 8192,32768,131072)")
    p.add_argument("--bytes-per-token", type=_numbers(float), default=[3.0, 4.0, 5.0],
                   help="bytes of text per token the traces' prompts had (default 3,4,5)")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
