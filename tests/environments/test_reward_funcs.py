"""Reward functions as TRL calls them: arguments, None per function, weights, get_reward, per-function metrics.

The rollouts here are outcomes built by hand (what ``run_rollout`` returns), so each rule is checked
on known values; the trainer runs the same code on real rollouts in ``test_environment_training.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from harness_grpo.advantages import group_advantages
from harness_grpo.environments import Environments
from harness_grpo.outcomes import HarnessRolloutOutcome
from harness_grpo.reward_funcs import RewardFunctions
from harness_grpo.rollout_metrics import outcome_metrics
from harness_grpo.rollouts import RolloutGroup
from harness_grpo.tool_loop import Episode
from proxy.trace import TrainingTrace

EMPTY_TRACE = TrainingTrace.from_json('{"schema_version": 1, "turns": []}')


class Maze:
    def reset(self, **kwargs: Any) -> None:
        self.solved = False

    def go(self, direction: str) -> str:
        """Move.

        Args:
            direction: Where to.
        """
        self.solved = direction == "out"
        return "ok"

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0


class Quiz:
    def reset(self, **kwargs: Any) -> None:
        return None

    def answer(self, text: str) -> str:
        """Answer.

        Args:
            text: The answer.
        """
        return text


def _outcome(environment: Any, answer: str, *, error: str | None = None) -> HarnessRolloutOutcome:
    episode = Episode(environment, None, [{"role": "user", "content": "q"}])
    episode.completion = [{"role": "assistant", "content": answer}]
    return HarnessRolloutOutcome(
        None, [], [], training_trace=None if error else EMPTY_TRACE, error=error, episode=None if error else episode
    )


def _group(row: dict[str, Any], outcomes: list[HarnessRolloutOutcome]) -> RolloutGroup:
    return RolloutGroup("g", 0, row, 0, 0.0, outcomes=outcomes)


def test_reward_functions_get_prompts_completions_environments_and_the_rows_columns() -> None:
    seen: dict[str, Any] = {}

    def reward_func(prompts: list, completions: list, environments: list, **kwargs: Any) -> list[float]:
        seen.update(prompts=prompts, completions=completions, environments=environments, **kwargs)
        kwargs["log_metric"]("answers/long", 2.0)
        return [float(len(c[-1]["content"])) for c in completions]

    quizzes = [Quiz(), Quiz()]
    rewards = RewardFunctions(reward_func, environments=Environments(Quiz))
    groups = [
        _group({"prompt": "q", "answer_key": "b", "level": 3}, [_outcome(quizzes[0], "ab"), _outcome(quizzes[1], "b")])
    ]
    scores, columns, logged, _ = rewards.score(groups, trainer_state="state")
    assert scores == [[2.0, 1.0]] and columns == {"reward_func": [2.0, 1.0]}
    assert seen["prompts"] == [[{"role": "user", "content": "q"}]] * 2
    assert seen["completions"] == [[{"role": "assistant", "content": "ab"}], [{"role": "assistant", "content": "b"}]]
    assert seen["environments"] == quizzes and seen["answer_key"] == ["b", "b"] and seen["level"] == [3, 3]
    assert seen["trainer_state"] == "state" and seen["completion_ids"] == [[], []]
    assert "prompt" not in seen and logged == {"answers/long": 2.0}


def test_none_is_excluded_per_function_and_weights_multiply_what_is_left() -> None:
    def correct(completions: list, **kwargs: Any) -> list[float | None]:
        return [1.0 if c[-1]["content"] == "right" else 0.0 for c in completions]

    def length(completions: list, **kwargs: Any) -> list[float | None]:
        return [
            None if c[-1]["content"] == "right" else float("nan") if c[-1]["content"] == "?" else 0.5
            for c in completions
        ]

    rewards = RewardFunctions([correct, length], [2.0, -1.0], environments=Environments(Quiz))
    outcomes = [_outcome(Quiz(), "right"), _outcome(Quiz(), "wrong"), _outcome(Quiz(), "?")]
    (scores,), columns, _, _ = rewards.score([_group({"prompt": "q"}, outcomes)])
    assert columns == {"correct": [1.0, 0.0, 0.0], "length": [None, 0.5, None]}  # NaN reads as None
    assert scores == [2.0, -0.5, 0.0]  # 2*1 (length skipped); 2*0 - 1*0.5; 2*0 (length skipped)
    metrics = outcome_metrics([outcomes], scores, shaped=False, reward_columns=columns)
    assert metrics["rewards/correct/mean"] == pytest.approx(1 / 3)
    assert metrics["rewards/length/mean"] == 0.5 and metrics["rewards/length/std"] == 0.0  # over its one value
    assert "rewards/harness_reward/mean" not in metrics


def test_a_rollout_with_no_usable_reward_is_unscorable_and_a_failed_one_reaches_no_function() -> None:
    calls: list[int] = []

    def only_first(completions: list, **kwargs: Any) -> list[float | None]:
        calls.append(len(completions))
        return [1.0] + [None] * (len(completions) - 1)

    rewards = RewardFunctions(only_first, environments=Environments(Quiz))
    outcomes = [_outcome(Quiz(), "a"), _outcome(Quiz(), "b"), _outcome(Quiz(), "c", error="create failed")]
    (scores,), columns, _, _ = rewards.score([_group({"prompt": "q"}, outcomes)])
    assert calls == [2] and scores == [1.0, None, None] and columns["only_first"] == [1.0, None, None]
    advantages, stats = group_advantages(scores)
    assert advantages == [0.0, 0.0, 0.0] and stats.n_scored == 1  # excluded from the baseline, not zero


def test_get_reward_is_a_column_named_after_its_class_and_none_on_other_environments() -> None:
    def quiz_reward(environments: list, **kwargs: Any) -> list[float | None]:
        return [0.25 if isinstance(e, Quiz) else None for e in environments]

    environments = Environments({"maze": Maze, "quiz": Quiz})
    rewards = RewardFunctions(quiz_reward, environments=environments)
    assert rewards.names == ["quiz_reward", "Maze"] and rewards.weights == [1.0, 1.0]
    solved, lost = Maze(), Maze()
    solved.solved, lost.solved = True, False
    groups = [
        _group({"prompt": "q", "environment": "maze"}, [_outcome(solved, ""), _outcome(lost, "")]),
        _group({"prompt": "q", "environment": "quiz"}, [_outcome(Quiz(), "")]),
    ]
    scores, columns, _, _ = rewards.score(groups)
    assert columns == {"quiz_reward": [None, None, 0.25], "Maze": [1.0, 0.0, None]}
    assert scores == [[1.0, 0.0], [0.25]]


def test_async_reward_functions_are_awaited() -> None:
    async def judge(completions: list, **kwargs: Any) -> list[float]:
        return [0.5 for _ in completions]

    (scores,), _, _, _ = RewardFunctions(judge, environments=Environments(Quiz)).score(
        [_group({"prompt": "q"}, [_outcome(Quiz(), "a")])]
    )
    assert scores == [0.5]


def test_with_a_session_factory_reward_functions_add_to_the_verifiers_reward() -> None:
    def bonus(completions: list, **kwargs: Any) -> list[float]:
        return [0.1] * len(completions)

    verified = HarnessRolloutOutcome(1.0, [{"role": "user", "content": "q"}], [], training_trace=EMPTY_TRACE)
    unverified = HarnessRolloutOutcome(None, [], [], training_trace=EMPTY_TRACE)
    rewards = RewardFunctions([bonus])
    assert rewards.names == ["bonus", "harness_reward"] and rewards.shaped
    (scores,), columns, _, _ = rewards.score([_group({"prompt": "q"}, [verified, unverified])])
    assert columns == {"bonus": [0.1, 0.1], "harness_reward": [1.0, None]}
    assert scores == [pytest.approx(1.1), pytest.approx(0.1)]
    plain = RewardFunctions()  # no reward functions: the verifier's reward alone, as before
    assert plain.names == ["harness_reward"] and not plain.shaped
    assert plain.score([_group({"prompt": "q"}, [verified, unverified])])[0] == [[1.0, None]]
    shaped = RewardFunctions(rollout_reward_fn=lambda o: math.nan if o.env_reward is None else 2 * o.env_reward)
    assert shaped.shaped and shaped.score([_group({"prompt": "q"}, [verified, unverified])])[0] == [[2.0, None]]


def test_what_trl_accepts_and_this_trainer_does_not_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"reward_funcs\[0\] is 'org/reward-model'.*not reward models"):
        RewardFunctions("org/reward-model", environments=Environments(Quiz))
    with pytest.raises(ValueError, match=r"Number of reward weights \(1\) must match number of reward functions \(2\)"):
        RewardFunctions([len, len], [1.0], environments=Environments(Quiz))
    with pytest.raises(ValueError, match="No reward source provided"):
        RewardFunctions(environments=Environments(Quiz))

    def short(completions: list, **kwargs: Any) -> list[float]:
        return [1.0]

    with pytest.raises(ValueError, match="'short' returned 1 rewards, but 2 were expected"):
        RewardFunctions(short, environments=Environments(Quiz)).score(
            [_group({"prompt": "q"}, [_outcome(Quiz(), "a"), _outcome(Quiz(), "b")])]
        )


def test_per_turn_rewards_sum_into_the_column_and_weigh_into_each_calls_credit() -> None:
    def moves(completions: list, **kwargs: Any) -> list[Any]:
        return [[1.0, None, 0.0], 0.5, [None, None, None]]  # per turn, a plain value, per turn with nothing scored

    def judge(completions: list, **kwargs: Any) -> list[Any]:
        return [[2.0, 2.0, None], [1.0], None]

    outcomes = [_outcome(Quiz(), "a"), _outcome(Quiz(), "b"), _outcome(Quiz(), "c")]
    for outcome, calls in zip(outcomes, (3, 1, 3), strict=True):
        entry = {"prompt_token_ids": [1], "completion_token_ids": [2]}
        outcome.trace = [entry] * calls  # one capture entry per model call
    rewards = RewardFunctions([moves, judge], [0.5, 1.0], environments=Environments(Quiz))
    (scores,), columns, _, (turns,) = rewards.score([_group({"prompt": "q"}, outcomes)])
    assert columns["moves"] == [1.0, 0.5, None] and columns["judge"] == [4.0, 1.0, None]
    assert scores == [4.5, 1.25, None]  # weighted nansum of the columns, as for plain values
    assert turns == [[2.5, 2.0, 0.0], [1.0], [None, None, None]]  # 0.5 * moves + judge, turn by turn; None: unscored

    def too_short(completions: list, **kwargs: Any) -> list[Any]:
        return [[1.0], 1.0, 1.0]

    with pytest.raises(ValueError, match="'too_short' returned 1 per-turn rewards for a rollout of 3 model calls"):
        RewardFunctions(too_short, environments=Environments(Quiz)).score([_group({"prompt": "q"}, outcomes)])
