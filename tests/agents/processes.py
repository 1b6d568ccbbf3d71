"""Helpers for tests that check nothing an agent started outlives its run."""

from __future__ import annotations

import time
from pathlib import Path

LEAVES_A_CHILD = "sleep 300 & echo $! > child.pid.tmp && mv child.pid.tmp child.pid; {tail}"
"""A bash script that leaves ``sleep 300`` running (its pid in ``child.pid``), then runs ``tail``."""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper counts as gone
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for_file(path: Path, timeout_s: float = 30.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s}s"
        time.sleep(0.02)
    return path
