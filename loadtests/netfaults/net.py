"""Hosts on one machine: each a network namespace with its own address on a bridge, and
the faults between them (the fault harness of tests/netfaults and ``thaw bench netfaults``).

:class:`Net` makes a Linux bridge and, per :meth:`Net.host`, a namespace joined to it by
a veth pair, with an address in ``10.77.0.0/24`` that exists only inside the namespaces
it made (the bridge itself has none, so nothing outside can reach them, nor they it).
Processes run in a host with :meth:`Net.popen` (``ip netns exec``). The faults:

- :meth:`Net.cut` drops what ``a`` sends to ``b`` (and, unless ``one_way``, what ``b``
  sends to ``a``), by ``nft`` rules in the senders' namespaces; :meth:`Net.heal` removes
  cuts;
- :meth:`Net.loss` drops a share of a host's incoming packets at random (``nft numgen``);
- :meth:`Net.rate` limits what a host sends (``tc tbf``).

Each host's rules are one ``nft`` table, replaced whole on every change (atomic: a fault
starts and heals at one instant). :meth:`Net.close` kills the processes it started and
deletes the namespaces and the bridge, and waits until the kernel has removed them: a
closed Net leaves nothing behind. :func:`unavailable` says why a Net cannot be made here
(not root, a command missing), for a test to skip with.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

SUBNET = "10.77.0"
CLONE_NEWNET = 0x40000000
_TABLE = "netfaults"
_serial = count()


def unavailable() -> str | None:
    """Why namespaces, bridges and nft rules cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI and sessions run as root)"
    missing = [c for c in ("ip", "tc", "nft") if shutil.which(c) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: iproute2, nftables; scripts/bootstrap.sh installs them)"
    return None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str  # the namespace
    ip: str
    dev: str  # its end of the veth pair, inside the namespace
    cuts: set[str] = field(default_factory=set)  # addresses it does not send to
    loss_percent: int = 0


class Net:
    """A bridge and the hosts on it (see the module docstring). Names start with a prefix
    unique to this process and Net, so Nets of parallel tests never meet."""

    def __init__(self) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        self.prefix = f"nf{os.getpid() % 100000:05d}{next(_serial) % 100:02d}"
        self.bridge = f"{self.prefix}br"
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen[Any]] = []
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")

    def host(self, name: str) -> Host:
        """A new host: its namespace, its veth on the bridge and its address."""
        k = len(self.hosts) + 2
        if k > 250:
            raise ValueError("a Net holds at most 249 hosts")
        ns, dev = f"{self.prefix}-{name}", f"{self.prefix}h{k}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", dev, "type", "veth", "peer", "name", f"{dev}p")
        _run("ip", "link", "set", f"{dev}p", "master", self.bridge, "up")
        _run("ip", "link", "set", dev, "netns", ns)
        ip = f"{SUBNET}.{k}"
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        _run("ip", "-n", ns, "link", "set", dev, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        h = self.hosts[name] = Host(ns, ip, dev)
        self._rules(h)
        return h

    @contextlib.contextmanager
    def inside(self, host: str) -> Iterator[None]:
        """Run the calling thread in ``host`` until the block ends: the sockets it opens,
        the threads and processes it starts are there (a test's own client on a host of
        its own, the only way in: the bridge has no address outside)."""
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/var/run/netns/{self.hosts[host].name}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"cannot enter host {host}")
            try:
                yield
            finally:
                if libc.setns(own, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "cannot leave the host's namespace")
        finally:
            os.close(own)
            os.close(target)

    def popen(self, host: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``host`` (killed by :meth:`close`)."""
        p = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].name, *argv], start_new_session=True, **kwargs)
        self.procs.append(p)
        return p

    # -- faults ---------------------------------------------------------------------------

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Drop what ``a`` sends to ``b``, and what ``b`` sends to ``a`` unless ``one_way``."""
        ha, hb = self.hosts[a], self.hosts[b]
        ha.cuts.add(hb.ip)
        self._rules(ha)
        if not one_way:
            hb.cuts.add(ha.ip)
            self._rules(hb)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Remove the cuts between ``a`` and ``b`` (both ways); with no hosts, every cut
        and every loss."""
        if a is None or b is None:
            for h in self.hosts.values():
                h.cuts.clear()
                h.loss_percent = 0
                self._rules(h)
            return
        ha, hb = self.hosts[a], self.hosts[b]
        ha.cuts.discard(hb.ip)
        hb.cuts.discard(ha.ip)
        self._rules(ha)
        self._rules(hb)

    def loss(self, host: str, percent: int) -> None:
        """Drop ``percent`` % of what ``host`` receives, at random (0: none)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be 0 to 100, not {percent}")
        h = self.hosts[host]
        h.loss_percent = percent
        self._rules(h)

    def rate(self, host: str, rate: str | None) -> None:
        """Limit what ``host`` sends to ``rate`` (tc's units: ``10mbit``); None: no limit."""
        h = self.hosts[host]
        subprocess.run(["tc", "-n", h.name, "qdisc", "del", "dev", h.dev, "root"], capture_output=True)
        if rate is not None:
            _run("tc", "-n", h.name, "qdisc", "add", "dev", h.dev, "root", "tbf", "rate", rate,
                 "burst", "64kbit", "latency", "400ms")

    def _rules(self, h: Host) -> None:
        """Replace ``h``'s table with its cuts and loss (one nft transaction)."""
        lines = [f"table inet {_TABLE} {{",
                 "  chain out { type filter hook output priority 0; policy accept;"]
        lines += [f"    ip daddr {ip} drop" for ip in sorted(h.cuts)]
        lines += ["  }", "  chain in { type filter hook input priority 0; policy accept;"]
        if h.loss_percent >= 100:
            lines.append("    drop")
        elif h.loss_percent:
            lines.append(f"    numgen random mod 100 < {h.loss_percent} drop")
        lines += ["  }", "}"]
        script = f"table inet {_TABLE}\ndelete table inet {_TABLE}\n" + "\n".join(lines) + "\n"
        subprocess.run(["ip", "netns", "exec", h.name, "nft", "-f", "-"], input=script, check=True,
                       capture_output=True, text=True)

    # -- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what it started, delete its namespaces and bridge; return once the kernel
        shows none of them. Faults are healed first and the bridge goes last, so the
        connections of the processes killed can end (a socket left waiting on a cut link
        keeps its namespace, and its veth, alive for minutes)."""
        for h in self.hosts.values():
            h.cuts.clear()
            h.loss_percent = 0
            with contextlib.suppress(subprocess.CalledProcessError):
                self._rules(h)
            subprocess.run(["tc", "-n", h.name, "qdisc", "del", "dev", h.dev, "root"], capture_output=True)
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        for h in self.hosts.values():
            subprocess.run(["ip", "netns", "del", h.name], capture_output=True)
        # The kernel removes a deleted namespace (and its veths) once its last socket is gone.
        deadline = time.monotonic() + 20.0
        while any(n.startswith(self.prefix) and n != self.bridge for n in self.leftovers()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in self.leftovers():  # a veth still held: removed with its peer
            subprocess.run(["ip", "link", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        deadline = time.monotonic() + 10.0
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            raise RuntimeError(f"the kernel still has Net {self.prefix}'s namespaces and links after 30 s: {left}")
        self.hosts.clear()

    def leftovers(self) -> list[str]:
        """This Net's namespaces and links the kernel still has."""
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        return [n for n in names if n.startswith(self.prefix)] + \
            [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if self.prefix in ln]

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
