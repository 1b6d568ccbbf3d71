"""What a trial in ``LocalEnvironment`` can and cannot reach: files, other trials, the network, processes."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from harness_grpo.harbor_local import LocalEnvironment, agents_dir
from tests.sandbox.conftest import make_task, run_trial

REPO_ROOT = Path(__file__).resolve().parents[2]

SLOW_TEST = """\
#!/bin/bash
sleep 0.5
reward=0
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then reward=1; fi
echo "$reward" > /logs/verifier/reward.txt
"""


@contextlib.asynccontextmanager
async def sandbox(tmp_path: Path, name: str, **kwargs):
    """A started ``LocalEnvironment`` for the task ``make_task`` writes, stopped and deleted afterwards."""
    task = make_task(tmp_path, name, app={"data.txt": f"{name}\n"})
    trial_dir = tmp_path / f"trial-{name}"
    trial_dir.mkdir()
    env = LocalEnvironment(
        environment_dir=task / "environment",
        environment_name=name,
        session_id=f"{name}__env",
        trial_paths=TrialPaths(trial_dir=trial_dir),
        task_env_config=TaskEnvironmentConfig(workdir="/app"),
        **kwargs,
    )
    await env.start(force_build=False)
    try:
        yield env
    finally:
        await env.stop(delete=True)


async def sh(env: LocalEnvironment, command: str, **kwargs) -> tuple[int, str]:
    result = await env.exec(command, **kwargs)
    return result.return_code, (result.stdout or "") + (result.stderr or "")


def test_two_concurrent_sandboxes_see_only_their_own_files_and_none_of_the_hosts(tmp_path):
    host_marker = tmp_path / "host-marker.txt"
    host_marker.write_text("host\n")

    async def scenario():
        async with sandbox(tmp_path, "left") as left, sandbox(tmp_path, "right") as right:
            await sh(left, "echo left-secret > /app/secret && echo x > /tmp/left-tmp")
            await sh(right, "sleep 30 >/dev/null 2>&1 &")
            return {
                "right_app": await sh(right, "ls -A /app"),
                "right_reads_left": await sh(right, "cat /app/secret /tmp/left-tmp"),
                "right_tmp": await sh(right, "ls -A /tmp"),
                "left_data": await sh(left, "cat /app/data.txt"),
                "host_marker": await sh(left, f"cat {host_marker}"),
                "repo": await sh(left, f"ls {REPO_ROOT / 'tests'}"),
                "root_home": await sh(left, "ls -A /root", user="root"),
                "left_processes": await sh(left, "ps -eo comm="),
                "host_python_visible": await sh(left, "python3 -c 'print(6 * 7)'"),
            }

    seen = asyncio.run(scenario())
    assert seen["right_app"] == (0, "data.txt\n")
    assert seen["right_reads_left"][0] != 0 and "No such file" in seen["right_reads_left"][1]
    # Only the host's read-only paths that live under /tmp (a checkout there: its .venv) show in a fresh /tmp.
    exposed = {sys.prefix, sys.base_prefix, str(agents_dir())}
    host_dirs_in_tmp = sorted({Path(p).parts[2] for p in exposed if Path(p).is_relative_to("/tmp")})
    assert seen["right_tmp"][0] == 0 and seen["right_tmp"][1].split() == host_dirs_in_tmp, seen["right_tmp"]
    assert seen["left_data"] == (0, "left\n")
    assert seen["host_marker"][0] != 0
    assert seen["repo"][0] != 0
    assert seen["root_home"][0] == 0 and seen["root_home"][1].split() in ([], [".pyenv"])
    assert "sleep" not in seen["left_processes"][1], seen["left_processes"]
    assert seen["host_python_visible"] == (0, "42\n")


def test_agent_cannot_read_tests_fake_its_reward_or_leave_a_process_behind(tmp_path):
    task = make_task(tmp_path, "hack", test=SLOW_TEST)
    result = asyncio.run(run_trial(task, "tests.sandbox.hacking_agent:HackingAgent", tmp_path / "trials"))

    assert result.exception_info is None, result.exception_info
    seen = result.agent_result.metadata
    assert seen["whoami"]["stdout"].strip() == "1000"
    assert seen["list_tests"] == {"rc": 0, "stdout": "/solution:\n\n/tests:\n", "stderr": ""}
    assert seen["read_tests"]["rc"] != 0
    for write in ("write_reward_txt", "write_reward_json", "write_tests"):
        assert seen[write]["rc"] != 0 and "Permission denied" in seen[write]["stderr"], seen[write]
    assert seen["daemon"]["rc"] == 0
    assert result.verifier_result.rewards == {"reward": 0}


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


GET = "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 && cat <&3"


def test_only_the_allowed_host_port_is_reachable(tmp_path):
    with http_server() as allowed, http_server() as other:

        async def scenario():
            async with sandbox(tmp_path, "net", allow_ports=[allowed]) as env:
                return {
                    "allowed": await sh(env, GET.format(port=allowed)),
                    "allowed_python": await sh(
                        env,
                        f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{allowed}/').read().decode())\"",
                    ),
                    "other": await sh(env, GET.format(port=other)),
                    "outside": await sh(env, "timeout 5 bash -c 'exec 3<>/dev/tcp/192.0.2.1/80'"),
                    "interfaces": await sh(env, "ls /proc/sys/net/ipv4/conf"),
                }

        seen = asyncio.run(scenario())
    assert seen["allowed"][0] == 0 and seen["allowed"][1].endswith(f"hello from {allowed}"), seen["allowed"]
    assert seen["allowed_python"] == (0, f"hello from {allowed}\n")
    assert seen["other"][0] != 0 and "Connection refused" in seen["other"][1], seen["other"]
    assert seen["outside"][0] != 0 and "unreachable" in seen["outside"][1], seen["outside"]
    assert seen["interfaces"][1].split() == ["all", "default", "lo"]


def test_exec_timeout_and_cancellation_kill_the_whole_process_tree(tmp_path):
    async def scenario():
        async with sandbox(tmp_path, "tree") as env:
            tree = "sleep 301 & setsid sleep 302 & bash -c 'sleep 303 & sleep 304' & sleep 305"
            started = time.monotonic()
            with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
                await env.exec(tree, timeout_sec=1)
            timed_out_after = time.monotonic() - started
            after_timeout = await sh(env, "ps -eo args=")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(env.exec(tree), 1)
            after_cancel = await sh(env, "ps -eo args=")
            return timed_out_after, after_timeout, after_cancel

    timed_out_after, after_timeout, after_cancel = asyncio.run(scenario())
    assert timed_out_after < 5
    assert "sleep 30" not in after_timeout[1], after_timeout
    assert "sleep 30" not in after_cancel[1], after_cancel


def test_sandbox_start_is_refused_with_a_clear_error_for_a_bad_port(tmp_path):
    with pytest.raises(ValueError, match="not a TCP port"):
        asyncio.run(sandbox(tmp_path, "badport", allow_ports=[70000]).__aenter__())


def test_sandbox_leaves_no_process_or_tree_behind(tmp_path):
    async def scenario():
        async with sandbox(tmp_path, "gone", sandbox_dir=str(tmp_path / "sandboxes")) as env:
            await sh(env, "setsid sleep 306 >/dev/null 2>&1 < /dev/null &")
            return env.root_dir

    root = asyncio.run(scenario())
    assert not root.exists()
    assert list((tmp_path / "sandboxes").iterdir()) == []
    time.sleep(0.2)
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and b"sleep\x00306" in _cmdline(p)]
    assert leftovers == []
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


_KILLED_OWNER = """
import asyncio, sys
from pathlib import Path
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from harness_grpo.harbor_local import LocalEnvironment
from tests.sandbox.conftest import make_task

