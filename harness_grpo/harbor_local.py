"""``LocalEnvironment``: a Harbor environment that isolates each trial on this machine, without Docker.

Use: ``EnvironmentConfig(import_path="harness_grpo.harbor_local:LocalEnvironment",
kwargs={"allow_ports": [proxy_port]})``. Linux only, run as root (``unshare``, ``nsenter``, ``setpriv``,
``pivot_root``, ``mount``, ``tar`` and ``bash`` from util-linux/coreutils).

What a trial gets (contract):

- **Its own root.** ``start()`` builds a directory tree and starts one *anchor* process in new mount, PID,
  network, IPC and UTS namespaces that bind-mounts into it, read-only and at their host paths: the host's
  system directories (``/usr``, ``/bin``, ``/lib*``, ``/sbin``, ``/etc``), the running interpreter's prefixes
  (``sys.base_prefix``, ``sys.prefix``), the repository's ``.agents`` and any ``ro_paths``; then
  ``pivot_root``s into it. Nothing else of the host is there. Private and writable: the task's workdir
  (``[environment].workdir``, default ``/app``; ``environment/app/`` is copied into it), ``/tests``,
  ``/solution``, ``/logs/{agent,verifier,artifacts}``, ``/tmp``, ``/var/tmp``, ``/home/agent``, ``/root``,
  plus a minimal ``/dev`` (with its own ``devpts``) and ``/proc`` of the trial's PID namespace.
- **Two users, neither of them the host's root.** Every exec enters the anchor's namespaces and a user
  namespace that maps its uids 0..65535 to host uids ``100000..165535``: ``root`` there (host uid 100000) has
  no privilege over the host, the mounts or the network (those namespaces belong to the host's root), and
  ``agent`` (uid 1000, home ``/home/agent``) runs with no capabilities and ``no_new_privs``.
- **Phases.** The sandbox is in the *agent phase* from ``start()`` until the first upload into ``/tests``
  (Harbor uploads the tests only after the agent has stopped); from then on it is in the *verifier phase*.
  An exec with ``user=None`` runs as ``agent`` in the agent phase and as ``root`` in the verifier phase; an
  explicit ``"root"``/``0`` (Harbor's own plumbing: chmod, installs, reward clean-up) runs as ``root``; any
  other user runs as ``agent``. ``/tests`` and ``/logs/verifier`` belong to ``root``, so nothing in the agent
  phase can write them. When the verifier phase begins every process still running in the sandbox is killed,
  so nothing the agent left behind runs alongside the verifier.
- **Processes.** An exec that times out (``RuntimeError``, as Harbor's Docker environment) or is cancelled
  has its whole process tree killed (frozen, then killed, so nothing forks away meanwhile). What an exec
  leaves running in the background after it returns keeps running (tmux sessions rely on that) until the
  verifier phase begins or ``stop()``. ``stop()`` kills the anchor, which takes every process of the trial
  with it, and removes the tree when ``delete``.
- **Network.** The trial's network namespace has only ``lo``. For each port in ``allow_ports``,
  ``127.0.0.1:<port>`` inside reaches ``127.0.0.1:<port>`` of the host (``harness_grpo.netns_forward``);
  nothing else is reachable. Tasks asking for ``no-network`` are served; ``allowlist`` is refused by Harbor.
- **Files.** Uploads and downloads run ``tar`` inside the sandbox (uploads as the phase's user), so a path
  or symlink the agent made can never lead the host's root to a host file; downloads are unpacked with
  Harbor's own archive filter.

Limits: a multi-step task stays in the verifier phase after its first verification. No CPU or memory
limits are applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import TaskOS

from harness_grpo.netns_forward import LoopbackPortForwarder

HOST_UID_BASE = 100000
"""Host uid (and gid) of the sandbox's ``root``; the sandbox's uid ``n`` is host uid ``HOST_UID_BASE + n``."""
MAPPED_IDS = 65536
AGENT_UID = 1000
AGENT_NAME = "agent"
AGENT_HOME = "/home/agent"
DEFAULT_WORKDIR = "/app"
TESTS_DIR = "/tests"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
REQUIRED_TOOLS = ("unshare", "nsenter", "setpriv", "pivot_root", "mount", "umount", "tar", "bash")
START_TIMEOUT_S = 60.0
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs as the host's root inside the new mount/PID namespaces, before anything of the trial runs:
# mounts, pivot_root, then becomes the namespace's init (pid 1) in a new user namespace and reaps orphans.
_ANCHOR_SETUP = r"""
set -eu
root=$1; python=$2; shift 2
mount --bind "$root" "$root"
while [ "$#" -gt 0 ]; do
  mount --bind -o ro "$1" "$root$1"
  shift
