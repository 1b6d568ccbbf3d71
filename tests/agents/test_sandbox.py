"""The sandbox contract on its temp-dir backend: process groups die at exit, at the timeout and at close (from
any thread); the environment is exactly what the caller passes; files go in and out, never outside; close
is idempotent."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from harness_grpo.sandbox import ProcessResult, Sandbox, SandboxClosed, TempDirSandbox
from tests.agents.processes import LEAVES_A_CHILD, wait_for_file, wait_gone

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.fixture
def sandbox(tmp_path: Path):
    made = TempDirSandbox(prefix="test-", dir=tmp_path)
    yield made
    made.close()


def test_layout_is_a_working_tree_and_a_home_under_one_root(sandbox: TempDirSandbox, tmp_path: Path) -> None:
    assert isinstance(sandbox, Sandbox)
    assert sandbox.root.parent == tmp_path.resolve() and sandbox.root.name.startswith("test-")
    assert sandbox.workdir == sandbox.root / "work" and sandbox.workdir.is_dir()
    assert sandbox.home == sandbox.root / "home" and sandbox.home.is_dir()


def test_run_kills_what_the_program_left_running(sandbox: TempDirSandbox) -> None:
    result = sandbox.run(["bash", "-c", LEAVES_A_CHILD.format(tail="echo out; echo err >&2")], env=ENV, timeout_s=30)
    assert isinstance(result, ProcessResult)
    assert (result.returncode, result.stdout, result.stderr, result.timed_out) == (0, "out\n", "err\n", False)
    assert wait_gone(int(sandbox.read_file("child.pid")))


def test_run_past_its_timeout_kills_the_group(sandbox: TempDirSandbox) -> None:
    result = sandbox.run(["bash", "-c", LEAVES_A_CHILD.format(tail="sleep 300")], env=ENV, timeout_s=2)
    assert result.timed_out and result.returncode == -9 and 2 <= result.elapsed_s < 30
    assert wait_gone(int(sandbox.read_file("child.pid")))


def test_close_from_another_thread_ends_the_run_and_its_children(sandbox: TempDirSandbox) -> None:
    results: list[ProcessResult] = []
    runner = threading.Thread(
        target=lambda: results.append(
            sandbox.run(["bash", "-c", LEAVES_A_CHILD.format(tail="sleep 300")], env=ENV, timeout_s=300)
        )
    )
    runner.start()
    child = int(wait_for_file(sandbox.workdir / "child.pid").read_text())
    closers = [threading.Thread(target=sandbox.close) for _ in range(2)]  # twice, at once
    for closer in closers:
        closer.start()
    for thread in (*closers, runner):
        thread.join(10)
        assert not thread.is_alive()
    assert results[0].returncode == -9 and not results[0].timed_out
    assert wait_gone(child)
    assert not sandbox.root.exists()
    sandbox.close()  # and once more
    with pytest.raises(SandboxClosed):
        sandbox.run(["true"], env=ENV, timeout_s=5)
    with pytest.raises(SandboxClosed):
        sandbox.write_file("late.txt", "x")


def test_the_environment_is_exactly_what_the_caller_passes(sandbox: TempDirSandbox) -> None:
    result = sandbox.run(["env"], env={**ENV, "ONLY_THIS": "1"}, timeout_s=30)
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
    assert "ONLY_THIS" in names and "HOME" not in names, names
    assert sandbox.run(["pwd"], env=ENV, timeout_s=30).stdout.strip() == str(sandbox.workdir)
    assert sandbox.run(["pwd"], env=ENV, timeout_s=30, cwd=sandbox.home).stdout.strip() == str(sandbox.home)


def test_files_go_in_and_out_and_never_outside(sandbox: TempDirSandbox, tmp_path: Path) -> None:
    sandbox.write_file("src/a.txt", "in")  # relative: under the working tree, parents made
    sandbox.write_file(sandbox.home / ".config" / "agent" / "b.bin", b"\x00\xff")
    sandbox.mkdir(sandbox.home / "tmp")
    assert (sandbox.workdir / "src" / "a.txt").read_text() == "in"
    assert sandbox.read_file(sandbox.home / ".config/agent/b.bin") == b"\x00\xff"
    sandbox.run(["bash", "-c", "cat src/a.txt > out.txt; echo out >> out.txt"], env=ENV, timeout_s=30)
    assert sandbox.read_file("out.txt") == b"inout\n"
    assert (sandbox.home / "tmp").is_dir()
    (tmp_path / "secret.txt").write_text("outside")
    (sandbox.workdir / "link").symlink_to(tmp_path / "secret.txt")
    for escape in ("../../secret.txt", tmp_path / "secret.txt", "link"):
        with pytest.raises(ValueError, match="outside the sandbox"):
            sandbox.read_file(escape)
    with pytest.raises(ValueError, match="outside the sandbox"):
        sandbox.write_file("../../planted.txt", "x")
    assert not (tmp_path / "planted.txt").exists()
