"""The in-job supervision (``harness_grpo.supervisor``, ``launchers/job_entry.py``) with real processes.

Children run in their own process groups; a health wait returns once the child answers 200, fails fast when the
child exits and fails at its bound when it never answers; stopping kills whole groups (grandchildren included,
SIGKILL for a child that ignores SIGTERM); a child that must stay up and exits fails the wait. ``job_entry.py``
with the embedded engine: SIGTERM ends it with 143 and no engine process left; a rollout side that dies before it
answers fails the job (exit 1) naming it, and the engine it had started is gone too.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from harness_grpo.supervisor import ChildFailed, ProcessSupervisor
from tests.support.processes import REPO_ROOT, ReadyProcess, repo_env

LEAVES_A_GRANDCHILD = "trap '' TERM; sleep 300 & echo $! > {pidfile}; wait"  # both ignore SIGTERM


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":  # exited, waiting for its parent
            return True
        time.sleep(0.05)
    return False


def _wait_file(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.05)
    return path.read_text().strip()


@pytest.mark.timeout(60)
def test_health_wait_returns_once_the_child_answers(tmp_path: Path) -> None:
    port = _free_port()
    with ProcessSupervisor(tmp_path / "logs") as supervisor:
        server = supervisor.start("http", [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)])
        assert os.getpgid(server.process.pid) == server.process.pid != os.getpgid(0)  # its own process group
        seconds = supervisor.wait_healthy(server, f"http://127.0.0.1:{port}/", timeout_s=30, interval_s=0.1)
        assert 0 <= seconds < 30
    assert _gone(server.process.pid)


@pytest.mark.timeout(60)
def test_health_wait_fails_at_its_bound_and_when_the_child_exits(tmp_path: Path) -> None:
    with ProcessSupervisor(tmp_path / "logs") as supervisor:
        silent = supervisor.start("silent", ["sleep", "60"])
        started = time.monotonic()
        with pytest.raises(ChildFailed, match=r"silent: http://127.0.0.1:\d+/health did not answer 200 within 1"):
            supervisor.wait_healthy(silent, f"http://127.0.0.1:{_free_port()}/health", timeout_s=1, interval_s=0.1)
        assert time.monotonic() - started < 10
        crashing = supervisor.start("crashing", [sys.executable, "-c", "print('no GPU here'); raise SystemExit(3)"])
        with pytest.raises(ChildFailed, match=r"(?s)crashing exited with 3 before .*no GPU here"):
            supervisor.wait_healthy(crashing, f"http://127.0.0.1:{_free_port()}/health", timeout_s=30)


@pytest.mark.timeout(60)
def test_stop_all_kills_every_group_grandchildren_and_term_ignorers_included(tmp_path: Path) -> None:
    supervisor = ProcessSupervisor(tmp_path / "logs", stop_grace_s=1.0)
    pidfiles = [tmp_path / "a.pid", tmp_path / "b.pid"]
    children = [
        supervisor.start(f"child{i}", ["bash", "-c", LEAVES_A_GRANDCHILD.format(pidfile=pidfile)])
        for i, pidfile in enumerate(pidfiles)
    ]
    grandchildren = [int(_wait_file(pidfile)) for pidfile in pidfiles]
    started = time.monotonic()
    supervisor.stop_all()
    assert time.monotonic() - started < 10
    for pid in [child.process.pid for child in children] + grandchildren:
        assert _gone(pid), f"pid {pid} outlived stop_all"
    assert [child.process.returncode for child in children] == [-signal.SIGKILL] * 2  # they ignored SIGTERM
    assert supervisor.children == []
    supervisor.stop_all()  # twice is fine


@pytest.mark.timeout(60)
def test_waiting_on_the_main_child_fails_when_another_exits_first(tmp_path: Path) -> None:
    with ProcessSupervisor(tmp_path / "logs") as supervisor:
        main = supervisor.start("main", [sys.executable, "-c", "raise SystemExit(7)"])
        assert supervisor.wait_for(main) == 7
        main = supervisor.start("trainer", ["sleep", "60"])
        engine = supervisor.start("engine", [sys.executable, "-c", "print('CUDA out of memory'); raise SystemExit(1)"])
        with pytest.raises(ChildFailed, match=r"(?s)engine exited with 1 while trainer was running.*out of memory"):
            supervisor.wait_for(main, must_stay_up=[engine])
    assert _gone(main.process.pid)


def _job_entry(tmp_path: Path, *flags: str) -> ReadyProcess:
    argv = [sys.executable, str(REPO_ROOT / "launchers" / "job_entry.py"), "--engine", "embedded"]
    argv += ["--engine_port", str(_free_port()), "--log_dir", str(tmp_path / "job-logs"), *flags]
    return ReadyProcess(argv, r"started engine \(pid (\d+)", timeout_s=60, env=repo_env())


@pytest.mark.timeout(180)
def test_job_entry_on_sigterm_stops_its_children_and_exits_143(tmp_path: Path) -> None:
    job = _job_entry(tmp_path, "--", "--model", "tiny")
    engine_pid = int(job.match.group(1))
    deadline = time.monotonic() + 120
    while "engine healthy" not in job.text:
        assert job.proc.poll() is None and time.monotonic() < deadline, job.text
        time.sleep(0.1)
    trainer = re.search(r"started trainer \(pid (\d+)", job.text)
    os.kill(job.pid, signal.SIGTERM)
    assert job.proc.wait(60) == 128 + signal.SIGTERM
    assert _gone(engine_pid)
    if trainer is not None:
        assert _gone(int(trainer.group(1)))


@pytest.mark.timeout(180)
def test_job_entry_fails_naming_a_rollout_side_that_dies_and_stops_the_engine(tmp_path: Path) -> None:
    rollout = f"{sys.executable} -c \"print('no such dataset'); raise SystemExit(4)\""
    health = f"http://127.0.0.1:{_free_port()}/health"
    job = _job_entry(tmp_path, "--rollout_command", rollout, "--rollout_health_url", health, "--", "--model", "tiny")
    engine_pid = int(job.match.group(1))
    assert job.proc.wait(150) == 1, job.text
    text = job.text
    assert re.search(r"(?s)failed: rollout exited with 4 before .*no such dataset", text), text
    assert "started trainer" not in text
    assert _gone(engine_pid)
    assert (tmp_path / "job-logs" / "engine.log").exists()