done
mount --bind -o ro "$root/../passwd" "$root/etc/passwd"
mount --bind -o ro "$root/../group" "$root/etc/group"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o mode=755,nosuid,noexec tmpfs "$root/dev"
for device in null zero full random urandom tty; do
  : > "$root/dev/$device"
  mount --bind "/dev/$device" "$root/dev/$device"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,nosuid,noexec devpts "$root/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
ln -s pts/ptmx "$root/dev/ptmx"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
cd "$root"
mkdir .host
pivot_root . .host
umount -l /.host
rmdir /.host
cd /
exec "$python" -I -S -c "$0"
"""

# The anchor as pid 1: enters a new user namespace (no exec after it, so it keeps its capabilities there),
# asks for the uid map, becomes the sandbox's root (nothing more), reaps orphans until its stdin ends.
# Its stdin is a pipe from the process that started it: EOF means that process is gone (even by SIGKILL,
# when no stop() ran), and the anchor's exit takes the whole PID namespace with it. The parent-death signal
# cannot do this: the credential change clears it.
_ANCHOR_INIT = r"""
import os, signal, sys, threading
os.unshare(os.CLONE_NEWUSER)
sys.stdout.write("map\n"); sys.stdout.flush()
if sys.stdin.readline().strip() != "go":
    sys.exit(1)
os.setgroups([]); os.setresgid(0, 0, 0); os.setresuid(0, 0, 0)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
def exit_when_the_owner_is_gone():
    while os.read(0, 4096):
        pass
    os._exit(0)
threading.Thread(target=exit_when_the_owner_is_gone, daemon=True).start()
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    signal.sigwait({signal.SIGCHLD})
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
"""


class LocalSandboxUnavailable(RuntimeError):
    """This machine cannot run the local sandbox (not Linux, not root, a tool missing)."""


def check_prerequisites() -> None:
    """Raise ``LocalSandboxUnavailable`` saying what is missing; return when the local sandbox can run."""
    if not sys.platform.startswith("linux"):
        raise LocalSandboxUnavailable(f"the local sandbox needs Linux namespaces; this is {sys.platform}")
    if os.geteuid() != 0:
        raise LocalSandboxUnavailable(
            "the local sandbox must run as root (it creates mount, PID and network namespaces and maps the "
            "sandbox's users to host uids 100000..165535); use a cloud or docker environment otherwise"
        )
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise LocalSandboxUnavailable(f"the local sandbox needs {', '.join(missing)} on PATH (util-linux, tar, bash)")
    if not Path("/proc/self/ns/user").exists():
        raise LocalSandboxUnavailable("this kernel has no user namespaces (/proc/self/ns/user is missing)")


def agents_dir() -> Path:
    """The repository's ``.agents`` directory (host-installed agent CLIs), whether or not it exists."""
    return Path(__file__).resolve().parents[1] / ".agents"


