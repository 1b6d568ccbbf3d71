"""An asyncio event loop on a daemon thread, for the services the trainer runs beside its step loop.

``ServiceLoop().run(coro)`` runs a coroutine on the loop from any thread and waits for its result;
``close()`` cancels the tasks still on the loop, waits for them (bounded), then stops and closes it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: list[asyncio.Task]) -> None:
    """Cancel ``tasks`` and return once each has ended (their exceptions are consumed)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class ServiceLoop:
    """An asyncio loop on a daemon thread; ``run(coro)`` waits for a coroutine's result from any thread."""

    def __init__(self, name: str = "harness-services") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 600.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel the tasks still on the loop (waiting up to ``timeout_s``), then stop and close it."""
        try:
            self.run(_cancel_leftover_tasks(), timeout_s)
        except TimeoutError:
            log.warning("service tasks did not end within %s s of the shutdown", timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_leftover_tasks() -> None:
    await cancel_and_wait([task for task in asyncio.all_tasks() if task is not asyncio.current_task()])
