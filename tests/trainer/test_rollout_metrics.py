"""Step metrics with the meanings TRL documents for the harness trainer (REFERENCE §3.5)."""

from __future__ import annotations

import math

import pytest

from harness_grpo.outcomes import HarnessRolloutOutcome
from harness_grpo.rollout_metrics import outcome_metrics
from harness_grpo.tool_loop import Episode


def _o(reward: float | None = 1.0, calls: int = 0, failures: int = 0, **kw: object) -> HarnessRolloutOutcome:
    by_name = {"bash": calls} if calls else {}
    return HarnessRolloutOutcome(
        reward, [], [{}], tool_call_count=calls, tool_failure_count=failures, tool_calls_by_name=by_name, **kw
    )


def test_tool_frequencies_count_only_groups_where_a_rollout_called_a_tool() -> None:
    quiet = [_o(calls=0), _o(calls=0)]
    busy = [_o(calls=4, failures=1), _o(calls=0)]
    metrics = outcome_metrics([quiet, busy], [1.0] * 4, shaped=False)
    assert metrics["tools/call_frequency"] == 2.0  # (4 + 0) / 2: the quiet group is left out, not averaged in
    assert metrics["tools/failure_frequency"] == 0.25  # mean of per-rollout ratios over rollouts that called
    assert metrics["tools/bash_call_total"] == 4.0
    none_called = outcome_metrics([quiet], [1.0, 1.0], shaped=False)
    assert "tools/call_frequency" not in none_called and "tools/failure_frequency" not in none_called


def test_failure_frequency_is_a_mean_of_ratios() -> None:
    metrics = outcome_metrics([[_o(calls=1, failures=1), _o(calls=9, failures=0)]], [1.0, 1.0], shaped=False)
    assert metrics["tools/failure_frequency"] == 0.5  # not 1 / 10


def test_correctness_is_logged_only_when_a_reward_function_shapes_the_reward() -> None:
    group = [_o(reward=1.0), _o(reward=0.0), _o(reward=None, error="create failed")]
    assert "rollout/correctness_mean" not in outcome_metrics([group], [1.0, 0.0, None], shaped=False)
    shaped = outcome_metrics([group], [1.2, 0.0, None], shaped=True)
    assert shaped["rollout/correctness_mean"] == 0.5  # the verifier's, over rollouts that have one
    assert shaped["rewards/harness_reward/mean"] == pytest.approx(0.6)  # what the advantages used


def test_timeouts_and_latency() -> None:
    group = [_o(timed_out=True), _o(tool_latency_s=[("read", 0.5), ("read", 1.5), ("submit", 0.25)]), _o()]
    metrics = outcome_metrics([group], [1.0] * 3, shaped=False)
    assert metrics["rollout/timed_out_frac"] == pytest.approx(1 / 3)
    assert metrics["tools/latency_s"] == pytest.approx(0.75)
    assert metrics["tools/read_latency_s"] == 1.0 and metrics["tools/submit_latency_s"] == 0.25
    assert "tools/loop_exhausted_frac" not in metrics  # the built-in tool loop's, not the harness trainer's
    loop_owning = outcome_metrics([[_o()]], [1.0], shaped=False)
    assert not [k for k in loop_owning if "latency" in k]  # loop-owning traces carry no timestamps


def test_an_all_unscorable_step_has_nan_reward_means() -> None:
    metrics = outcome_metrics([[_o(reward=None, error="x")]], [None], shaped=False)
    assert math.isnan(metrics["rewards/harness_reward/mean"]) and metrics["rollout/errors"] == 1.0


def _episode(parallel: list[int], unknown: int, stop: str) -> Episode:
    episode = Episode(None, None, [{"role": "user", "content": "play"}])
    episode.parallel_calls, episode.unknown_names, episode.stop_reason = parallel, unknown, stop
    return episode


def test_the_tool_loop_metrics_of_a_step() -> None:
    group = [
        _o(calls=3, episode=_episode([2, 1], unknown=1, stop="no_tool_call")),
        _o(calls=4, episode=_episode([1, 1, 1, 1], unknown=0, stop="max_tool_calling_iterations")),
        _o(calls=0, episode=_episode([], unknown=0, stop="max_completion_length")),
        _o(calls=1, timed_out=True, episode=_episode([1], unknown=2, stop="timeout")),
    ]
    metrics = outcome_metrics([group], [1.0] * 4, shaped=False)
    assert metrics["tools/unknown_name_count"] == 3.0  # summed over the step
    assert metrics["tools/parallel_calls_mean"] == pytest.approx(8 / 7)  # per assistant turn that called
    assert metrics["tools/loop_exhausted_frac"] == 0.75  # every stop but the model's own
