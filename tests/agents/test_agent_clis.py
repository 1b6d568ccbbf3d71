"""Real coding-agent CLIs carry a multi-turn session through the capture proxy, and the trace is exact.

For each agent (opencode, codex, claude-code, mini-swe-agent), run as a local process in a scratch
directory against the proxy (see ``conftest.py`` for the stack and the pluggable engine):

- the agent ends on its own (no timeout kill) with exit status 0, after using a tool at least once
  and sending the result back (a multi-turn session);
- the session's trace validates under OpenEnv's ``TrainingTrace``;
- the trace holds every call the engine served for the session and nothing else: turns and served
  calls match one to one on (prompt ids, completion ids), logprobs equal the engine's, and no call
  was refused or failed at the proxy (so every call the agent made reached the engine);
- every turn came in through the agent's dialect.

With the fake engine the tests also check that the agent really executed the model's tool calls
(``harness_steps.txt`` in its working directory) and that its turns were linked into one capture
path by exact token prefix.

``test_agent_session_on_the_warm_tiny_model`` runs each agent against the embedded engine serving
the warm-started tiny model (its own stack, whatever ``HARNESS_AGENT_ENGINE`` selects): every session
captured exactly, and a multi-turn session within a few attempts (see its docstring).

Skipped, with the reason, only when the CLI is not installed (``launchers/install_agents.sh``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from openenv.core.harness.training import TrainingTrace

from harness_grpo.agents import AGENTS, SMALL_MODEL_PROMPT, AgentRun, agent_binary, get_agent, run_agent
from harness_grpo.sandbox import TempDirSandbox
from tests.agents.conftest import STEPS_FILE, AgentStack, ServedCall, engine_choice

AGENT_MODEL = "harness-model"
"""The model name the agents are configured with; the proxy serves the engine's model whatever they ask."""
TASK = "Create a file named hello.txt containing the word hi. Use the shell."
REAL_ENGINE = engine_choice() != "fake"
# A CPU engine spends seconds per call (prefill of a 7-15k token agent prompt, then decoding), so
# real-engine sessions are shorter and get more time; the first test also waits for engine start.
MAX_MODEL_CALLS = 6 if REAL_ENGINE else 8
BUDGET_CALLS = 3 if REAL_ENGINE else 4
MAX_OUTPUT_TOKENS = int(os.environ.get("HARNESS_AGENT_MAX_OUTPUT_TOKENS", 160 if REAL_ENGINE else 256))
RUN_TIMEOUT_S = 300.0 if REAL_ENGINE else 110.0
TEST_TIMEOUT_S = 1200 if REAL_ENGINE else 240
WARM_ATTEMPTS = 5
WARM_TEMPERATURE = 0.2
WARM_MAX_CALLS = 4

