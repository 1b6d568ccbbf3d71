"""The reward of a Harbor session is the verifier's, read after the trial; unscorable is None, never 0.

Real Harbor trials in the local sandbox, each with its own proxy session, with agents that need no model
(Harbor's ``oracle`` and ``nop``, and test agents loaded by import path), so every case is quick: a reward the
verifier wrote is read under the selected key, a real 0 stays 0, and a missing reward file, a non-finite or
absent value, or a trial Harbor marks ``reward_valid=False`` gives None. The trainer's rollout sees the same.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from harness_grpo.agents import REGISTRY, AgentCommand, AgentLaunch, AgentSpec, Install
from harness_grpo.agents.spec import BIN_DIRS
from harness_grpo.harbor_sessions import HarborSession, HarborTrialError, HarborTrialSessionFactory
from harness_grpo.rollouts import run_rollout
from tests.agents.conftest import AgentStack
from tests.harbor.conftest import AGENT_MODEL, bound_factory, make_task

TRIAL_TIMEOUT_S = 60.0
ORACLE_ANSWERS = "#!/bin/bash\necho 42 > /app/answer.txt\n"


def verifier(body: str) -> str:
    """A tests/test.sh that runs ``body`` in /logs/verifier."""
    return f"#!/bin/bash\nmkdir -p /logs/verifier && cd /logs/verifier\n{body}\n"


ANSWER_IS_42 = verifier('if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1; else echo 0; fi > reward.txt')
TWO_REWARDS = verifier('echo \'{"reward": 0.5, "style": 0.75}\' > reward.json')


def _run(stack: AgentStack, tmp_path: Path, harness: str, test: str, reward_key: str = "reward") -> HarborSession:
    task = make_task(tmp_path, "answer", test=test, solve=ORACLE_ANSWERS)
    factory = bound_factory(stack, harness=harness, reward_key=reward_key, trials_dir=tmp_path / "trials")
    session = factory.create_from_row({"prompt": "x", "task_path": str(task)}, seed=0, episode_id="reward-test")
    try:
        session.wait_for_completion(TRIAL_TIMEOUT_S)
    finally:
        session.close()
    return session


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("harness", "test", "reward_key", "expected"),
    [
        pytest.param("oracle", ANSWER_IS_42, "reward", 1.0, id="solved"),
        pytest.param("nop", ANSWER_IS_42, "reward", 0.0, id="unsolved-is-a-real-zero"),
        pytest.param("oracle", TWO_REWARDS, "style", 0.75, id="selected-key"),
        pytest.param("oracle", TWO_REWARDS, "missing", None, id="absent-key"),
        pytest.param("oracle", verifier("true"), "reward", None, id="no-reward-file"),
        pytest.param("oracle", verifier("echo '{\"reward\": NaN}' > reward.json"), "reward", None, id="not-finite"),
        pytest.param("tests.harbor.agents:ExitsNonZero", ANSWER_IS_42, "reward", None, id="reward-invalid"),
    ],
)
def test_reward_is_the_verifiers_or_none(
    agent_stack: AgentStack, tmp_path: Path, harness: str, test: str, reward_key: str, expected: float | None
) -> None:
    session = _run(agent_stack, tmp_path, harness, test, reward_key)
    assert session.result is not None
    verdict = session.verify()
    assert verdict.env_reward == expected, session.result.exception_info
    if harness.endswith("ExitsNonZero"):  # the verifier did score it; Harbor says the score is not valid
        assert session.result.verifier_result.rewards == {"reward": 1.0}
        assert not session.result.reward_valid
    if test == TWO_REWARDS:
        assert verdict.metrics == {"verifier/reward": 0.5, "verifier/style": 0.75}


@pytest.mark.timeout(120)
def test_a_harbor_agent_by_import_path_gets_the_proxy_and_the_session_key(
    agent_stack: AgentStack, tmp_path: Path
) -> None:
    """Harbor configures it (``base_url`` = proxy /v1, key under ``model_api_key_name``); its call is captured."""
    task = make_task(tmp_path, "answer", test=ANSWER_IS_42)
    factory = bound_factory(agent_stack, harness="tests.harbor.agents:AsksTheModelOnce", trials_dir=tmp_path / "t")
    session = factory.create_from_row({"prompt": "x", "task_path": str(task)}, seed=0, episode_id="import-path")
    try:
        assert session.wait_for_completion(TRIAL_TIMEOUT_S) == 0
        trace = session.fetch_training_trace()
    finally:
        session.close()
    assert session.result.exception_info is None
    url, model = json.loads(session.result.agent_result.metadata["connection"])
    assert (url, model) == (f"{agent_stack.url}/v1", f"openai/{AGENT_MODEL}")
    assert len(trace.turns) == 1 and trace.turns[0].request["messages"] == [{"role": "user", "content": "hi"}]
    assert session.verify().env_reward == 0.0


@pytest.mark.timeout(120)
def test_the_trainers_rollout_reads_the_trial(
    agent_stack: AgentStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    task = make_task(tmp_path, "answer", test=ANSWER_IS_42, solve=ORACLE_ANSWERS)
    factory = bound_factory(agent_stack, harness="oracle")
    row = {"prompt": [{"role": "user", "content": "Write 42 into /app/answer.txt."}], "task_path": str(task)}
    outcome = run_rollout(factory, row, seed=0, timeout_s=TRIAL_TIMEOUT_S)
    assert outcome.error is None and outcome.env_reward == 1.0 and not outcome.timed_out
    assert not [p for p in temporary.iterdir() if p.name.startswith("harbor-trial-")], "a session's trial dir stays"


def test_rows_find_their_task_by_path_name_or_instruction(tmp_path: Path) -> None:
    first = make_task(tmp_path, "first")
    second = make_task(tmp_path, "second")
    (second / "instruction.md").write_text("Write 43 into /app/answer.txt.\n")
    factory = HarborTrialSessionFactory(harness="oracle", sampling={}, tasks=tmp_path)
    assert factory.task_for({"task_path": str(second)}).path == second.resolve()
    assert factory.task_for({"task_name": "first"}).path == first.resolve()
    prompt = [{"role": "user", "content": "Write 43 into /app/answer.txt.\n"}]
    assert factory.task_for({"prompt": prompt}).name == "second"
    with pytest.raises(ValueError, match="no task has the instruction 'Write 44"):
        factory.task_for({"prompt": "Write 44 into /app/answer.txt."})
    with pytest.raises(ValueError, match="no task named 'third' among 2 tasks"):
        factory.task_for({"task_name": "third"})
    with pytest.raises(ValueError, match="no task_path and the factory was given no tasks"):
        HarborTrialSessionFactory(harness="oracle", sampling={}).task_for({"prompt": "x"})


def test_a_factory_it_cannot_run_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match=r"unknown harness 'nope': choose from opencode, codex, .*terminus-2"):
        HarborTrialSessionFactory(harness="nope", sampling={})
    with pytest.raises(ValueError, match=r"unknown sandbox 'cloud': choose local, a Harbor environment type \(docker"):
        HarborTrialSessionFactory(harness="opencode", sampling={}, sandbox="cloud")
    with pytest.raises(ValueError, match=r"sandbox 'e2b' runs opencode on another machine.*pass proxy_url"):
        HarborTrialSessionFactory(harness="opencode", sampling={}, sandbox="e2b")
    HarborTrialSessionFactory(harness="opencode", sampling={}, sandbox="e2b", proxy_url="https://proxy.example")
    HarborTrialSessionFactory(harness="terminus-2", sampling={}, sandbox="e2b")  # runs on the host, next to the proxy


def _configure_nothing(launch: AgentLaunch) -> AgentCommand:
    return AgentCommand(argv=[launch.binary], env={})


@pytest.mark.timeout(120)
def test_a_cli_the_sandbox_cannot_reach_is_a_clear_error(
    agent_stack: AgentStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry CLI installed where the local sandbox does not look (here the host's /tmp) is never run."""
    installed = tmp_path / "bin"
    installed.mkdir()
    (installed / "hidden-cli").write_text("#!/bin/sh\nexit 0\n")
    (installed / "hidden-cli").chmod(0o755)
    monkeypatch.setitem(BIN_DIRS, "pip", installed)
    install = Install("pip", "hidden-cli", "0")
    spec = AgentSpec("hidden-cli", "hidden-cli", "openai_chat", install, _configure_nothing, max_steps=1)
    monkeypatch.setitem(REGISTRY, spec.name, spec)
    task = make_task(tmp_path, "answer", test=ANSWER_IS_42)
    factory = bound_factory(agent_stack, harness="hidden-cli")
    session = factory.create_from_row({"prompt": "x", "task_path": str(task)}, seed=0, episode_id="hidden")
    try:
        with pytest.raises(HarborTrialError, match=r"AgentUnavailableError: hidden-cli: .*/hidden-cli is not reach"):
            session.wait_for_completion(TRIAL_TIMEOUT_S)
    finally:
        session.close()
    assert session.verify().env_reward is None
