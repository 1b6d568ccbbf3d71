"""Run the real coding-agent CLIs against an OpenAI/Anthropic-compatible base URL, hermetically.

One function per agent. Each writes the agent's config into a scratch directory, runs the CLI as a
subprocess in ``workdir`` with a hard timeout (the whole process group is killed when it fires),
and returns an ``AgentRun``. Nothing is read from or written to the real ``$HOME``: ``home`` holds
every config, cache and log the agent keeps, and the environment is built from scratch (only
``PATH``, locale and the agent's own variables), so a host API key can never leak into a run.

The agent's API key is the capture proxy's session key (REFERENCE §5.3), so every call it makes
lands in that session. The CLIs come from ``launchers/install_agents.sh``:
``.agents/node_modules/.bin/{opencode,codex,claude}`` and ``.venv/bin/mini``.

Wiring (REFERENCE §4.4):

- opencode: ``opencode.json`` in the project with a custom ``@ai-sdk/openai-compatible`` provider
  (``baseURL`` = ``<proxy>/v1``), ``opencode run``; chat completions.
- codex: ``$CODEX_HOME/config.toml`` with a custom model provider (``wire_api = "responses"``,
  ``env_key``), ``codex exec --skip-git-repo-check``, no sandbox; Responses API.
- claude-code: ``ANTHROPIC_BASE_URL`` = the proxy root WITHOUT ``/v1``, every model alias pinned to
  the served name, ``claude -p``; Anthropic Messages.
- mini-swe-agent: LiteLLM ``openai/<model>`` with ``OPENAI_API_BASE`` = ``<proxy>/v1``, ``mini -y
  --exit-immediately``; chat completions.

``CLIAgentSessionFactory`` makes any of them a training harness: one CLI process per rollout, in
its own working directory and proxy session, scored by the task's verifier on that directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_grpo.rollout_context import ProxySessionLease, RolloutContext
from harness_grpo.session_protocol import VerifyResult, instruction_of
from proxy.trace import TrainingTrace

REPO = Path(__file__).resolve().parents[1]
NODE_BIN = REPO / ".agents" / "node_modules" / ".bin"
VENV_BIN = Path(sys.prefix) / "bin"
AGENTS = ("opencode", "codex", "claude-code", "mini-swe-agent")
DEFAULT_TIMEOUT_S = 110.0


def agent_binary(agent: str) -> Path | None:
    """The installed CLI for ``agent``, or None when ``launchers/install_agents.sh`` has not run."""
    path = {
        "opencode": NODE_BIN / "opencode",
        "codex": NODE_BIN / "codex",
        "claude-code": NODE_BIN / "claude",
        "mini-swe-agent": VENV_BIN / "mini",
    }[agent]
    return path if path.exists() and os.access(path, os.X_OK) else None


@dataclass
class AgentRun:
    """What one agent process did."""

    agent: str
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool
    workdir: Path
    home: Path
    files: dict[str, Path] = field(default_factory=dict)

    def tail(self, chars: int = 4000) -> str:
        """The end of stdout and stderr, for assertion messages."""
        return (
            f"--- {self.agent} rc={self.returncode} timed_out={self.timed_out} {self.elapsed_s:.1f}s\n"
            f"--- stdout\n{self.stdout[-chars:]}\n--- stderr\n{self.stderr[-chars:]}"
        )


def hermetic_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """A fresh environment whose HOME and XDG dirs are all under ``home``; nothing else is inherited."""
    dirs = {
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_CACHE_HOME": home / ".cache",
        "TMPDIR": home / "tmp",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        **{name: str(path) for name, path in dirs.items()},
    }
    env.update(extra)
    return env


def run_process(
    agent: str,
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    home: Path,
    timeout_s: float,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> AgentRun:
    """Run ``argv`` in its own process group with stdin closed; kill the group at ``timeout_s`` and at
    the end (nothing the agent started outlives it). The run ends when the agent process exits, even if
    something it started still holds its output open. ``on_start`` gets the process once it runs."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
        timed_out = False
        try:
            if on_start is not None:
                on_start(proc)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return AgentRun(agent, argv, proc.returncode, stdout, stderr, time.monotonic() - started, timed_out, cwd, home)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group this module started for ``proc`` (agents spawn shells and tool servers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_opencode(
    *,
    base_url: str,
    api_key: str,
    model: str,
    task: str,
    workdir: Path,
    home: Path,
    max_steps: int = 6,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    system_prompt: str | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> AgentRun:
    """``opencode run`` with a custom OpenAI-compatible provider at ``<base_url>/v1``.

    ``small_model`` is the same model, so opencode's title call goes through the proxy too (an
    auxiliary, toolless call). ``steps`` bounds the build agent's loop; every permission is allowed
    (nobody is there to answer a prompt). models.dev, autoupdate, sharing and LSP downloads are off.
    With ``system_prompt`` (see ``SMALL_MODEL_PROMPT``), the build agent's prompt is replaced and it
    keeps only its ``bash`` tool, opencode's own settings for small models.
    """
    binary = _require("opencode")
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "harness": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "harness",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": api_key},
                "models": {model: {"name": model, "tool_call": True}},
            }
        },
        "model": f"harness/{model}",
        "small_model": f"harness/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"*": "allow"},
        "agent": {"build": {"steps": max_steps}},
    }
    if system_prompt is not None:
        config["agent"]["build"]["prompt"] = system_prompt
        config["permission"] = {"*": "deny", "bash": "allow"}
    (workdir / "opencode.json").write_text(json.dumps(config, indent=2))
    env = hermetic_env(
        home,
        {
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        },
    )
    argv = [str(binary), "run", "--print-logs", "--model", f"harness/{model}", task]
    return run_process("opencode", argv, cwd=workdir, env=env, home=home, timeout_s=timeout_s, on_start=on_start)


