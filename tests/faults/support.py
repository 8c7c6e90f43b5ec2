"""The fault suite's tools: an open-loop streaming load from the official ``openai``
client that classifies what each client saw, the ledger read back, the checks every
fault shares, and the faults' levers (processes to kill).

Every request of the load carries its own ``x-request-id``, so what the client saw and
what the activator's ledger recorded are matched one to one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

from tests.waiting import wait_until  # noqa: F401 - the fault tests' import
from thaw.process import signal_group

# What a client can see. "ok": a 200 stream that ended with its finish reason and the
# usage chunk; "error_event": a 200 stream that ended with an OpenAI-shaped error event;
# "http_error": an OpenAI-shaped error response; "connection_error": no answer at all
# (the server was gone); "timeout": nothing for ``timeout_s`` (a hang); "truncated": a
# 200 stream that just stopped (never acceptable).
KINDS = ("ok", "error_event", "http_error", "connection_error", "timeout", "truncated")


@dataclass
class Outcome:
    rid: str
    model: str
    sent_at: float
    ended_at: float = 0.0
    kind: str = ""
    status: int | None = None
    retry_after: str | None = None
    error: dict[str, Any] | None = None
    chunks: int = 0  # chunks with choices, as the activator counts them
    completion_tokens: int | None = None  # the engine's count, from the usage chunk
    finish_reason: str | None = None
    detail: str = ""

    @property
    def err(self) -> dict[str, Any]:
        """The error object ({message, type, code, ...}) however the client nested it
        (the openai client unwraps ``{"error": ...}`` for status errors and events)."""
        e = self.error or {}
        inner = e.get("error")
        return inner if isinstance(inner, dict) else e

    @property
    def answered(self) -> bool:
        """The activator answered (so it must have recorded the request)."""
        return self.kind in ("ok", "error_event", "http_error")


def stream_once(client: openai.OpenAI, model: str, *, max_tokens: int, timeout_s: float,
                rid: str | None = None, prompt: str = "Tell me a story.",
                on_chunk: Callable[[Outcome], None] | None = None, **extra: Any) -> Outcome:
    """One streamed chat completion, classified (never raises)."""
    out = Outcome(rid=rid or uuid.uuid4().hex, model=model, sent_at=time.time())
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-request-id": out.rid}, timeout=timeout_s,
            extra_body=extra or None)
        out.status = raw.status_code
        for chunk in raw.parse():
            if chunk.choices:
                out.chunks += 1
                if chunk.choices[0].finish_reason:
                    out.finish_reason = chunk.choices[0].finish_reason
                if on_chunk is not None:
                    on_chunk(out)
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
        out.kind = "ok" if out.finish_reason and out.completion_tokens is not None else "truncated"
    except openai.APIStatusError as exc:
        out.kind, out.status = "http_error", exc.status_code
        out.retry_after = exc.response.headers.get("retry-after")
        out.error = exc.body if isinstance(exc.body, dict) else {"unparsed": str(exc.body)}
    except openai.APITimeoutError as exc:
        out.kind, out.detail = "timeout", repr(exc)
    except openai.APIConnectionError as exc:
        out.kind, out.detail = "connection_error", repr(exc)
    except openai.APIError as exc:  # an error event inside a 200 stream
        out.kind = "error_event"
        out.error = exc.body if isinstance(exc.body, dict) else {"unparsed": str(exc.body)}
    except httpx.TimeoutException as exc:
        out.kind, out.detail = "timeout", repr(exc)
    except (httpx.TransportError, httpx.StreamError) as exc:
        out.kind, out.detail = "connection_error", repr(exc)
    out.ended_at = time.time()
    return out


@dataclass
class OpenLoad:
    """Streaming requests at fixed times, whether or not earlier ones finished (open
    loop), each in its own thread. ``start``/``stop``; ``stop`` waits for every request
    to end (each is bounded by ``timeout_s`` per read, so nothing waits forever)."""

    client: openai.OpenAI
    model: str
    rate_per_s: float = 2.0
    max_tokens: tuple[int, int] = (8, 48)
    timeout_s: float = 60.0
    seed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    _futures: list[Future[Outcome]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None

    def start(self) -> OpenLoad:
        self._pool = ThreadPoolExecutor(max_workers=128, thread_name_prefix="fault-load")
        self._thread = threading.Thread(target=self._schedule, name="fault-load-schedule", daemon=True)
        self._thread.start()
        return self

    def _schedule(self) -> None:
        rng = random.Random(self.seed)
        assert self._pool is not None
        t0, n = time.monotonic(), 0
        while not self._stop.is_set():
            lo, hi = self.max_tokens
            self._futures.append(self._pool.submit(
                stream_once, self.client, self.model, max_tokens=rng.randint(lo, hi), timeout_s=self.timeout_s,
                prompt=f"Request {n}: tell me a story."))
            n += 1
            self._stop.wait(max(0.0, t0 + n / self.rate_per_s - time.monotonic()))

    def stop(self) -> list[Outcome]:
        self._stop.set()
        assert self._thread is not None and self._pool is not None
        self._thread.join()
        self.outcomes = [f.result() for f in self._futures]
        self._pool.shutdown()
        return self.outcomes


@contextlib.contextmanager
def open_load(client: openai.OpenAI, model: str, **kw: Any) -> Iterator[OpenLoad]:
    load = OpenLoad(client, model, **kw).start()
    try:
        yield load
    finally:
        if load._thread is not None and not load._stop.is_set():
            load.stop()


def timeline(outcomes: Iterable[Outcome], t0: float) -> str:
    """One line per request (seconds from ``t0``), for a failure message."""
    return "\n".join(f"{o.sent_at - t0:7.2f} -> {o.ended_at - t0:7.2f}  {o.kind:16} {o.status} chunks={o.chunks} "
                     f"{o.err.get('code') or ''} {o.detail[:80]}"
                     for o in sorted(outcomes, key=lambda o: o.sent_at))


# -- the ledger ------------------------------------------------------------------------
def ledger_rows(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every usage record of every activator under ``data_dir``, by request id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for db in sorted(data_dir.glob("activators/*/usage.db")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        con.row_factory = sqlite3.Row
        try:
            for row in con.execute("SELECT * FROM usage"):
                out.setdefault(row["request_id"], []).append(dict(row))
        finally:
            con.close()
    return out


def wait_recorded(data_dir: Path, outcomes: Iterable[Outcome], timeout_s: float = 30) -> dict[str, list[dict[str, Any]]]:
    """The ledger once every answered request is in it (a cancelled stream is recorded
    when the activator notices the disconnect, a moment after the client left)."""
    want = {o.rid for o in outcomes if o.answered}
    rows: dict[str, list[dict[str, Any]]] = {}

    def all_in() -> bool:
        nonlocal rows
        rows = ledger_rows(data_dir)
        return want <= rows.keys()

    with contextlib.suppress(AssertionError):  # check() says what is missing, with the timeline
        wait_until("every answered request in the ledger", all_in, timeout_s, 0.3)
    return rows


# -- the checks every fault shares -----------------------------------------------------
@dataclass
class Verdict:
    fault: str
    sent: int
    kinds: dict[str, int]
    statuses: dict[str, int]
    recorded: int
    lost: int
    problems: list[str]

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def check(fault: str, outcomes: list[Outcome], ledger: dict[str, list[dict[str, Any]]], *,
          allow: set[str], statuses: set[int] = frozenset({429, 503}),  # type: ignore[assignment]
          out_file: Path | None = None) -> Verdict:
    """What every fault must leave true, as a list of problems (empty: all held):

    - each request ended as one of the ``allow``-ed kinds, never truncated, never hung;
    - an error response is in OpenAI's shape, its status one of ``statuses``, with a
      ``Retry-After`` for 429, 502 and 503 (retrying helps with each); an error event is in OpenAI's shape too;
    - the ledger holds exactly one record per answered request, with the status the
      client saw, and the tokens it received: the engine's count for a complete stream,
      the chunks that reached it for one cut short.
    """
    problems: list[str] = []
    for o in outcomes:
        where = f"{o.rid} ({o.kind}, status {o.status}, {o.detail[:200]})"
        if o.kind not in allow:
            problems.append(f"not allowed here: {where}")
        if o.kind in ("http_error", "error_event"):
            if not {"message", "type", "code"} <= set(o.err):
                problems.append(f"error not in OpenAI's shape: {where}: {o.error}")
        if o.kind == "http_error":
            if o.status not in statuses:
                problems.append(f"unexpected status: {where}: {o.error}")
            if o.status in (429, 502, 503) and not o.retry_after:
                problems.append(f"{o.status} without Retry-After: {where}")
        rows = ledger.get(o.rid, [])
        if o.answered and len(rows) != 1:
            problems.append(f"{len(rows)} ledger records for answered {where}")
        if not rows:
            continue
        row = rows[0]
        if o.kind == "ok":
            if row["status"] != 200 or row["completion_tokens"] != o.completion_tokens:
                problems.append(f"ledger says {row['status']}/{row['completion_tokens']} tokens, client saw "
                                f"200/{o.completion_tokens}: {where}")
        elif o.kind == "error_event":
            if row["completion_tokens"] != o.chunks:
                problems.append(f"ledger says {row['completion_tokens']} tokens, client got {o.chunks} chunks: {where}")
        elif o.kind == "http_error" and row["status"] != o.status:
            problems.append(f"ledger status {row['status']}, client saw {o.status}: {where}")
    kinds = Counter(o.kind for o in outcomes)
    st = Counter(str(o.status) for o in outcomes if o.kind == "http_error")
    answered = [o for o in outcomes if o.answered]
    recorded = sum(1 for o in answered if len(ledger.get(o.rid, [])) == 1)
    verdict = Verdict(fault=fault, sent=len(outcomes), kinds=dict(kinds), statuses=dict(st), recorded=recorded,
                      lost=len(answered) - recorded + kinds.get("truncated", 0) + kinds.get("timeout", 0),
                      problems=problems)
    print(f"\n[{fault}] sent {verdict.sent}: {dict(kinds)}; refused {dict(st)}; recorded {recorded}; "
          f"lost {verdict.lost}")
    target = out_file or (Path(os.environ["THAW_FAULTS_OUT"]) if os.environ.get("THAW_FAULTS_OUT") else None)
    if target is not None:
        with open(target, "a") as f:
            f.write(json.dumps(verdict.as_row()) + "\n")
    return verdict


# -- a loopback TCP proxy that can be cut ------------------------------------------------
class Proxy:
    """Forwards ``listen`` → ``target`` on loopback, in a thread. ``mode``:
    "pass" (forward), "reset" (connections are refused with a reset, existing ones cut),
    "stall" (connections are accepted and held; nothing is forwarded either way)."""

    def __init__(self, target: tuple[str, int], listen: tuple[str, int]) -> None:
        self.target, self.listen = target, listen
        self.mode = "pass"
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server = socket.create_server(listen, reuse_port=False)
        self._server.settimeout(0.2)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    def set(self, mode: str) -> None:
        """"stall" holds the connections open with their bytes undelivered; "reset" cuts
        them (RST) and refuses new ones; "pass" forwards again (new connections)."""
        assert mode in ("pass", "reset", "stall")
        self.mode = mode
        if mode == "reset":
            self._cut_all(reset=True)

    def _cut_all(self, *, reset: bool) -> None:
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                if reset:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            mode = self.mode
            if mode == "reset":
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                client.close()
                continue
            if mode == "stall":
                with self._lock:
                    self._conns.add(client)  # held open, never read
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.mode == "stall":
                    time.sleep(0.05)  # not a poll: a stalled link: bytes wait (and the sockets stay open)
                if self.mode == "reset":
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        self._thread.join(5)
        self._cut_all(reset=False)


# -- levers -----------------------------------------------------------------------------
def local_workers(data_dir: Path) -> dict[str, int]:
    """worker id → agent pid, from the local provider's records."""
    out = {}
    for rec in (data_dir / "local-workers").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(rec.read_text())
            out[str(info["worker_id"])] = int(info["pid"])
    return out


