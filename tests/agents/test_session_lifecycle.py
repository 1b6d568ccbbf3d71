"""Agent processes end with their session: nothing they started outlives a close, from any thread."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from harness_grpo.agent_clis import run_process
from harness_grpo.local_agent import LocalAgentSessionFactory
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext

LEAVES_A_CHILD = "sleep 300 & echo $! > child.pid.tmp && mv child.pid.tmp child.pid; {tail}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper counts as gone
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_run_process_kills_what_the_agent_left_running(tmp_path: Path) -> None:
    argv = ["bash", "-c", LEAVES_A_CHILD.format(tail="exit 0")]
    run = run_process("test", argv, cwd=tmp_path, env=dict(os.environ), home=tmp_path, timeout_s=30)
    assert run.returncode == 0 and not run.timed_out
    assert _wait_gone(int((tmp_path / "child.pid").read_text()))


def test_run_process_hands_out_its_process_so_another_thread_can_end_the_run(tmp_path: Path) -> None:
    started = []
    argv = ["bash", "-c", LEAVES_A_CHILD.format(tail="sleep 300")]
    runner = threading.Thread(
        target=lambda: started.append(
            run_process("test", argv, cwd=tmp_path, env=dict(os.environ), home=tmp_path, timeout_s=300,
                        on_start=started.append)
        )
    )  # fmt: skip
    runner.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "child.pid").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(started[0].pid, 9)
    runner.join(10)
    assert not runner.is_alive() and started[1].returncode == -9
    assert _wait_gone(int((tmp_path / "child.pid").read_text()))


@pytest.mark.timeout(120)
def test_local_agent_session_closed_from_another_thread_ends_the_agent_and_its_children(agent_stack) -> None:
    factory = LocalAgentSessionFactory(
        command=["bash", "-c", LEAVES_A_CHILD.format(tail="sleep 300")],
        verifier=lambda workdir, task: 0.0,
        sampling={"temperature": 1.0},
    )
    factory.bind_rollout(
        RolloutContext(ProxyEndpoint(agent_stack.url, agent_stack.proxy.admin_key), model_name=agent_stack.served_model)
    )
    session = factory.create("x", seed=0, episode_id="lifecycle")
    pid_file = session.workdir / "child.pid"
    exit_codes: list[int] = []
    waiter = threading.Thread(target=lambda: exit_codes.append(session.wait_for_completion(300)))
    waiter.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = int(pid_file.read_text())
    session.close()
    waiter.join(10)
    assert not waiter.is_alive() and exit_codes == [-9]
    assert _wait_gone(child)
    assert not session.workdir.exists() and session.lease.key is None
    session.close()  # twice is fine
