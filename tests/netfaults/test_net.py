"""The multi-host harness itself: hosts reach each other by address, a cut stops them
(both ways or one), a heal lets them through again, and a closed Net leaves nothing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from loadtests.netfaults.net import Net, unavailable
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"netfaults: {unavailable()}")

# A TCP server answering each connection with one line, then closing it.
_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7777)); s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hello\\n"); c.close()
"""
# Connect to ADDR:7777 within 0.5 s and read the line: exit 0 if it came.
_CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], 7777), timeout=0.5); sys.exit(0 if c.recv(6) == b"hello\\n" else 1)
except OSError:
    sys.exit(1)
"""


def _reaches(net: Net, src: str, dst: str) -> bool:
    argv = ["ip", "netns", "exec", net.hosts[src].name, sys.executable, "-c", _CLIENT, net.hosts[dst].ip]
    return subprocess.run(argv, capture_output=True).returncode == 0


@pytest.fixture
def net() -> Iterator[Net]:
    with Net() as n:
        for name in ("a", "b", "c"):
            n.host(name)
            server = n.popen(name, [sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
            assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        yield n


def test_hosts_reach_each_other_and_a_cut_stops_both_ways_until_healed(net: Net) -> None:
    assert _reaches(net, "a", "b") and _reaches(net, "b", "a") and _reaches(net, "a", "c")
    net.cut("a", "b")
    assert not _reaches(net, "a", "b") and not _reaches(net, "b", "a")
    assert _reaches(net, "a", "c") and _reaches(net, "c", "b")  # only that link is cut
    net.heal("a", "b")
    assert _reaches(net, "a", "b") and _reaches(net, "b", "a")


def test_a_one_way_cut_drops_one_direction(net: Net) -> None:
    # a's packets to b are dropped; b's reach a, but a's answers do not return: TCP
    # fails both ways, and a UDP datagram from b still arrives at a.
    net.cut("a", "b", one_way=True)
    assert not _reaches(net, "a", "b") and not _reaches(net, "b", "a")
    recv = net.popen("a", [sys.executable, "-c", (
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 7778)); "
        "print('ready', flush=True); print(s.recv(16).decode(), flush=True)")], stdout=subprocess.PIPE, text=True)
    assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
    send = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "s.sendto(b'from-b', (sys.argv[1], 7778))")
    subprocess.run(["ip", "netns", "exec", net.hosts["b"].name, sys.executable, "-c", send, net.hosts["a"].ip],
                   check=True)
    assert recv.stdout.readline().strip() == "from-b"


def test_loss_drops_some_and_heal_clears_it(net: Net) -> None:
    net.loss("b", 100)
    assert not _reaches(net, "a", "b")
    net.loss("b", 50)  # a share: at random (nft numgen)
    rules = subprocess.run(["ip", "netns", "exec", net.hosts["b"].name, "nft", "list", "ruleset"],
                           capture_output=True, text=True).stdout
    assert "numgen random mod 100 < 50 drop" in rules
    net.heal()
    wait_until("a reaches b after the heal", lambda: _reaches(net, "a", "b"), timeout_s=5)


def test_rate_limits_and_a_closed_net_leaves_nothing() -> None:
    n = Net()
    try:
        n.host("a")
        n.rate("a", "10mbit")
        qdisc = subprocess.run(["tc", "-n", n.hosts["a"].name, "qdisc", "show"], capture_output=True,
                               text=True).stdout
        assert "tbf" in qdisc and "10Mbit" in qdisc
        n.popen("a", ["sleep", "600"])
        assert n.leftovers()
    finally:
        n.close()
    assert n.leftovers() == [] and all(p.poll() is not None for p in n.procs)


def test_a_delay_proxy_holds_each_chunk_for_the_delay_it_is_told(net: Net) -> None:
    # a -> proxy on c -> b's server: b's line reaches a no sooner than the delay.
    proxy = net.popen("c", [sys.executable, "-m", "loadtests.netfaults.delay", "8000", net.hosts["b"].ip, "7777"],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proxy.stdin is not None and proxy.stdout is not None
    assert proxy.stdout.readline().strip() == "listening"
    timed = ("import socket, sys, time; t = time.monotonic(); c = socket.create_connection((sys.argv[1], 8000), "
             "timeout=2); line = c.recv(6); print(line.decode().strip(), time.monotonic() - t)")

    def fetch() -> tuple[str, float]:
        out = subprocess.run(["ip", "netns", "exec", net.hosts["a"].name, sys.executable, "-c", timed,
                              net.hosts["c"].ip], capture_output=True, text=True, check=True).stdout.split()
        return out[0], float(out[1])

    assert fetch()[0] == "hello"
    proxy.stdin.write("delay 0.3\n")
    proxy.stdin.flush()
    assert proxy.stdout.readline().strip() == "delay 0.3"
    line, took = fetch()
    assert line == "hello" and took >= 0.3
    net.cut("c", "b")  # the proxy's own link cut: nothing comes through it
    with pytest.raises(subprocess.CalledProcessError):
        fetch()
