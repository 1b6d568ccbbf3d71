"""The format SFT of the recipes' tiny model: random episodes through the tool loop's own environment path, and
a model cached by what it was trained on.

Episodes are played against a real Catch server: every tool message is the game's own answer, every call one
of the moves offered, and an episode ends when the game does (or at ``max_turns``), then the assistant closes
without a call. The trained model is cached by a digest of the tokenized chats: the same chats give the same
checkpoint without training again, other chats another one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness_grpo.envs.catch.tools import CatchToolEnv
from harness_grpo.envs.serving import LocalEnvServer
from harness_grpo.tiny_model.tool_sft import CLOSING, random_episodes, tool_format_model
from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

ROWS = [{"prompt": [{"role": "user", "content": "Catch the ball.\n"}], "seed": seed} for seed in range(4)]
MOVES = {"move": lambda rng: {"direction": rng.choice(["left", "right"])}, "stay": lambda rng: {}}


@pytest.fixture(scope="module")
def catch_url() -> str:
    with LocalEnvServer("catch") as server:
        yield server.url


def _factory(url: str):
    return lambda: CatchToolEnv(base_url=url)


def test_random_episodes_play_whole_games_through_the_tools(catch_url: str) -> None:
    chats = random_episodes(_factory(catch_url), ROWS, MOVES, episodes=6, max_turns=12, seed=3)
    assert len(chats) == 6
    for chat in chats:
        messages = chat["messages"]
        assert [tool["function"]["name"] for tool in chat["tools"]] == ["move", "stay"]
        assert messages[0]["content"].startswith("Catch the ball.\nBall: row 1/10")  # reset's board appended
        calls = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
        results = [m for m in messages if m["role"] == "tool"]
        assert len(calls) == len(results) == 9  # the ball falls nine rows: the game ends before max_turns
        assert results[-1]["content"].endswith(("Caught it! The game is over.", "Missed it. The game is over."))
        assert all("Ball: row" in m["content"] for m in results)  # every move was valid
        assert messages[-1] == {"role": "assistant", "content": CLOSING}
    assert random_episodes(_factory(catch_url), ROWS, MOVES, episodes=6, max_turns=12, seed=3) == chats
    short = random_episodes(_factory(catch_url), ROWS, MOVES, episodes=1, max_turns=2, seed=3)
    assert sum(m["role"] == "tool" for m in short[0]["messages"]) == 2


def test_a_policy_chooses_each_call_from_the_conversation_so_far(catch_url: str) -> None:
    seen: list[str] = []

    def stay_and_look(messages, rng):
        seen.append(messages[-1]["content"])
        return {"name": "stay", "arguments": {}}

    [chat] = random_episodes(_factory(catch_url), ROWS, MOVES, episodes=1, max_turns=12, policy=stay_and_look)
    calls = [m["tool_calls"][0]["function"] for m in chat["messages"] if m.get("tool_calls")]
    assert calls == [{"name": "stay", "arguments": {}}] * 9
    observations = [chat["messages"][0]["content"]] + [m["content"] for m in chat["messages"] if m["role"] == "tool"]
    assert seen == observations[:-1]  # each call saw the board the previous one left


def test_random_episodes_need_moves_for_the_tools(catch_url: str) -> None:
    with pytest.raises(ValueError, match="moves names none of the tools"):
        random_episodes(_factory(catch_url), ROWS, {"jump": lambda rng: {}}, episodes=1, max_turns=1)


def test_the_model_is_cached_by_the_chats_it_was_trained_on(
    catch_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = warm_tiny_model_path()  # built under the usual cache before it moves
    monkeypatch.setenv("HARNESS_GRPO_CACHE", str(tmp_path))
    recipe = {"seed": 0, "steps": 2, "batch": 2, "lr": 1e-3, "threads": 2}
    chats = random_episodes(_factory(catch_url), ROWS, MOVES, episodes=2, max_turns=3, seed=0)
    first = tool_format_model(base, chats, recipe)
    stats = json.loads((first / "tool_sft.json").read_text())
    assert stats["chats"] == 2 and stats["recipe"] == recipe
    (first / "tool_sft.json").write_text("{}")  # a retrain would write it again
    assert tool_format_model(base, chats, recipe) == first and (first / "tool_sft.json").read_text() == "{}"
    other = [{**chats[0], "messages": [*chats[0]["messages"][:-1], {"role": "assistant", "content": "Over."}]}]
    assert tool_format_model(base, other, recipe) != first
    assert tool_format_model(base, chats, {**recipe, "steps": 3}) != first
