"""Waiting for a ``launchers/train.py`` process the tests started, its output in a log file."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest


def wait_for_launcher(process: subprocess.Popen, log: Path, timeout_s: float) -> str:
    """The log once ``process`` exited; past ``timeout_s`` its process group is killed and the test fails."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"train.py did not finish within {timeout_s}s:\n{log.read_text()[-4000:]}")
    return log.read_text()
