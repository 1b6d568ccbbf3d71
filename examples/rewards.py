"""A ``rollout_reward_fn``: the verifier's correctness first, a small tool-efficiency bonus only when solved.

    reward = correctness + bonus * clip(1 - tool_calls / budget, 0, 1)   when correctness >= 1
           = correctness                                                  otherwise
           = None                                                         when the verifier did not run

The bonus is gated on success: ungated, a rollout that does nothing would look efficient. None (the
verifier could not score, e.g. the sandbox died) makes the rollout unscorable: it is left out of its
group's baseline instead of being taught as a failure. This is the shaping of TRL's Harbor example;
pass it as ``HarnessAsyncGRPOTrainer(..., rollout_reward_fn=correctness_with_efficiency)``.
"""

from __future__ import annotations

from harness_grpo.outcomes import HarnessRolloutOutcome

EFFICIENCY_BONUS = 0.3
TOOL_CALL_BUDGET = 15


def correctness_with_efficiency(outcome: HarnessRolloutOutcome) -> float | None:
    """The verifier's reward, plus up to ``EFFICIENCY_BONUS`` for solving with few tool calls."""
    if outcome.env_reward is None:
        return None
    correctness = float(outcome.env_reward)
    if correctness < 1.0:
        return correctness
    spare = min(max(1.0 - outcome.tool_call_count / TOOL_CALL_BUDGET, 0.0), 1.0)
    return correctness + EFFICIENCY_BONUS * spare