def engine_groups(agent_pid: int) -> list[int]:
    """The process groups of the engine hosts under an agent (each runs in its own)."""
    groups = set()
    with contextlib.suppress(psutil.NoSuchProcess):
        for c in psutil.Process(agent_pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if "worker.engine_host" in " ".join(c.cmdline()):
                    groups.add(os.getpgid(c.pid))
    return sorted(groups)


def kill_worker(agent_pid: int) -> list[int]:
    """The instance dies at once: the agent's group and its engine hosts' groups, SIGKILL.

    Every process of the instance is stopped before any is killed, so that none of them
    sees another die and says so (a vLLM server whose engine core died first sends its
    own error event, which a machine that loses power never does)."""
    groups = [os.getpgid(agent_pid), *engine_groups(agent_pid)]
    frozen = freeze(agent_pid)
    for g in groups:
        signal_group(g, signal.SIGKILL)
    for p in frozen:  # one that left the groups (a setsid child) dies too
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    return groups


def freeze(pid: int) -> list[psutil.Process]:
    """SIGSTOP a process and every process under it; the processes stopped."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGSTOP)
    return tree


def kill_engine(agent_pid: int) -> list[int]:
    """The engine crashes under a live agent: its engine hosts' groups, SIGKILL."""
    groups = engine_groups(agent_pid)
    for g in groups:
        signal_group(g, signal.SIGKILL)
    return groups


def service_pid(up_pid: int, module: str) -> int | None:
    """The pid of a service `thaw up` runs (its command line names ``module``)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        for c in psutil.Process(up_pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if module in " ".join(c.cmdline()):
                    return c.pid
    return None


def flip_byte(client: Any, bucket: str, key: str, offset_from_end: int = 64) -> None:
    """Corrupt one object in the store: one byte of its tail (a safetensors file's
    tensor data) flipped, the object replaced whole (as a bad upload or a bit rot would
    leave it)."""
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-offset_from_end] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))


@dataclass
class SlowRead:
    """What a client reading a stream one byte a second saw."""

    read: bytes = b""
    status_line: bytes = b""


def slow_stream(base_url: str, api_key: str, body: dict[str, Any], *, seconds: float, rid: str,
                bytes_per_s: float = 1.0, stop: threading.Event | None = None) -> SlowRead:
    """A streamed request from a client that reads its status line, then the rest of its
    answer at ``bytes_per_s`` for ``seconds`` (or until ``stop`` is set), then goes away (a
    raw socket with a small receive buffer: nothing reads ahead for it). The status line is
    read at once so that what the caller checks does not depend on how soon ``stop`` comes."""
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    payload = json.dumps(body).encode()
    head = (f"POST {u.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\nx-request-id: {rid}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    out = SlowRead()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((u.hostname or "127.0.0.1", u.port or 80))
        s.sendall(head + payload)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            b = s.recv(1)
            if not b:
                break
            out.read += b
            if b"\r\n" in out.read:
                time.sleep(1.0 / bytes_per_s)  # not a poll: a slow reader's pace
    out.status_line = out.read.split(b"\r\n", 1)[0]
    return out


@dataclass(frozen=True)
class TcpQueue:
    """One TCP socket of a process, as the kernel sees it: bytes sent but not yet
    acknowledged (``tx``), bytes received but not yet read by the process (``rx``)."""

    local_port: int
    remote_port: int
    tx: int
    rx: int


def tcp_queues(pid: int) -> list[TcpQueue]:
    """The IPv4 TCP sockets ``pid`` holds, with their queues (/proc/net/tcp)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    out = []
    with open(f"/proc/{pid}/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            if cols[9] in inodes:
                tx, rx = (int(x, 16) for x in cols[4].split(":"))
                out.append(TcpQueue(int(cols[1].split(":")[1], 16), int(cols[2].split(":")[1], 16), tx, rx))
    return out


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)
