"""``RecordingEnvironment``: the local sandbox (``LocalEnvironment``), appending when each ``start`` began and each
``stop`` ended to the file its ``record`` kwarg names, so a test can see which environments were prepared and
whether two were ever up at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness_grpo.harbor_local import LocalEnvironment


class RecordingEnvironment(LocalEnvironment):
    def __init__(self, *args: Any, record: str, **kwargs: Any) -> None:
        self._record = Path(record)
        super().__init__(*args, **kwargs)

    def _note(self, event: str) -> None:
        with self._record.open("a") as out:
            out.write(f"{event} {self.environment_dir.parent.name} {time.monotonic()}\n")

    async def start(self, force_build: bool) -> None:
        self._note("start")
        await super().start(force_build)

    async def stop(self, delete: bool) -> None:
        await super().stop(delete)
        self._note("stop")
