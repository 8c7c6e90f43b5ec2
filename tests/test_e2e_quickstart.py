"""The README's quickstart, walked as a newcomer would: every command of its shell blocks,
in order, each of which must succeed.

``scripts/up`` runs as written (set-up, then `thaw up` in the foreground) with a copy of
examples/thaw.yaml whose data directory is fresh and whose ports are free; every other
command runs from a directory that is not the checkout, where the quickstart says they
work (no --config, no THAW_CONFIG: the running `thaw up`'s config), with .venv/bin on
the PATH as ``source .venv/bin/activate`` puts it. The README's Python example runs too.
The "own model" is the demo Llama built into ``./my-model`` (a Hugging Face download
has the same files), and the checks after each command are what the README promises of
it: an answer streamed, a key printed once, the model served to that key, its usage.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.waiting import wait_until
from thaw.embedded_store import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DEFAULT_API = "127.0.0.1:8000"


def quickstart(text: str) -> str:
    """The README's "## Quickstart" section."""
    start = text.index("\n## Quickstart\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(section: str, lang: str) -> list[str]:
    # A list item's block is indented with the item: as typed, it is not.
    return [textwrap.dedent(m.group(1)) for m in re.finditer(rf"^\s*```{lang}\n(.*?)^\s*```", section, re.M | re.S)]


def shell_commands(section: str) -> list[str]:
    """Each command of the section's ``sh`` blocks, continuations joined, comments dropped."""
    out: list[str] = []
    for block in blocks(section, "sh"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_the_quickstart_is_commands_a_newcomer_can_type() -> None:
    cmds = shell_commands(quickstart(README.read_text()))
    assert cmds[0] == "scripts/up", "the quickstart starts with the run command"
    # Each is one of what the walk below knows how to run: a newcomer's shell has no more.
    for cmd in cmds[1:]:
        assert cmd.split()[0] in ("source", "thaw", "curl"), cmd
    assert any(c.startswith("thaw push ") for c in cmds) and any(c.startswith("thaw models deploy ") for c in cmds)
    assert blocks(quickstart(README.read_text()), "python"), "the Python example"


@contextmanager
def _scripts_up(config: Path, data_dir: Path, log: Path) -> Iterator[dict[str, str]]:
    with open(log, "wb") as logf:
        proc = subprocess.Popen([str(ROOT / "scripts" / "up"), "--config", str(config)], stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
        endpoint = data_dir / "endpoint.json"
        try:
            # Set-up (already done by the test command: a check only), the store, the demo
            # model built and pushed, the controller and the activator.
            wait_until("scripts/up to start (its endpoint file)",
                       lambda: endpoint.exists() or proc.poll() is not None, 300, 0.2)
            assert endpoint.exists(), f"scripts/up did not start:\n{log.read_text()[-3000:]}"
            yield json.loads(endpoint.read_text())
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # Ctrl-C's way out: the workers and the store stop
                try:
                    proc.wait(90)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            # Whatever of this stack outlived it (nothing, when the stop went as it should).
            for p in psutil.process_iter(["cmdline"]):
                if any(str(data_dir) in a for a in (p.info["cmdline"] or [])):
                    p.kill()


def _fresh_config(tmp: Path) -> tuple[Path, Path]:
    """examples/thaw.yaml with a fresh data directory and free ports; nothing else changed."""
    cfg = yaml.safe_load((ROOT / "examples" / "thaw.yaml").read_text())
    data_dir = tmp / "data"
    cfg["data_dir"] = str(data_dir)
    cfg["server"]["port"] = free_port()
    cfg["controller"]["port"] = free_port()
    cfg["object_store"]["embedded"]["s3_port"] = free_port()
    path = tmp / "thaw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, data_dir


def _run(cmd: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd!r} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


@pytest.mark.engine
def test_walk_the_readme_quickstart(tmp_path: Path, state_home: Path) -> None:
    section = quickstart(README.read_text())
    cmds = shell_commands(section)
    config, data_dir = _fresh_config(tmp_path)
    elsewhere = tmp_path / "elsewhere"  # not the checkout
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "THAW_CONFIG"}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # The model one downloads: the demo Llama's files (safetensors, config.json, the tokenizer).
    _run("thaw demo-model ./my-model --seed 7", elsewhere, env)
    with _scripts_up(config, data_dir, tmp_path / "scripts-up.log") as endpoint:
        api = endpoint["base_url"].removeprefix("http://").removesuffix("/v1")
        outputs: dict[str, str] = {}
        for cmd in cmds[1:]:
            if cmd.startswith("source "):
                continue  # the PATH above
            outputs[cmd] = _run(cmd.replace(DEFAULT_API, api), elsewhere, env)
        by_start = {c.split(" --", 1)[0]: out for c, out in outputs.items()}
        # The first request streamed an answer to its end.
        curl = next(out for c, out in outputs.items() if c.startswith("curl "))
        assert "data: [DONE]" in curl and '"choices"' in curl, curl[-1000:]
        # `thaw status` printed the models; the deploy made the new one.
        assert "thaw-demo" in by_start["thaw status"]
        state = json.loads(_run("thaw models show my-model --json", elsewhere, env))
        assert state["name"] == "my-model"
        # The key was printed once, on its own line: it opens the tenant's models, the new one too.
        key = next(out for c, out in outputs.items() if c.startswith("thaw tenants keys add ")).strip()
        assert key and "\n" not in key
        r = httpx.post(f"{endpoint['base_url']}/chat/completions", timeout=300,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "my-model", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
        # The Python example, as printed, against this stack.
        code = blocks(section, "python")[0].replace(DEFAULT_API, api)
        py = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=300)
        assert py.returncode == 0 and py.stdout.strip(), py.stderr[-2000:]

        # Usage shows the tenant's request to its own model, from anywhere.
        def acme_used_my_model() -> bool:
            usage = json.loads(_run("thaw usage --since 24h --tenant acme --json", elsewhere, env))
            return "my-model" in usage["tenants"].get("acme", {}).get("models", {})

        wait_until("acme's request in `thaw usage`", acme_used_my_model, 60, 0.5)