pytestmark = pytest.mark.agents
INSTALLED_AGENTS = [
    pytest.param(
        agent,
        marks=pytest.mark.skipif(
            agent_binary(agent) is None, reason=f"{agent} CLI is not installed: run launchers/install_agents.sh"
        ),
    )
    for agent in AGENTS
]


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("agent", INSTALLED_AGENTS)
def test_agent_session_is_captured_exactly(agent: str, agent_stack: AgentStack, tmp_path: Path) -> None:
    run, served, trace, stats = _run_session(agent, agent_stack, tmp_path, MAX_MODEL_CALLS)
    assert run.returncode == 0, run.tail()
    _assert_trace_is_exact(trace, served, stats, run)
    turns = trace["turns"]
    assert {t["metadata"]["dialect"] for t in turns} == {get_agent(agent).dialect}, run.tail()
    assert any(m.get("role") == "tool" for t in turns for m in t["request"]["messages"]), (
        f"{agent} never sent a tool result back: not a multi-turn tool session\n{run.tail()}"
    )
    if agent_stack.engine.kind == "fake":
        _assert_fake_session(agent_stack, turns, run)
    if agent == "mini-swe-agent":  # mini's requests-based model, not its LiteLLM default (10 s of imports)
        trajectory = json.loads(run.files["trajectory"].read_text())
        assert trajectory["info"]["config"]["model_type"] == "harness_mini_model.ProxyChatModel", run.tail()


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("agent", INSTALLED_AGENTS)
def test_agent_stops_at_the_call_budget(agent: str, agent_stack: AgentStack, tmp_path: Path) -> None:
    """A model that never stops calling tools: the proxy's call budget ends the session, fully captured.

    This is the regime of a tool-happy model (the warm-started tiny model answers every request
    with a tool call): after ``BUDGET_CALLS`` engine calls the proxy answers "Step budget
    exhausted; stopping." itself (never recorded), and each agent must end its run on that reply.
    """
    fake = agent_stack.engine.fake
    saved = fake.tool_turns if fake is not None else 0
    if fake is not None:
        fake.tool_turns = 1000
    try:
        run, served, trace, stats = _run_session(agent, agent_stack, tmp_path, BUDGET_CALLS)
    finally:
        if fake is not None:
            fake.tool_turns = saved
    assert run.returncode == 0, run.tail()
    _assert_trace_is_exact(trace, served, stats, run)
    assert len(served) <= BUDGET_CALLS
    if fake is not None or stats["budget_refusals"]:
        assert len(served) == BUDGET_CALLS and stats["budget_refusals"] >= 1, (stats, run.tail())


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("agent", INSTALLED_AGENTS)
def test_agent_session_on_the_warm_tiny_model(agent: str, warm_tiny_stack: AgentStack, tmp_path: Path) -> None:
    """The agent against the embedded engine serving the warm-started tiny model: a real multi-turn session.

    Configured as a user of a small model would (``SMALL_MODEL_PROMPT``: a short system prompt, the
    shell tool only; each agent's own prompt and tool schemas fill 8-16k tokens, past what a 1.8M
    parameter model keeps coherent) and sampled at temperature ``WARM_TEMPERATURE``, pinned by the
    session. The tiny model does not always answer with a well-formed call, so the agent gets up to
    ``WARM_ATTEMPTS`` sessions: every session must be captured exactly (the trace holds every call the
    engine served, ids and logprobs equal), and at least one must carry a tool result back to the model.
    """
    outcomes = []
    for attempt in range(WARM_ATTEMPTS):
        run, served, trace, stats = _run_session(
            agent,
            warm_tiny_stack,
            tmp_path / f"attempt{attempt}",
            WARM_MAX_CALLS,
            sampling={"temperature": WARM_TEMPERATURE},
            system_prompt=SMALL_MODEL_PROMPT,
        )
        assert run.returncode == 0, run.tail()
        _assert_trace_is_exact(trace, served, stats, run, min_turns=1)
        turns = trace["turns"]
        assert {t["metadata"]["dialect"] for t in turns} == {get_agent(agent).dialect}, run.tail()
        multi_turn = any(m.get("role") == "tool" for t in turns for m in t["request"]["messages"])
        outcomes.append(f"attempt {attempt}: {len(turns)} calls, tool result sent back: {multi_turn}")
        if multi_turn:
            break
    print(f"{agent} on the warm tiny model: " + "; ".join(outcomes))
    assert multi_turn, f"{agent}: no multi-turn session in {WARM_ATTEMPTS} attempts: {outcomes}"


