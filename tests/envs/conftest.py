"""Environment servers for the tests: real ``python -m harness_grpo.envs NAME`` processes on 127.0.0.1.

``servers`` (session-scoped) serves every bundled environment at once (started in parallel, each
with ``max_concurrent_envs=64``); ``servers["wordle"].url`` is where a client connects.
``start_server(name, ...)`` starts a dedicated one a test may stop, kill or freeze; it is stopped
when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness_grpo.envs.serving import ENVIRONMENTS, LocalEnvServer
from tests.support.processes import repo_env


def launch(name: str, **kwargs: object) -> LocalEnvServer:
    return LocalEnvServer(name, env=repo_env(), **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, LocalEnvServer]]:
    with ThreadPoolExecutor(len(ENVIRONMENTS)) as pool:
        futures = {name: pool.submit(launch, name, max_concurrent_envs=64) for name in ENVIRONMENTS}
        started = {name: future.result() for name, future in futures.items()}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def start_server() -> Iterator[Callable[..., LocalEnvServer]]:
    started: list[LocalEnvServer] = []

    def start(name: str, **kwargs: object) -> LocalEnvServer:
        server = launch(name, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
