"""Group advantages: None/NaN excluded from the baseline, degenerate groups, population std."""

from __future__ import annotations

import math

import pytest

from harness_grpo.advantages import combine_rewards, group_advantages, group_metrics, step_advantages


def test_scaled_advantages_use_population_std() -> None:
    adv, stats = group_advantages([1.0, 0.0, 1.0, 0.0])
    # mean 0.5, population std 0.5 (Bessel's sample std would be 0.577)
    assert stats.mean == 0.5 and stats.std == 0.5
    assert adv == pytest.approx([1.0, -1.0, 1.0, -1.0], rel=1e-7)
    assert not stats.zero_std and not stats.all_unscorable


def test_two_rollouts_population_not_sample_std() -> None:
    adv, stats = group_advantages([0.0, 1.0])
    assert stats.std == 0.5  # sample std: 0.7071
    assert adv == pytest.approx([-1.0, 1.0], rel=1e-7)


def test_unscorable_rollouts_are_excluded_and_get_zero() -> None:
    adv, stats = group_advantages([1.0, None, 0.0, math.nan])
    assert (stats.n, stats.n_scored, stats.n_unscorable) == (4, 2, 2)
    assert stats.mean == 0.5 and stats.std == 0.5
    assert adv[1] == 0.0 and adv[3] == 0.0
    assert adv[0] == pytest.approx(1.0) and adv[2] == pytest.approx(-1.0)


def test_none_is_not_zero() -> None:
    with_none, _ = group_advantages([1.0, 0.5, None])
    with_zero, _ = group_advantages([1.0, 0.5, 0.0])
    assert with_none[0] == pytest.approx(1.0) and with_none[1] == pytest.approx(-1.0)
    assert with_zero[0] != pytest.approx(with_none[0])


def test_all_unscorable_group() -> None:
    adv, stats = group_advantages([None, None, None])
    assert adv == [0.0, 0.0, 0.0]
    assert stats.all_unscorable and not stats.zero_std
    assert stats.n_scored == 0 and math.isnan(stats.mean) and math.isnan(stats.std)


def test_zero_variance_group_is_exactly_zero() -> None:
    adv, stats = group_advantages([0.1, 0.1, None, 0.1])
    assert adv == [0.0, 0.0, 0.0, 0.0]
    assert stats.zero_std and stats.std == 0.0 and stats.n_scored == 3


def test_single_scored_rollout_is_zero_std() -> None:
    adv, stats = group_advantages([None, 0.7])
    assert adv == [0.0, 0.0] and stats.zero_std


def test_unscaled_advantages() -> None:
    adv, _ = group_advantages([3.0, 1.0, None], scale=False)
    assert adv == [1.0, -1.0, 0.0]


def test_infinite_reward_is_rejected() -> None:
    with pytest.raises(ValueError, match="inf"):
        group_advantages([1.0, math.inf])


def test_combine_rewards_nansum() -> None:
    assert combine_rewards([1.0, None, 0.5]) == 1.5
    assert combine_rewards([None, math.nan]) is None
    assert combine_rewards([]) is None
    assert combine_rewards([1.0, 2.0, None], weights=[0.5, 2.0, 10.0]) == 4.5
    assert combine_rewards([0.0, None]) == 0.0
    with pytest.raises(ValueError):
        combine_rewards([1.0], weights=[1.0, 2.0])


def test_group_metrics() -> None:
    groups = [
        ([1.0, 0.0], group_advantages([1.0, 0.0])[1]),
        ([1.0, 1.0], group_advantages([1.0, 1.0])[1]),
        ([None, None], group_advantages([None, None])[1]),
    ]
    m = group_metrics(groups)
    assert m["reward"] == 0.75
    assert m["reward_std"] == 0.25
    assert m["frac_reward_zero_std"] == 0.5
    assert m["rollout/unscorable_frac"] == pytest.approx(2 / 6)
    assert m["rollout/unscorable_groups"] == 1.0


def test_batch_baseline_trains_a_group_whose_rollouts_all_failed() -> None:
    """'batch': one mean (and std) over the step; the failed group is pushed down, the stats stay per group."""
    steps = step_advantages([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]], baseline="batch", scale=False)
    (mixed, mixed_stats), (failed, failed_stats) = steps
    assert mixed == [0.75, -0.25, 0.75, -0.25]
    assert failed == [-0.25] * 4
    assert failed_stats.zero_std and not mixed_stats.zero_std
    grouped = step_advantages([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]], baseline="group", scale=False)
    assert [a for a, _ in grouped] == [[0.5, -0.5, 0.5, -0.5], [0.0] * 4]


def test_batch_baseline_scales_by_the_step_std_and_skips_unscorable() -> None:
    (first, _), (second, _) = step_advantages([[1.0, None], [0.0, math.nan]], baseline="batch")
    assert first == [pytest.approx(1.0), 0.0] and second == [pytest.approx(-1.0), 0.0]
    assert [a for a, _ in step_advantages([[0.5, 0.5], [0.5, None]], baseline="batch")] == [[0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="baseline must be one of"):
        step_advantages([[1.0, 0.0]], baseline="global")


def test_turn_advantages_credit_each_call_against_every_scored_call_of_its_group() -> None:
    from harness_grpo.advantages import step_turn_advantages

    # Group 0: rollout 0 made two good moves and one turn that moved nothing (None), rollout 1 one bad, one good;
    # rollout 2 has no per-turn values; rollout 3 is unscorable, so its turns count nowhere.
    turns = [[[1.0, None, 1.0], [0.0, 1.0], None, [0.0, 0.0]], [[0.5, 0.5]]]
    rewards = [[2.0, 1.0, 0.3, None], [1.0]]
    (g0, g1) = step_turn_advantages(turns, rewards)
    # pool of group 0: 1, 1, 0, 1 -> mean 0.75, population std sqrt(3)/4
    std = math.sqrt(3) / 4
    assert g0[0] == pytest.approx([0.25 / std, 0.0, 0.25 / std])
    assert g0[1] == pytest.approx([-0.75 / std, 0.25 / std])
    assert g0[2] is None and g0[3] is None
    assert g1 == [[0.0, 0.0]]  # every scored turn alike: no turn-level signal
    (u0, _) = step_turn_advantages(turns, rewards, scale=False)
    assert u0[1] == pytest.approx([-0.75, 0.25])


def test_batch_baseline_pools_the_turns_of_the_whole_step() -> None:
    from harness_grpo.advantages import step_turn_advantages

    (g0, g1) = step_turn_advantages([[[1.0]], [[0.0]]], [[1.0], [0.0]], baseline="batch", scale=False)
    assert (g0, g1) == ([[0.5]], [[-0.5]])
    per_group = step_turn_advantages([[[1.0]], [[0.0]]], [[1.0], [0.0]], scale=False)
    assert per_group == [[[0.0]], [[0.0]]]
    with pytest.raises(ValueError, match="same groups and rollouts"):
        step_turn_advantages([[None, None]], [[1.0]])
