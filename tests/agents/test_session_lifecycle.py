"""Agent processes end with their session: nothing they started outlives a close or a timeout, from any thread.

Both session kinds, a local agent program (``LocalAgentSessionFactory``) and a registry CLI
(``CLIAgentSessionFactory``, here a registry entry whose program leaves a child running), are one
``ProcessSession`` over a ``Sandbox``: the same close and timeout paths kill the process group, release the
proxy session and remove the sandbox.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from harness_grpo.agent_sessions import CLIAgentSessionFactory, LocalAgentSessionFactory, ProcessSession
from harness_grpo.agents import REGISTRY, AgentCommand, AgentLaunch, AgentSpec, Install
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext
from harness_grpo.sandbox import Sandbox
from harness_grpo.session_protocol import TrainerBoundSessionFactory
from tests.agents.processes import LEAVES_A_CHILD, wait_for_file, wait_gone


def _configure_leaves_a_child(launch: AgentLaunch) -> AgentCommand:
    return AgentCommand(
        argv=["bash", "-c", LEAVES_A_CHILD.format(tail="sleep 300")],
        env={"LEFT_BY": "test"},
        files={launch.home / "agent.conf": launch.api_key},
    )


LEAVES_A_CHILD_AGENT = AgentSpec(
    name="leaves-a-child",
    binary=Path(sys.executable).name,  # installed wherever the project's python is; bash runs the agent
    dialect="openai_chat",
    install=Install("pip", "leaves-a-child", "0"),
    configure=_configure_leaves_a_child,
    max_steps=None,
)


@pytest.fixture(params=["local", "cli"])
def factory(request: pytest.FixtureRequest, agent_stack: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each session kind, bound to the stack's proxy; its agent leaves ``sleep 300`` running and sleeps."""
    common = {"verifier": lambda workdir, task: float((workdir / "child.pid").exists()), "sampling": {}}
    if request.param == "local":
        made = LocalAgentSessionFactory(command=["bash", "-c", LEAVES_A_CHILD.format(tail="sleep 300")], **common)
    else:
        monkeypatch.setitem(REGISTRY, LEAVES_A_CHILD_AGENT.name, LEAVES_A_CHILD_AGENT)
        made = CLIAgentSessionFactory(agent=LEAVES_A_CHILD_AGENT.name, **common)
    made.bind_rollout(
        RolloutContext(ProxyEndpoint(agent_stack.url, agent_stack.proxy.admin_key), model_name=agent_stack.served_model)
    )
    return made


@pytest.mark.timeout(120)
def test_session_closed_from_another_thread_ends_the_agent_and_its_children(factory: Any) -> None:
    assert isinstance(factory, TrainerBoundSessionFactory)
    session = factory.create("x", seed=0, episode_id="lifecycle")
    assert isinstance(session, ProcessSession) and isinstance(session.sandbox, Sandbox)
    workdir = session.sandbox.workdir
    exit_codes: list[int] = []
    waiter = threading.Thread(target=lambda: exit_codes.append(session.wait_for_completion(300)))
    waiter.start()
    child = int(wait_for_file(workdir / "child.pid").read_text())
    assert session.verify().env_reward == 1.0  # the verifier reads the sandbox's working tree
    if isinstance(factory, CLIAgentSessionFactory):  # the registry entry's config went in through the sandbox
        assert session.sandbox.read_file(session.sandbox.home / "agent.conf").decode() == session.api_key
    session.close()
    waiter.join(10)
    assert not waiter.is_alive() and exit_codes == [-9]
    assert wait_gone(child)
    assert not workdir.exists() and session.lease.key is None
    session.close()  # twice is fine


@pytest.mark.timeout(120)
def test_session_past_its_timeout_raises_timeout_error_and_leaves_nothing_running(factory: Any) -> None:
    session = factory.create("x", seed=0, episode_id="timeout")
    try:
        with pytest.raises(TimeoutError, match=r"did not finish within 2\.0 s"):
            session.wait_for_completion(2.0)
        assert session.result is not None and session.result.timed_out
        assert wait_gone(int((session.sandbox.workdir / "child.pid").read_text()))
        assert session.fetch_training_trace().turns == []  # the lease still answers until close
    finally:
        session.close()
    assert session.lease.key is None and not session.sandbox.workdir.exists()


def test_an_unknown_agent_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown agent 'nope'; choose from opencode, codex, claude-code"):
        CLIAgentSessionFactory(agent="nope", verifier=lambda workdir, task: 0.0, sampling={})
