"""The built-in tool loop through the real trainer, capture proxy and embedded engine (the warm tiny model).

The quickstart as users write it (``EchoToolEnv``, ``reward_func(environments, **kwargs)``,
``environment_factory=EchoToolEnv``) trains two steps end to end: every rollout is captured exactly,
scored by the reward function, and becomes rows. Then rollouts run one by one through the trainer's
services, where the engine's own token ids can be checked: a dict of factories shows each row only
its environment's tools; ``reset``'s observation reaches the model; ``chat_template_kwargs`` reach
the template; and no conversation outgrows ``max_completion_length``, model and tool tokens counted.
The tiny model's tool calls are unreliable (it calls names it learned, not always ours), so what is
asserted holds whatever it samples; the loop's logic on known replies is ``test_tool_loop.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.rollouts import run_rollout
from harness_grpo.tiny_model.warm_start import warm_tiny_model_path
from harness_grpo.trainer import HarnessAsyncGRPOTrainer
from proxy.capture_graph import sequences_from_trace
from proxy.trace import TrainingTrace

SYSTEM = "You are a helpful assistant with access to tools."  # the warm start's generic tool chats


class EchoToolEnv:
    """The quickstart environment: one tool, and the reward read from the instance after the episode."""

    def reset(self, **kwargs: Any) -> str | None:
        self.reward = 0.0
        return None

    def echo(self, message: str) -> str:
        """Echo the message back.

        Args:
            message: The message to echo.

        Returns:
            The message.
        """
        self.reward = 1.0 if message.strip() else 0.0
        return message


def reward_func(environments: list[EchoToolEnv], **kwargs: Any) -> list[float]:
    return [environment.reward for environment in environments]


def half(completions: list[Any], **kwargs: Any) -> list[float]:
    return [0.5] * len(completions)


def _args(tmp_path: Path, **overrides: Any) -> HarnessGRPOConfig:
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "seed": 0,
        "max_steps": 2,
        "learning_rate": 1e-4,
        "num_generations": 2,
        "groups_per_step": 1,
        "max_completion_length": 96,
        "max_tool_calling_iterations": 2,
        "rollout_timeout_s": 120,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        **overrides,
    }
    return HarnessGRPOConfig(**settings)


def _prompt(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


@pytest.mark.timeout(600)
def test_the_echo_quickstart_trains_end_to_end(tmp_path: Path) -> None:
    dataset = [{"prompt": _prompt(f"Echo '{word}'.")} for word in ("hello", "banana", "ready", "ping")]
    trainer = HarnessAsyncGRPOTrainer(
        "tiny-warm",
        args=_args(tmp_path, save_rollouts=True, reward_weights=[2.0, -1.0]),
        train_dataset=dataset,
        reward_funcs=[reward_func, half],
        environment_factory=EchoToolEnv,
    )
    trainer.train()
    log = trainer.state.log_history
    assert len(log) == 2
    for entry in log:
        assert entry["rollout/errors"] == 0 and entry["rollout/unscorable_frac"] == 0  # reward_func scored each
        assert 0.0 <= entry["rewards/reward_func/mean"] <= 1.0 and "rewards/harness_reward/mean" not in entry
        assert entry["rewards/half/mean"] == 0.5
        assert entry["reward"] == pytest.approx(2.0 * entry["rewards/reward_func/mean"] - 0.5)  # reward_weights
        assert entry["frac_reward_zero_std"] in (0.0, 1.0)
        assert entry["rows/per_rollout"] >= 1 and entry["rows/dropped_too_long"] == 0
        for name in ("tools/unknown_name_count", "tools/parallel_calls_mean", "tools/loop_exhausted_frac"):
            assert name in entry
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4
    for rollout in rollouts:
        trace = TrainingTrace.from_json(json.dumps(rollout["trace"]))  # valid OpenEnv schema-v1 JSON
        assert trace.turns and rollout["reward"] in (-0.5, 1.5)  # 2 * (0 or 1) - 0.5
        first = trace.turns[0].request
        assert first["messages"][-1]["content"].startswith("Echo '")
        assert [tool["function"]["name"] for tool in first["tools"]] == ["echo"]
        assert sequences_from_trace(trace)  # the rows' source: one sequence at least, along the proxy's links
        for turn in trace.turns[1:]:  # later turns send the earlier replies and tool results back
            assert any(m["role"] == "tool" for m in turn.request["messages"])


class Calculator:
    def reset(self, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return " Use the calculator."

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. 2 * (3 + 4)
        """
        a, op, b = expression.split()
        return str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])


