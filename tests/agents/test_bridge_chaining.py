"""The token-in bridge with the real agent CLIs: with it every continuation chains onto its parent.

Each CLI runs the shell task on the warm tiny model's stack (``warm_tiny_stack``, configured for a small
model as ``test_agent_session_on_the_warm_tiny_model`` is) once with the bridge off and once with it on. A
continuation (a turn whose history holds an assistant message) must chain onto a parent with the bridge,
unless the bridge says the agent's history is not what was sampled for a reason that is genuine (the parent
ended on a length cut). Without it, claude-code and opencode, which re-serialise the tool calls they were
sent, fork: the test fails without the bridge. The first call and auxiliary calls that start their own
history (opencode's title request) are roots either way. ``bench/bridge_chaining.py`` prints the same
shares over more sessions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.bridge_chaining import MAX_OUTPUT_TOKENS, SAMPLING, TASK, Chaining
from harness_grpo.agents import SMALL_MODEL_PROMPT, run_agent
from harness_grpo.sandbox import TempDirSandbox
from proxy.bridge import UNFINISHED, _semantic
from tests.agents.conftest import AgentStack
from tests.agents.test_agent_clis import INSTALLED_AGENTS

pytestmark = pytest.mark.agents
MAX_CALLS = 5  # below claude-code's own turn limit (6), so the proxy's budget reply ends every agent's run
ATTEMPTS = 12  # sessions per setting until one has a continuation: the tiny model answers codex in text at its
# first call in about 6 sessions of 10, so 3 attempts failed about one run in three; 12 fail one in 200 (a failed
# attempt is one short call)
RE_SERIALISING = ("claude-code", "opencode")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("agent", INSTALLED_AGENTS)
def test_every_continuation_of_a_real_cli_chains_with_the_bridge(
    agent: str, warm_tiny_stack: AgentStack, tmp_path: Path
) -> None:
    counts: dict[bool, Chaining] = {}
    for bridge in (False, True):
        counts[bridge] = Chaining()
        for attempt in range(ATTEMPTS):
            trace = _session(agent, warm_tiny_stack, tmp_path / f"{bridge}-{attempt}", bridge)
            counts[bridge].add(trace)
            if bridge:
                forks = [t for t in trace["turns"] if _forked(t) and t["metadata"].get("bridge_fallback") != UNFINISHED]
                assert not forks, f"{agent}: {_first_difference(trace, forks[0])}"
            if counts[bridge].continuations:
                break
    off, on = counts[False], counts[True]
    print(f"{agent}: turns chained onto a parent, bridge off {off.share()}, bridge on {on.share()}")
    assert on.continuations and off.continuations, f"{agent}: no session went past its first call"
    if agent in RE_SERIALISING:
        assert off.forks, f"{agent} chained without the bridge: it no longer re-serialises what it was sent"


def _session(agent: str, stack: AgentStack, workdir: Path, bridge: bool) -> dict[str, Any]:
    session, _ = stack.create_session(
        max_model_calls=MAX_CALLS, max_output_tokens=MAX_OUTPUT_TOKENS, sampling=SAMPLING, bridge=bridge
    )
    workdir.mkdir(parents=True)
    run = run_agent(
        agent,
        TempDirSandbox(prefix=f"{agent}-", dir=workdir),
        base_url=stack.url,
        api_key=session.api_key,
        model="harness-model",
        task=TASK,
        timeout_s=120,
        system_prompt=SMALL_MODEL_PROMPT,
    )
    assert not run.timed_out, run.tail()
    return stack.trace(session.session_id)


def _forked(turn: dict[str, Any]) -> bool:
    history = turn["request"]["messages"]
    return turn["metadata"]["parent_id"] is None and any(m.get("role") == "assistant" for m in history)


def _first_difference(trace: dict[str, Any], fork: dict[str, Any]) -> str:
    """Where ``fork``'s history first differs, in the bridge's semantic form, from the earlier sampled turn
    (its request + response) it agrees with longest."""
    history = [_semantic(m) for m in fork["request"]["messages"]]
    reason = fork["metadata"].get("bridge_fallback")
    best = (-1, b"", b"")
    for turn in trace["turns"][: trace["turns"].index(fork)]:
        sampled = [_semantic(m) for m in turn["request"]["messages"]]
        sampled.append(_semantic(turn["response"]["choices"][0]["message"]))
        same = next((i for i, (a, b) in enumerate(zip(history, sampled, strict=False)) if a != b), len(sampled))
        if same == len(sampled):
            return f"forked ({reason}), though its history extends a sampled turn"
        if same > best[0]:
            best = (same, history[same] if same < len(history) else b"(none)", sampled[same])
    return f"forked ({reason}); message {best[0]} is\n  sent:    {best[1]!r}\n  sampled: {best[2]!r}"
