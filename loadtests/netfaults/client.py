"""The fault run's load: streamed chat completions through each activator, paced, with
the official ``openai`` client, each request logged as it ends (JSON lines, read back by
``loadtests.netfaults.history.read_sent``).

Each request carries its own ``x-request-id`` (the usage ledger records it), so the
checker can match what the client saw with what was metered. An answer is ``complete``
once its stream ended; an OpenAI-shaped error (a JSON error object, or an SSE error
event) is ``error`` with its type; anything else (a connection broken without a word, a
timeout) is ``error`` unshaped, which the checker counts as lost."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import openai

from loadtests.netfaults.checker import Sent


def classify(exc: Exception) -> tuple[int | None, str, bool]:
    """(HTTP status, kind, OpenAI-shaped) of a failed request."""
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        err = body.get("error", body) if isinstance(body, dict) else {}
        kind = err.get("type") or err.get("code") if isinstance(err, dict) else None
        return exc.status_code, str(kind or f"http_{exc.status_code}"), bool(isinstance(err, dict) and
                                                                              err.get("message"))
    if isinstance(exc, openai.APITimeoutError):
        return None, "timeout", False
    if isinstance(exc, openai.APIConnectionError):
        return None, "connection", False
    if isinstance(exc, openai.APIError):  # an SSE error event mid-stream
        body = exc.body if isinstance(exc.body, dict) else {}
        return None, str(body.get("type") or "stream_error"), True
    return None, type(exc).__name__, False


class Load:
    """One thread per activator sending a request every ``pace_s`` (or as soon as the
    last ended, when slower); every request is recorded in ``sent`` and ``log``."""

    def __init__(self, activators: dict[str, str], key: str, model: str, log: Path, *, pace_s: float = 0.25,
                 timeout_s: float = 300.0) -> None:
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._log = log.open("a")
        self._model = model
        self._pace_s = pace_s
        self._threads = [threading.Thread(target=self._run, name=f"load-{name}", daemon=True,
                                          args=(name, openai.OpenAI(base_url=url, api_key=key, max_retries=0,
                                                                    timeout=timeout_s)))
                         for name, url in activators.items()]

    def _one(self, name: str, client: openai.OpenAI) -> Sent:
        rid = uuid.uuid4().hex
        at = time.time()
        try:
            stream = client.chat.completions.create(
                model=self._model, stream=True, max_tokens=8, messages=[{"role": "user", "content": "hello"}],
                extra_headers={"x-request-id": rid})
            for _ in stream:
                pass
            return Sent(rid, name, at, time.time(), "complete")
        except Exception as exc:  # every failure is the checker's business
            status, kind, shaped = classify(exc)
            return Sent(rid, name, at, time.time(), "error", status, kind, shaped)

    def _run(self, name: str, client: openai.OpenAI) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            s = self._one(name, client)
            with self._lock:
                self.sent.append(s)
                self._log.write(json.dumps(s.__dict__) + "\n")
                self._log.flush()
            self._stop.wait(max(0.0, began + self._pace_s - time.monotonic()))
        client.close()

    def since(self, at: float) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.sent_at >= at]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(360)
        self._log.close()