def _run_session(
    agent: str,
    stack: AgentStack,
    tmp_path: Path,
    max_model_calls: int,
    *,
    sampling: dict[str, Any] | None = None,
    system_prompt: str | None = None,
) -> tuple[AgentRun, list[ServedCall], dict[str, Any], dict[str, Any]]:
    """Run ``agent`` on ``TASK`` in a fresh session; returns the run, the engine calls, the trace and stats."""
    session, mark = stack.create_session(
        max_model_calls=max_model_calls,
        max_output_tokens=MAX_OUTPUT_TOKENS,
        metadata={"agent": agent},
        **({"sampling": sampling} if sampling is not None else {}),
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = run_agent(
        agent,
        TempDirSandbox(prefix=f"{agent}-", dir=tmp_path),  # left for the assertions; pytest removes tmp_path
        base_url=stack.url,
        api_key=session.api_key,
        model=AGENT_MODEL,
        task=TASK,
        timeout_s=RUN_TIMEOUT_S,
        system_prompt=system_prompt,
    )
    served = stack.served_since(mark)
    trace = stack.trace(session.session_id)
    stats = stack.session(session.session_id)["stats"]
    print(
        f"{agent}: {len(served)} calls captured, {stats['budget_refusals']} budget replies, "
        f"rc={run.returncode}, {run.elapsed_s:.1f}s (engine: {stack.engine.kind})"
    )
    assert not run.timed_out, f"{agent} did not finish within {RUN_TIMEOUT_S}s\n{run.tail()}"
    return run, served, trace, stats


def _assert_trace_is_exact(
    trace: dict[str, Any], served: list[ServedCall], stats: dict[str, Any], run: AgentRun, min_turns: int = 2
) -> None:
    TrainingTrace.model_validate(trace)
    assert not [c for c in served if c.is_probe], "a tier probe was counted as an agent call"
    assert stats["errors"] == 0, f"the proxy refused or failed {stats['errors']} of the agent's calls\n{run.tail()}"
    turns = trace["turns"]
    assert len(turns) >= min_turns, f"{run.agent}: only {len(turns)} call(s) captured\n{run.tail()}"
    assert len(turns) == len(served) == stats["calls"], (len(turns), len(served), stats)
    by_key: dict[tuple[tuple[int, ...], tuple[int, ...]], list[ServedCall]] = {}
    for call in served:
        by_key.setdefault((tuple(call.prompt_ids), tuple(call.completion_ids)), []).append(call)
    trace_keys = Counter((tuple(t["prompt_token_ids"]), tuple(t["completion_token_ids"])) for t in turns)
    assert trace_keys == Counter({k: len(v) for k, v in by_key.items()}), "trace turns != engine responses"
    for turn in turns:
        call = by_key[(tuple(turn["prompt_token_ids"]), tuple(turn["completion_token_ids"]))][0]
        assert call.logprobs is not None
        assert turn["per_token_logps"] == call.logprobs
        n = len(turn["prompt_token_ids"])
        assert turn["loss_mask"] == [0] * n + [1] * len(turn["completion_token_ids"])
        assert turn["request"]["messages"] == call.request["messages"]


def _assert_fake_session(stack: AgentStack, turns: list[dict[str, Any]], run: AgentRun) -> None:
    """The fake engine's script: ``tool_turns`` shell calls ran in the workdir, and the turns form one path."""
    fake = stack.engine.fake
    assert fake is not None
    steps = run.workdir / STEPS_FILE
    assert steps.exists(), f"{run.agent} did not run the engine's tool calls\n{run.tail()}"
    expected = [f"step-{i}" for i in range(1, fake.tool_turns + 1)]
    assert steps.read_text().split() == expected, run.tail()
    agent_turns = [t for t in turns if t["metadata"]["role"] == "agent"]
    assert len(agent_turns) == fake.tool_turns + 1 or run.agent == "mini-swe-agent", (
        [t["metadata"] for t in turns],
        run.tail(),
    )
    linked = [t for t in agent_turns if t["metadata"]["parent_id"] is not None]
    assert len(linked) >= fake.tool_turns, f"agent turns were not linked by exact prefix: {len(linked)} linked"


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.skipif(agent_binary("mini-swe-agent") is None, reason="mini-swe-agent is not installed")
def test_mini_swe_agent_ends_at_a_refusal(agent_stack: AgentStack, tmp_path: Path) -> None:
    """A key the proxy refuses (401) ends mini's run at its first call: its model retries only what a retry can
    change (mini waits 4 to 60 s between up to 10 tries)."""
    run = run_agent(
        "mini-swe-agent",
        TempDirSandbox(prefix="mini-refused-", dir=tmp_path),
        base_url=agent_stack.url,
        api_key="not-a-session-key",
        model=AGENT_MODEL,
        task=TASK,
        timeout_s=RUN_TIMEOUT_S,
    )
    assert not run.timed_out and run.elapsed_s < 30, run.tail()
    assert "HTTP 401" in run.tail(), run.tail()
