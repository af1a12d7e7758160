"""Port picking for the servers (harness.ports): outside the kernel's ephemeral range,
so a client connection made while a server restarts cannot take the server's port."""

from __future__ import annotations

import random
import socket

import pytest

from harness import ports
from harness.ports import PICK_FLOOR, ephemeral_range, free_ports, port_in_use


def test_picked_ports_are_distinct_free_and_below_the_ephemeral_range():
    eph = ephemeral_range()
    if eph is None or eph[0] - PICK_FLOOR < 1000:
        pytest.skip(f"no room below the ephemeral range here ({eph})")
    picked = free_ports("127.0.0.1", 5)
    assert len(set(picked)) == 5
    assert all(PICK_FLOOR <= p < eph[0] for p in picked), (picked, eph)
    assert not any(port_in_use("127.0.0.1", p) for p in picked)


def test_a_port_in_use_is_never_picked(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (PICK_FLOOR + 200, 60999))
    # the same seeded draw twice: first find what it picks, then occupy that port
    first = free_ports("127.0.0.1", 1, rng=random.Random(7))[0]
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", first))
        blocker.listen()
        again = free_ports("127.0.0.1", 1, rng=random.Random(7))[0]
    assert again != first and PICK_FLOOR <= again < PICK_FLOOR + 200


def test_no_room_below_the_range_falls_back_to_the_os(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    (p,) = free_ports("127.0.0.1", 1)
    assert p >= 1024 and not port_in_use("127.0.0.1", p)


def test_the_range_file_is_read(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(str(f)) == (40000, 50000)
    f.write_text("garbage")
    assert ephemeral_range(str(f)) is None
    assert ephemeral_range(str(tmp_path / "missing")) is None