async def main(tmp):
    task = make_task(tmp, "orphan")
    (tmp / "trial").mkdir()
    env = LocalEnvironment(environment_dir=task / "environment", environment_name="orphan", session_id="orphan__env",
                           trial_paths=TrialPaths(trial_dir=tmp / "trial"),
                           task_env_config=EnvironmentConfig(workdir="/app"), sandbox_dir=str(tmp / "sandboxes"))
    await env.start(force_build=False)
    await env.exec("setsid sleep 307 >/dev/null 2>&1 < /dev/null &")
    print("running", flush=True)
    await asyncio.sleep(600)

asyncio.run(main(Path(sys.argv[1])))
"""


def test_a_killed_owner_takes_its_sandboxes_processes_with_it(tmp_path):
    """SIGKILL to the process that started a sandbox (no stop() runs) still ends every process in it."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _KILLED_OWNER, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "running"
        assert _processes_running(b"sleep\x00307"), "the sandbox's process did not start"
    finally:
        owner.kill()
        owner.wait(30)
    deadline = time.monotonic() + 10
    while _processes_running(b"sleep\x00307") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_running(b"sleep\x00307")
    assert not _processes_running(str(tmp_path / "sandboxes").encode())  # the sandbox's anchor


def _processes_running(needle: bytes) -> list[Path]:
    return [p for p in Path("/proc").iterdir() if p.name.isdigit() and needle in _cmdline(p)]