def run_codex(
    *,
    base_url: str,
    api_key: str,
    model: str,
    task: str,
    workdir: Path,
    home: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    system_prompt: str | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> AgentRun:
    """``codex exec`` with a custom Responses-API provider at ``<base_url>/v1`` and no sandbox.

    ``CODEX_HOME`` is ``home/.codex`` holding only our ``config.toml``; the key travels in
    ``HARNESS_API_KEY`` (the provider's ``env_key``). codex has no step-limit flag: the proxy's
    ``max_model_calls`` bounds the session (its budget reply is plain text, which ends codex's turn).
    With ``system_prompt``, it replaces codex's base instructions (``model_instructions_file``).
    """
    binary = _require("codex")
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    instructions = ""
    if system_prompt is not None:
        (codex_home / "instructions.md").write_text(system_prompt)
        instructions = f'model_instructions_file = "{codex_home / "instructions.md"}"\n'
    (codex_home / "config.toml").write_text(
        instructions + f'model = "{model}"\n'
        'model_provider = "harness"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "\n"
        "[model_providers.harness]\n"
        'name = "harness"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "HARNESS_API_KEY"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
        "\n"
        "[features]\n"  # no plugin sync from github.com / chatgpt.com, no update checks
        "plugins = false\n"
        "remote_plugin = false\n"
        "in_app_updates = false\n"
    )
    env = hermetic_env(home, {"CODEX_HOME": str(codex_home), "HARNESS_API_KEY": api_key, "RUST_LOG": "warn"})
    last = home / "codex-last-message.txt"
    argv = [
        str(binary),
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--ephemeral",
        "--color",
        "never",
        "--json",
        "-C",
        str(workdir),
        "-o",
        str(last),
        task,
    ]
    run = run_process("codex", argv, cwd=workdir, env=env, home=home, timeout_s=timeout_s, on_start=on_start)
    run.files["last_message"] = last
    return run


def run_claude(
    *,
    base_url: str,
    api_key: str,
    model: str,
    task: str,
    workdir: Path,
    home: Path,
    max_turns: int = 6,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    system_prompt: str | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> AgentRun:
    """``claude -p`` against ``ANTHROPIC_BASE_URL`` = the proxy root (claude appends ``/v1/messages``).

    Every model alias (main, haiku/sonnet/opus defaults, subagents) is pinned to ``model`` so the
    extra calls claude-code makes (titles, quota checks, small-model helpers) also reach the proxy.
    As root, ``--dangerously-skip-permissions`` needs ``IS_SANDBOX=1``. With ``system_prompt``:
    ``--system-prompt`` and ``--tools Bash``.
    """
    binary = _require("claude")
    env = hermetic_env(
        home,
        {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
        },
    )
    argv = [
        str(binary),
        "-p",
        task,
        "--model",
        model,
        "--dangerously-skip-permissions",
        "--max-turns",
        str(max_turns),
        "--output-format",
        "json",
    ]
    if system_prompt is not None:
        argv += ["--system-prompt", system_prompt, "--tools", "Bash"]
    return run_process("claude-code", argv, cwd=workdir, env=env, home=home, timeout_s=timeout_s, on_start=on_start)


def run_mini(
    *,
    base_url: str,
    api_key: str,
    model: str,
    task: str,
    workdir: Path,
    home: Path,
    step_limit: int = 8,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    system_prompt: str | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> AgentRun:
    """mini-swe-agent's ``mini`` CLI, non-interactive (``-y --exit-immediately``), LiteLLM ``openai/<model>``.

    The global config dir is under ``home`` and ``MSWEA_CONFIGURED`` skips the first-run wizard;
    cost tracking ignores the unknown model; LiteLLM uses its bundled cost map (no fetch). The
    trajectory goes to ``home/mini.traj.json`` (``run.files["trajectory"]``). Its prompts are short
    already; ``system_prompt`` replaces its system template.
    """
    binary = _require("mini")
    env = hermetic_env(
        home,
        {
            "MSWEA_GLOBAL_CONFIG_DIR": str(home / "mini-swe-agent"),
            "MSWEA_CONFIGURED": "1",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_KEY": api_key,
            "OPENAI_API_BASE": f"{base_url}/v1",
            "PYTHONUNBUFFERED": "1",
        },
    )
    trajectory = home / "mini.traj.json"
    argv = [
        str(binary),
        "-y",
        "--exit-immediately",
        "-m",
        f"openai/{model}",
        "-t",
        task,
        "-c",
        "mini.yaml",
        "-c",
        f"agent.step_limit={step_limit}",
        "-c",
        "agent.cost_limit=0",
        *(["-c", f"agent.system_template={json.dumps(system_prompt)}"] if system_prompt is not None else []),
        "-o",
        str(trajectory),
    ]
    run = run_process("mini-swe-agent", argv, cwd=workdir, env=env, home=home, timeout_s=timeout_s, on_start=on_start)
    run.files["trajectory"] = trajectory
    return run


def _require(name: str) -> Path:
    agent = {"claude": "claude-code", "mini": "mini-swe-agent"}.get(name, name)
    binary = agent_binary(agent)
    if binary is None:
        raise FileNotFoundError(f"{agent} is not installed; run launchers/install_agents.sh")
    return binary


SMALL_MODEL_PROMPT = (
    "You are a coding agent in a terminal. Use the bash tool to run shell commands in the working "
    "directory. Answer briefly when the task is done."
)
"""A short system prompt for small models: every agent's own prompt and tool schemas fill 8-16k tokens."""

RUNNERS = {"opencode": run_opencode, "codex": run_codex, "claude-code": run_claude, "mini-swe-agent": run_mini}


class CLIAgentSession:
    """One coding-agent CLI run on one task, as a ``HarnessSession`` (see ``CLIAgentSessionFactory``)."""

    def __init__(
        self,
        factory: CLIAgentSessionFactory,
        task: Mapping[str, Any],
        context: RolloutContext,
        *,
        seed: int,
        episode_id: str,
    ) -> None:
        self.task = task
        self._factory = factory
        self._context = context
        self.root = Path(tempfile.mkdtemp(prefix=f"{factory.agent}-{episode_id[:8]}-", dir=factory.workdir_root))
        self.workdir, self.home = self.root / "work", self.root / "home"
        self.workdir.mkdir()
        self.home.mkdir()
        self.run: AgentRun | None = None
        self.lease: ProxySessionLease | None = None
        self._process: subprocess.Popen | None = None
        self._close_lock = threading.Lock()
        self._closed = False
        try:
            if factory.setup is not None:
                factory.setup(self.workdir, task)
            self.lease = context.lease({"episode_id": episode_id, "seed": seed, "agent": factory.agent})
        except BaseException:
            self.close()
            raise

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Run the agent to its end (blocking); ``TimeoutError`` when it was killed at ``timeout_s``."""
        assert self.lease is not None and self.lease.key is not None
        factory = self._factory
        self.run = RUNNERS[factory.agent](
            base_url=self._context.proxy.base_url,
            api_key=self.lease.key,
            model=self._context.model_name,
            task=instruction_of(self.task["prompt"]),
            workdir=self.workdir,
            home=self.home,
            timeout_s=timeout_s if timeout_s is not None else 3600.0,
            on_start=self._started,
            **({"system_prompt": factory.system_prompt} if factory.system_prompt is not None else {}),
        )
        if self.run.timed_out:
            raise TimeoutError(f"{factory.agent} did not finish within {timeout_s} s")
        return int(self.run.returncode or 0)

    def fetch_training_trace(self) -> TrainingTrace:
        assert self.lease is not None
        return self.lease.trace()

    def verify(self, transcript: str | None = None, final_state: Any = None) -> VerifyResult:
        return VerifyResult(env_reward=self._factory.verifier(self.workdir, self.task))

    def _started(self, process: subprocess.Popen) -> None:
        with self._close_lock:
            self._process = process
            if self._closed:  # closed while starting: the run ends at once
                _kill_group(process)

    def close(self) -> None:
        """Kill the agent's process group if it still runs, delete the proxy session and the scratch
        directory; safe from any thread, and twice."""
        with self._close_lock:
            self._closed = True
            if self._process is not None:
                _kill_group(self._process)
            if self.lease is not None:
                self.lease.release()
            shutil.rmtree(self.root, ignore_errors=True)


class CLIAgentSessionFactory:
    """Sessions that run ``agent`` (one of ``AGENTS``) as a local process against the trainer's proxy.

    The trainer supplies ``sampling`` and binds its proxy and budgets (``bind_rollout``);
    ``verifier(workdir, task)`` scores the agent's working directory, ``setup(workdir, task)``
    prepares it. ``system_prompt`` (e.g. ``SMALL_MODEL_PROMPT`` for the tiny model) replaces the
    agent's own prompt and keeps its shell tool only; the agent gets the task's prompt text.
    """

    def __init__(
        self,
        *,
        agent: str,
        verifier: Callable[[Path, Mapping[str, Any]], float | None],
        sampling: dict[str, Any],
        setup: Callable[[Path, Mapping[str, Any]], None] | None = None,
        system_prompt: str | None = None,
        workdir_root: str | None = None,
    ) -> None:
        if agent not in RUNNERS:
            raise ValueError(f"unknown agent {agent!r}; choose from {sorted(RUNNERS)}")
        if agent_binary(agent) is None:
            raise FileNotFoundError(f"{agent} is not installed; run launchers/install_agents.sh")
        self.agent = agent
        self.verifier = verifier
        self.setup = setup
        self.sampling = dict(sampling)
        self.system_prompt = system_prompt
        self.workdir_root = workdir_root
        self.context: RolloutContext | None = None

    def bind_rollout(self, context: RolloutContext) -> None:
        self.context = context

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> CLIAgentSession:
        return self.create_from_row({"prompt": prompt}, seed=seed or 0, episode_id=episode_id or uuid.uuid4().hex)

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> CLIAgentSession:
        if self.context is None:
            raise RuntimeError("CLIAgentSessionFactory is not bound to a proxy: the trainer calls bind_rollout")
        return CLIAgentSession(self, row, self.context, seed=seed, episode_id=episode_id)
