"""Bounded waits for an observable state, instead of sleeping and hoping.

``await until(condition, "what did not happen")`` polls ``condition()`` on the running event loop
and fails the test (``AssertionError`` with the message) once ``timeout_s`` passes without it
holding; ``until_blocking`` does the same from a plain test thread. The deadline only bounds a
failing test: a passing one returns as soon as the state is reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def until(condition: Callable[[], Any], message: str, timeout_s: float = 30.0, poll_s: float = 0.005) -> None:
    """Return once ``condition()`` is truthy; ``AssertionError(message)`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{message} (within {timeout_s}s)"
        await asyncio.sleep(poll_s)


def until_blocking(condition: Callable[[], Any], message: str, timeout_s: float = 30.0, poll_s: float = 0.005) -> None:
    """``until`` for a test thread outside any event loop."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{message} (within {timeout_s}s)"
        time.sleep(poll_s)