class Library:
    def reset(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def read_file(self, path: str) -> str:
        """Read a text file.

        Args:
            path: Path to the file
        """
        return "# Notes\n" + "remember the milk\n" * 40  # long: its tokens count against the budget

    def search(self, query: str) -> str:
        """Search the web and return the top results.

        Args:
            query: The search query
        """
        return f"1. {query} - overview\n2. {query} tutorial"


@pytest.mark.timeout(600)
def test_routing_observations_template_kwargs_and_the_budget_on_the_engines_own_ids(tmp_path: Path) -> None:
    rows = [
        {"prompt": _prompt("Compute 12 * 7."), "environment": "math"},
        {"prompt": _prompt("Show me notes.txt."), "environment": "files"},
        {"prompt": _prompt("Search for pytest fixtures."), "environment": "files"},
    ]
    budget = 48
    trainer = HarnessAsyncGRPOTrainer(
        str(warm_tiny_model_path()),
        args=_args(
            tmp_path,
            max_completion_length=budget,
            max_tool_calling_iterations=3,
            chat_template_kwargs={"enable_thinking": False},
        ),
        train_dataset=rows,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        environment_factory={"math": Calculator, "files": Library},
    )
    think_off = trainer.tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    trainer._start_services()
    try:
        stops, calls = [], 0
        for seed in range(64):  # until both were seen (16 at least): ~15% of rollouts call a tool
            row = rows[seed % len(rows)]
            outcome = run_rollout(trainer.session_factory, row, seed=seed, timeout_s=120)
            assert outcome.error is None and outcome.training_trace is not None, outcome.error
            episode, turns = outcome.episode, outcome.training_trace.turns
            assert type(episode.environment).__name__ == {"math": "Calculator", "files": "Library"}[row["environment"]]
            assert (
                episode.environment.kwargs["prompt"] == row["prompt"]
                and "environment" not in episode.environment.kwargs
            )
            offered = {"math": ["calculator"], "files": ["read_file", "search"]}[row["environment"]]
            first = turns[0]
            assert [t["function"]["name"] for t in first.request["tools"]] == offered  # only its environment's
            assert first.metadata["chat_template_kwargs"] == {"enable_thinking": False}
            assert first.prompt_token_ids[-len(think_off) :] == think_off  # the template saw enable_thinking
            expected_user = row["prompt"][-1]["content"] + (
                " Use the calculator." if row["environment"] == "math" else ""
            )
            assert first.request["messages"][-1]["content"] == expected_user  # reset's observation appended
            start = len(first.prompt_token_ids)
            for turn in turns:  # the conversation after the prompt, model and tool tokens, never past the budget
                assert len(turn.prompt_token_ids) - start + len(turn.completion_token_ids) <= budget
                assert turn.metadata["sampling_params"]["max_tokens"] == budget - (
                    len(turn.prompt_token_ids) - start
                )  # exactly what's left
            assert episode.completion_tokens == len(turns[-1].prompt_token_ids) - start + len(
                turns[-1].completion_token_ids
            )
            stops.append(episode.stop_reason)
            calls += episode.tool_calls
            if seed >= 15 and calls and "max_completion_length" in stops:
                break
        assert calls > 0, "the model never called a tool: the loop was not exercised"
        assert "max_completion_length" in stops, stops  # read_file's result does not fit in what is left
    finally:
        trainer._stop_services()


class RowsSeen(HarnessAsyncGRPOTrainer):
    """The trainer, keeping the rows of each optimizer step."""

    def _optimize(self, rows: list[Any]) -> dict[str, float]:
        self.rows_seen = [*getattr(self, "rows_seen", []), *rows]
        return super()._optimize(rows)


def reply_length(completions: list[Any], **kwargs: Any) -> list[list[float]]:
    """Per turn: the length of the model's reply (its text and its calls), so calls differ within and across games."""
    return [[float(len(json.dumps(m))) for m in c if m["role"] == "assistant"] for c in completions]


@pytest.mark.timeout(600)
def test_per_turn_rewards_give_each_model_calls_tokens_their_own_advantage(tmp_path: Path) -> None:
    dataset = [{"prompt": _prompt(f"Echo '{word}' twice, one call at a time.")} for word in ("hello", "banana")]
    trainer = RowsSeen(
        "tiny-warm",
        args=_args(tmp_path, max_steps=1, num_generations=4, scale_rewards=False),
        train_dataset=dataset,
        reward_funcs=[reply_length],
        environment_factory=EchoToolEnv,
    )
    trainer.train()
    assert trainer.rows_seen
    extras = []
    for row in trainer.rows_seen:
        trained = {t for t, m in enumerate(row.loss_mask) if m}
        covered = {t for start, end, _ in row.turn_advantages for t in range(start, end)}
        assert trained and covered <= set(range(len(row)))
        for start, end, extra in row.turn_advantages:  # a span is one call's completion: trained tokens only
            assert any(t in trained for t in range(start, end))
            extras.append(extra)
    # unscaled: r_t - mean over the group's calls, so the extras of a group sum to 0 and both signs occur
    assert extras and min(extras) < 0 < max(extras)
