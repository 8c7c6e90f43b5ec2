"""Ports for servers: outside the range outgoing connections take theirs from."""

from __future__ import annotations

import socket

import pytest

from thaw.embedded_store import _ephemeral_ports, free_port


def test_ports_are_outside_the_ephemeral_range_free_and_never_repeated() -> None:
    low, high = _ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(not low <= p <= high for p in ports), [p for p in ports if low <= p <= high]
    for p in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))  # free to listen on



def test_thaw_listen_ports_bounds_where_ports_are_picked(monkeypatch: pytest.MonkeyPatch) -> None:


    monkeypatch.setenv("THAW_LISTEN_PORTS", "21000-22500")
    assert all(21000 <= free_port() < 22500 for _ in range(50))