class LocalEnvironment(BaseEnvironment):
    """One Harbor trial's isolated sandbox on this machine (module docstring: the contract)."""

    def __init__(
        self,
        *args,
        allow_ports: Iterable[int] = (),
        ro_paths: Iterable[str] = (),
        sandbox_dir: str | None = None,
        **kwargs,
    ) -> None:
        self._allow_ports = tuple(int(port) for port in allow_ports)
        self._ro_paths = tuple(str(path) for path in ro_paths)
        self._sandbox_parent = sandbox_dir
        self._base: Path | None = None
        self._anchor: asyncio.subprocess.Process | None = None
        self._anchor_pid: int | None = None
        self._forwarder: LoopbackPortForwarder | None = None
        self._verifier_phase = False
        self._running: set[int] = set()
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def preflight(cls) -> None:
        check_prerequisites()

    def _validate_definition(self) -> None:
        if self.os != TaskOS.LINUX:
            raise LocalSandboxUnavailable(f"the local sandbox runs Linux tasks only, not {self.os.value}")
        for port in self._allow_ports:
            if not 0 < port < 65536:
                raise ValueError(f"allow_ports: {port} is not a TCP port (1..65535)")
        for path in self._ro_paths:
            if not PurePosixPath(path).is_absolute():
                raise ValueError(f"ro_paths: {path!r} is not an absolute path")
        check_prerequisites()

    @property
    def workdir(self) -> str:
        """The task's working directory inside the sandbox."""
        return self.task_env_config.workdir or DEFAULT_WORKDIR

    @property
    def root_dir(self) -> Path | None:
        """The sandbox's root as a host path (None before ``start``); for inspection, never for writing."""
        return None if self._base is None else self._base / "root"

    @property
    def in_verifier_phase(self) -> bool:
        return self._verifier_phase

    async def start(self, force_build: bool) -> None:
        if self._anchor is not None:
            raise RuntimeError(f"local sandbox {self.session_id} is already started")
        parent = self._sandbox_parent
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self._base = Path(tempfile.mkdtemp(prefix="harbor-local-", dir=parent)).resolve()
        try:
            binds = self._build_root(self._base)
            await self._start_anchor(binds)
            if self._allow_ports:
                self._forwarder = await LoopbackPortForwarder.start(
                    f"/proc/{self._anchor_pid}/ns/net", self._allow_ports
                )
        except BaseException:
            await self.stop(delete=True)
            raise

    async def stop(self, delete: bool) -> None:
        try:
            if self._forwarder is not None:
                forwarder, self._forwarder = self._forwarder, None
                await forwarder.close()
        finally:
            try:
                await self._kill_anchor()
            finally:
                if self._base is not None and delete:
                    await asyncio.to_thread(shutil.rmtree, self._base, True)
                    self._base = None

    async def _kill_anchor(self) -> None:
        """Kill the anchor (its PID namespace, so every process of the trial, goes with it) and reap it."""
        for pid in list(self._running):
            _kill_tree(pid)
        if self._anchor is None:
            return
        anchor, self._anchor = self._anchor, None
        # os.kill, not Process.kill: Popen reaps the process there, which asyncio's watcher would miss.
        for pid in (self._anchor_pid, anchor.pid):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._anchor_pid = None
        if anchor.stdin is not None:
            anchor.stdin.close()
        await anchor.wait()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        as_root = self._runs_as_root(self._resolve_user(user))
        merged = {**self._base_env(as_root), **(self._merge_env(env) or {})}
        returncode, stdout, stderr = await self._run(
            ["bash", "-c", command], as_root=as_root, cwd=cwd or self.workdir, env=merged, timeout_sec=timeout_sec
        )
        return ExecResult(
            stdout=stdout.decode(errors="replace"), stderr=stderr.decode(errors="replace"), return_code=returncode
        )

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = _sandbox_path(target_path, self.workdir)
        await self._upload(target.parent, [(Path(source_path), target.name)])

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        if not source.is_dir():
            raise NotADirectoryError(f"upload_dir: {source} is not a directory")
        target = _sandbox_path(target_dir, self.workdir)
        if target == PurePosixPath(TESTS_DIR) or target.is_relative_to(TESTS_DIR):
            await self._enter_verifier_phase()
        await self._upload(target, [(child, child.name) for child in sorted(source.iterdir())])

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        source = _sandbox_path(source_path, self.workdir)
        returncode, stdout, stderr = await self._run(
            ["cat", "--", str(source)], as_root=True, cwd="/", env=self._base_env(True), timeout_sec=None
        )
        if returncode != 0:
            raise FileNotFoundError(f"download_file: {source} in {self.session_id}: {stderr.decode(errors='replace')}")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(stdout)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        source = _sandbox_path(source_dir, self.workdir)
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            returncode, _, stderr = await self._run(
                ["tar", "-c", "-C", str(source), "."],
                as_root=True,
                cwd="/",
                env=self._base_env(True),
                timeout_sec=None,
                stdout=archive,
            )
            if returncode != 0:
                raise FileNotFoundError(
                    f"download_dir: {source} in {self.session_id}: {stderr.decode(errors='replace')}"
                )
            archive.seek(0)
            with tarfile.open(fileobj=archive, mode="r:") as tar:
                tar.extractall(target, filter=transfer_tar_filter)

    # -- the tree and the anchor -------------------------------------------------------------------------

    def _build_root(self, base: Path) -> list[str]:
        """Lay out ``base/root`` (mount points, private dirs, owners) and the passwd/group overlays.

        Returns the host paths to bind read-only at the same paths inside. Runs before any process of the
        trial exists, so writing here as the host's root is safe.
        """
        root = base / "root"
        root.mkdir()
        binds: list[str] = []
        for system_dir in SYSTEM_DIRS:
            _expose(root, Path(system_dir), binds)
        for extra in (sys.base_prefix, sys.exec_prefix, sys.prefix, str(agents_dir()), *self._ro_paths):
            if Path(extra).exists():
                _expose(root, Path(extra), binds)
        for mount_point in ("proc", "dev", "run", "var"):
            (root / mount_point).mkdir(exist_ok=True)
        owned_by_root = ["/", TESTS_DIR, "/logs", "/logs/verifier", "/root", "/run", "/var"]
        owned_by_agent = [self.workdir, "/solution", "/logs/agent", "/logs/artifacts", AGENT_HOME]
        for path in owned_by_root + owned_by_agent:
            (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        app = self.environment_dir / "app"
        if app.is_dir():
            shutil.copytree(app, root / self.workdir.lstrip("/"), symlinks=True, dirs_exist_ok=True)
        for path in owned_by_root:
            _chown(root / path.lstrip("/"), 0)
        for path in owned_by_agent:
            _chown_tree(root / path.lstrip("/"), AGENT_UID)
        _chown(root / "root", 0, mode=0o711)
        for tmp in ("tmp", "var/tmp"):
            (root / tmp).mkdir(parents=True, exist_ok=True)
            _chown(root / tmp, 0, mode=0o1777)
        (base / "passwd").write_text(
            _with_agent(Path("/etc/passwd"), f"{AGENT_NAME}:x:{AGENT_UID}:{AGENT_UID}::{AGENT_HOME}:/bin/bash")
        )
        (base / "group").write_text(_with_agent(Path("/etc/group"), f"{AGENT_NAME}:x:{AGENT_UID}:"))
        return binds

    async def _start_anchor(self, binds: list[str]) -> None:
        assert self._base is not None
        self._anchor = await asyncio.create_subprocess_exec(
            "setpriv",
            "--pdeathsig=KILL",
            "unshare",
            "--mount",
            "--pid",
            "--net",
            "--ipc",
            "--uts",
            "--fork",
            "--kill-child",
            "--propagation=private",
            "--",
            "sh",
            "-c",
            _ANCHOR_SETUP,
            _ANCHOR_INIT,
            str(self._base / "root"),
            sys.executable,
            *binds,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", DEFAULT_PATH), "LC_ALL": "C"},
        )
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await self._expect_line("map")
                self._anchor_pid = _only_child(self._anchor.pid)
                for kind in ("uid_map", "gid_map"):
                    Path(f"/proc/{self._anchor_pid}/{kind}").write_text(f"0 {HOST_UID_BASE} {MAPPED_IDS}\n")
                assert self._anchor.stdin is not None
                self._anchor.stdin.write(b"go\n")
                await self._anchor.stdin.drain()
                await self._expect_line("ready")
        except TimeoutError as exc:
            raise LocalSandboxUnavailable(f"the local sandbox did not start within {START_TIMEOUT_S:.0f}s") from exc

    async def _expect_line(self, expected: str) -> None:
        assert self._anchor is not None and self._anchor.stdout is not None and self._anchor.stderr is not None
        line = (await self._anchor.stdout.readline()).decode(errors="replace").strip()
        if line != expected:
            await self._anchor.wait()
            error = (await self._anchor.stderr.read()).decode(errors="replace").strip()
            raise LocalSandboxUnavailable(
                f"the local sandbox failed to start (exit {self._anchor.returncode}): {error or 'no output'}"
            )

    # -- running inside ----------------------------------------------------------------------------------

    def _runs_as_root(self, user: str | int | None) -> bool:
        if user is None:
            return self._verifier_phase
        return str(user) in ("root", "0")

    def _base_env(self, as_root: bool) -> dict[str, str]:
        home, name = ("/root", "root") if as_root else (AGENT_HOME, AGENT_NAME)
        return {"PATH": DEFAULT_PATH, "HOME": home, "USER": name, "LOGNAME": name, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}

    async def _enter_verifier_phase(self) -> None:
        """Kill every process left in the sandbox, then run ``user=None`` execs as ``root`` from now on."""
        if self._verifier_phase:
            return
        self._verifier_phase = True
        await self._run(["kill", "-KILL", "-1"], as_root=True, cwd="/", env=self._base_env(True), timeout_sec=30)

    async def _upload(self, target: PurePosixPath, entries: list[tuple[Path, str]]) -> None:
        """Unpack ``entries`` (host path, name) into ``target`` with ``tar`` inside, as the phase's user."""
        as_root = self._verifier_phase
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w:") as tar:
                for source, name in entries:
                    if not source.exists():
                        raise FileNotFoundError(f"upload: {source} does not exist")
                    tar.add(source, arcname=name)
            archive.seek(0)
            quoted = shlex.quote(str(target))
            returncode, _, stderr = await self._run(
                ["bash", "-c", f"mkdir -p -- {quoted} && tar -x --no-same-owner -f - -C {quoted}"],
                as_root=as_root,
                cwd="/",
                env=self._base_env(as_root),
                timeout_sec=None,
                stdin=archive,
            )
        if returncode != 0:
            raise RuntimeError(f"upload into {target} in {self.session_id} failed: {stderr.decode(errors='replace')}")

    async def _run(
        self,
        argv: list[str],
        *,
        as_root: bool,
        cwd: str,
        env: dict[str, str],
        timeout_sec: float | None,
        stdin=None,
        stdout=None,
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` inside the sandbox with exactly ``env``; kill its process tree on timeout or cancel."""
        if self._anchor_pid is None:
            raise RuntimeError(f"local sandbox {self.session_id} is not running")
        command = ["nsenter", "-t", str(self._anchor_pid), "-U", "-m", "-n", "-p", "-i", "-u", f"--wdns={cwd}", "--"]
        if not as_root:
            command += [
                "setpriv",
                f"--reuid={AGENT_UID}",
                f"--regid={AGENT_UID}",
                "--clear-groups",
                "--no-new-privs",
                "--inh-caps=-all",
                "--",
            ]
        with (
            tempfile.TemporaryFile() as out_file,
            tempfile.TemporaryFile() as err_file,
        ):
            process = await asyncio.create_subprocess_exec(
                *command,
                *argv,
                stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=stdout if stdout is not None else out_file,
                stderr=err_file,
                env=env,
                start_new_session=True,
            )
            self._running.add(process.pid)
            try:
                await asyncio.wait_for(process.wait(), timeout_sec)
            except TimeoutError as exc:
                _kill_tree(process.pid)
                await process.wait()
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from exc
            except BaseException:
                _kill_tree(process.pid)
                await asyncio.shield(process.wait())
                raise
            finally:
                self._running.discard(process.pid)
            out_file.seek(0)
            err_file.seek(0)
            return process.returncode or 0, out_file.read(), err_file.read()


def _sandbox_path(path: str, workdir: str) -> PurePosixPath:
    """``path`` as an absolute sandbox path (relative: under ``workdir``), with no ``..`` left in it."""
    joined = PurePosixPath(workdir) / path
    parts: list[str] = []
    for part in joined.parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return PurePosixPath("/", *parts)


def _expose(root: Path, host_path: Path, binds: list[str]) -> None:
    """Make ``host_path`` appear at the same path under ``root``: a symlink as a symlink, a dir bind-mounted."""
    target = root / str(host_path).lstrip("/")
    if host_path.is_symlink() and host_path.parent == Path("/"):
        if not target.exists() and not target.is_symlink():
            target.symlink_to(os.readlink(host_path))
        return
    real = Path(os.path.realpath(host_path))
    if not real.is_dir() or any(real == Path(b) or real.is_relative_to(b) for b in binds):
        if real != host_path and not target.exists() and not target.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(real)
        return
    binds[:] = [b for b in binds if not Path(b).is_relative_to(real)]
    (root / str(real).lstrip("/")).mkdir(parents=True, exist_ok=True)
    binds.append(str(real))
    if real != host_path and not target.exists() and not target.is_symlink():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(real)


def _chown(path: Path, uid: int, *, mode: int | None = None) -> None:
    os.lchown(path, HOST_UID_BASE + uid, HOST_UID_BASE + uid)
    if mode is not None:
        path.chmod(mode)


def _chown_tree(path: Path, uid: int) -> None:
    _chown(path, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            _chown(Path(dirpath) / name, uid)


def _with_agent(host_file: Path, entry: str) -> str:
    """The host's passwd/group without any entry for the agent's name or id, plus ``entry``."""
    name, _, ident = entry.split(":")[:3]
    lines = host_file.read_text().splitlines() if host_file.exists() else []
    kept = [line for line in lines if line.split(":")[0] != name and line.split(":")[2:3] != [ident]]
    return "\n".join([*kept, entry]) + "\n"


def _only_child(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise LocalSandboxUnavailable(f"unshare {pid} should have one child (the anchor), has {children}")
    return int(children[0])


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _kill_tree(pid: int) -> None:
    """SIGSTOP ``pid`` and its descendants until no new one appears, then SIGKILL them all."""
    stopped: set[int] = set()
    while True:
        parents = _parents()
        tree, frontier = {pid}, [pid]
        while frontier:
            children = [child for child, parent in parents.items() if parent in frontier and child not in tree]
            tree.update(children)
            frontier = children
        fresh = {p for p in tree if p in parents} - stopped
        if not fresh:
            break
        for p in fresh:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        stopped |= fresh
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
