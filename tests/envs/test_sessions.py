"""Sessions against real servers: concurrent episodes are independent, capacity is refused clearly,
an episode owns its server session, and a lost session raises instead of continuing in a fresh game."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from harness_grpo.envs.echo import EchoAction, EchoEnv
from harness_grpo.envs.serving import LocalEnvServer
from harness_grpo.envs.sessions import EnvServerError, ServerAtCapacityError, SessionLostError
from harness_grpo.envs.textarena import TextArenaAction, TextArenaEnv
from harness_grpo.envs.wordle.words import ANSWERS
from tests.agents.processes import alive, wait_gone
from tests.envs.conftest import launch


def test_sixteen_and_more_concurrent_episodes_are_independent(servers: dict[str, LocalEnvServer]) -> None:
    secrets = list(ANSWERS[:20])
    barrier = threading.Barrier(len(secrets))
    outcomes: dict[str, object] = {}

    def play(secret: str) -> None:
        client = TextArenaEnv(base_url=servers["wordle"].url).sync()
        try:
            client.reset(secret_word=secret)
            barrier.wait(timeout=60)  # every session is open before anyone guesses
            wrong = next(word for word in ANSWERS if word != secret and word not in secrets)
            first = client.step(TextArenaAction(message=f"[{wrong}]"))
            barrier.wait(timeout=60)  # every session holds one guess before anyone wins
            final = client.step(TextArenaAction(message=f"[{secret}]"))
            history = client.state().raw_state["game_state"]["guess_history"]
            outcomes[secret] = (first.done, final.done, final.reward, [guess for guess, _ in history])
        except Exception as exc:  # reported below, with the secret it happened to
            outcomes[secret] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=play, args=(secret,)) for secret in secrets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for secret in secrets:
        outcome = outcomes[secret]
        assert not isinstance(outcome, Exception), f"{secret}: {outcome!r}"
        first_done, final_done, reward, guesses = outcome  # type: ignore[misc]
        assert (first_done, final_done, reward) == (False, True, 1.0)
        assert guesses[-1] == secret and len(guesses) == 2


@pytest.fixture(scope="module")
def one_session_server() -> Iterator[LocalEnvServer]:
    server = launch("wordle", max_concurrent_envs=1)
    yield server
    server.stop()


def test_a_server_at_capacity_refuses_a_new_session_with_its_counts(one_session_server: LocalEnvServer) -> None:
    first, second = (TextArenaEnv(base_url=one_session_server.url).sync() for _ in range(2))
    try:
        first.reset(secret_word="crane")
        with pytest.raises(ServerAtCapacityError, match=r"at capacity \(1/1 sessions\)") as refused:
            second.reset(secret_word="crane")
        assert (refused.value.active_sessions, refused.value.max_sessions) == (1, 1)
        assert first.step(TextArenaAction(message="[crane]")).reward == 1.0  # the open session is unharmed
        first.close()
        assert second.reset(secret_word="apple").observation.metadata["turn"] == 0
    finally:
        first.close()
        second.close()


def test_a_client_plays_its_episodes_one_after_another_in_one_session(one_session_server: LocalEnvServer) -> None:
    server = one_session_server
    client = TextArenaEnv(base_url=server.url).sync()
    try:
        client.reset(secret_word="crane")
        client.step(TextArenaAction(message="[slate]"))
        first_episode = client.state().episode_id
        client.reset(secret_word="apple")  # a fresh game, on the one session this server allows
        assert client.state().episode_id != first_episode
        assert client.state().raw_state["game_state"]["guess_history"] == []
        assert client.step(TextArenaAction(message="[apple]")).reward == 1.0
    finally:
        client.close()


def test_a_killed_server_loses_the_episode_and_a_restarted_one_is_not_joined(
    start_server: Callable[..., LocalEnvServer],
) -> None:
    server = start_server("wordle")
    port = server.url.rsplit(":", 1)[1]
    client = TextArenaEnv(base_url=server.url).sync()
    try:
        client.reset(secret_word="crane")
        client.step(TextArenaAction(message="[slate]"))
        server.kill()
        with pytest.raises(SessionLostError, match="lost mid-episode"):
            client.step(TextArenaAction(message="[crane]"))
        start_server("wordle", port=int(port))  # same address: the old client must not play on there
        with pytest.raises(SessionLostError, match="call reset"):
            client.step(TextArenaAction(message="[crane]"))
        with pytest.raises(SessionLostError):
            client.state()
        client.reset(secret_word="apple")  # a new episode may start on the new server
        assert client.step(TextArenaAction(message="[apple]")).reward == 1.0
    finally:
        client.close()


def test_a_reply_that_does_not_come_loses_the_episode(start_server: Callable[..., LocalEnvServer]) -> None:
    server = start_server("echo")
    client = EchoEnv(base_url=server.url, message_timeout_s=1.0).sync()
    try:
        client.reset()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(SessionLostError, match=r"no reply within 1.0s"):
                client.step(EchoAction(message="hello"))
        finally:
            os.kill(server.pid, signal.SIGCONT)
        with pytest.raises(SessionLostError):  # the server is back, but that session is not resumed
            client.step(EchoAction(message="hello"))
        client.reset()
        assert client.step(EchoAction(message="hello")).reward == pytest.approx(0.5)
    finally:
        client.close()


def test_server_errors_keep_their_code_and_the_session(servers: dict[str, LocalEnvServer]) -> None:
    client = TextArenaEnv(base_url=servers["wordle"].url).sync()
    try:
        client.reset(secret_word="crane")
        assert client.step(TextArenaAction(message="[crane]")).done
        with pytest.raises(EnvServerError, match="the game is over") as over:
            client.step(TextArenaAction(message="[crane]"))
        assert over.value.code == "EXECUTION_ERROR"
        with pytest.raises(EnvServerError, match="secret_word must be a 5-letter word") as bad_reset:
            client.reset(secret_word="xyzzyq")
        assert bad_reset.value.code == "EXECUTION_ERROR"
        assert client.reset(secret_word="apple").observation.prompt.startswith("[GAME] You are Playing Wordle.")
    finally:
        client.close()


OWNER = """
import sys, time
from harness_grpo.envs.serving import LocalEnvServer
server = LocalEnvServer("echo")
print(server.pid, flush=True)
time.sleep(600)
"""


def test_a_local_server_goes_with_its_owner_even_a_sigkilled_one() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        server_pid = int(owner.stdout.readline())
        assert alive(server_pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert wait_gone(server_pid, 20), "the env server outlived the process that started it"
    finally:
        owner.kill()
