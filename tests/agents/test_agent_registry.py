"""The agent registry: one complete entry per coding-agent CLI, the install script's pins come from it, and
each entry's ``configure`` wires the agent to the proxy in the dialect it declares."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness_grpo.agents import (
    AGENTS,
    REGISTRY,
    AgentLaunch,
    AgentSpec,
    Install,
    agent_binary,
    get_agent,
    install_specs,
    run_agent,
)
from harness_grpo.agents.spec import BIN_DIRS
from harness_grpo.sandbox import TempDirSandbox
from proxy.dialects import DIALECTS

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "launchers" / "install_agents.sh"
BASE_URL = "http://127.0.0.1:9"


def test_every_agent_has_a_complete_entry() -> None:
    assert AGENTS == ("opencode", "codex", "claude-code", "mini-swe-agent")
    for name in AGENTS:
        spec = get_agent(name)
        assert isinstance(spec, AgentSpec) and spec.name == name
        assert spec.dialect in DIALECTS, f"{name} speaks {spec.dialect}, which the proxy does not"
        assert spec.install.manager in BIN_DIRS and re.fullmatch(r"\d+(\.\d+)+", spec.install.version)
        assert spec.binary_path == BIN_DIRS[spec.install.manager] / spec.binary
        assert spec.max_steps is None or spec.max_steps > 0


@pytest.mark.parametrize("name", AGENTS)
def test_configure_wires_the_agent_to_the_proxy_in_its_dialect(name: str, tmp_path: Path) -> None:
    spec = get_agent(name)
    workdir, home = tmp_path / "work", tmp_path / "home"
    launch = AgentLaunch(
        binary="/bin/agent", base_url=BASE_URL, api_key="sk-session-key", model="policy", task="do the task",
        workdir=workdir, home=home, max_steps=4242, system_prompt="SHORT PROMPT",
    )  # fmt: skip
    command = spec.configure(launch)
    given = " ".join([*command.argv, *command.env.values(), *command.files.values()])
    assert command.argv[0] == "/bin/agent" and "do the task" in command.argv
    assert "sk-session-key" in given and "SHORT PROMPT" in given
    if spec.dialect == "anthropic_messages":  # the client appends /v1/messages itself
        assert command.env["ANTHROPIC_BASE_URL"] == BASE_URL
    else:
        assert f"{BASE_URL}/v1" in given
    if spec.max_steps is not None:
        assert "4242" in given, f"{name} ignores max_steps"
    for path in [*command.files, *command.outputs.values()]:
        assert path.is_relative_to(workdir) or path.is_relative_to(home), path
    for text in command.files.values():
        if text.lstrip().startswith("{"):
            json.loads(text)


@pytest.mark.parametrize("manager", ["npm", "pip"])
def test_install_specs_printed_are_the_registry_pins(manager: str) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "harness_grpo.agents", "--install-specs", manager],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    pins = [spec.install.spec for spec in REGISTRY.values() if spec.install.manager == manager]
    assert printed == install_specs(manager) == pins and pins


def test_install_agents_sh_installs_the_registry_pins_and_repeats_none() -> None:
    script = INSTALL_SCRIPT.read_text()
    for manager in ("npm", "pip"):
        assert f"--install-specs {manager}" in script and f"--binaries {manager}" in script
    for spec in REGISTRY.values():
        assert spec.install.version not in script, f"install_agents.sh repeats {spec.name}'s pin"


@pytest.mark.parametrize("name", AGENTS)
def test_the_installed_agent_is_the_pinned_version(name: str) -> None:
    if agent_binary(name) is None:
        pytest.skip(f"{name} is not installed: run launchers/install_agents.sh")
    install: Install = get_agent(name).install
    if install.manager == "npm":
        package_json = REPO / ".agents" / "node_modules" / install.package / "package.json"
        installed = json.loads(package_json.read_text())["version"]
    else:
        installed = importlib.metadata.version(install.package)
    assert installed == install.version


def test_an_unknown_agent_is_a_clear_error() -> None:
    for lookup in (get_agent, agent_binary):
        with pytest.raises(ValueError, match=r"unknown agent 'nope'; choose from opencode, codex, claude-code, mini"):
            lookup("nope")
    refused = subprocess.run(
        [sys.executable, "-m", "harness_grpo.agents", "--install-specs", "yarn"], cwd=REPO, capture_output=True
    )
    assert refused.returncode == 2 and b"invalid choice" in refused.stderr


def test_running_an_agent_that_is_not_installed_names_the_install_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = dataclasses.replace(get_agent("opencode"), name="missing", binary="no-such-binary")
    monkeypatch.setitem(REGISTRY, "missing", missing)
    sandbox = TempDirSandbox(dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"missing is not installed; run launchers/install_agents\.sh"):
        run_agent("missing", sandbox, base_url=BASE_URL, api_key="k", model="m", task="t", timeout_s=5)
    sandbox.close()
