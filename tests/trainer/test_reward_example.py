"""``examples/rewards.py``: correctness first, an efficiency bonus only when solved, None when unscored."""

from __future__ import annotations

import pytest

from examples.rewards import EFFICIENCY_BONUS, TOOL_CALL_BUDGET, correctness_with_efficiency
from harness_grpo.outcomes import HarnessRolloutOutcome


def _outcome(env_reward: float | None, calls: int) -> HarnessRolloutOutcome:
    return HarnessRolloutOutcome(env_reward, [], [], tool_call_count=calls)


def test_the_bonus_is_paid_only_when_solved_and_shrinks_with_tool_calls() -> None:
    assert correctness_with_efficiency(_outcome(1.0, 0)) == pytest.approx(1.0 + EFFICIENCY_BONUS)
    assert correctness_with_efficiency(_outcome(1.0, 5)) == pytest.approx(1.0 + EFFICIENCY_BONUS * 2 / 3)
    assert correctness_with_efficiency(_outcome(1.0, TOOL_CALL_BUDGET + 10)) == 1.0
    # Unsolved: doing nothing is not "efficient".
    assert correctness_with_efficiency(_outcome(0.0, 0)) == 0.0
    assert correctness_with_efficiency(_outcome(0.5, 1)) == 0.5


def test_a_verifier_that_did_not_run_gives_none() -> None:
    assert correctness_with_efficiency(_outcome(None, 3)) is None


def test_correctness_dominates_any_bonus() -> None:
    solved_slowly = correctness_with_efficiency(_outcome(1.0, 100))
    almost = correctness_with_efficiency(_outcome(0.99, 0))
    assert solved_slowly > almost
