"""Group-relative advantages with unscorable rollouts excluded from the baseline.

    reward     one float per rollout, or None when the rollout is unscorable (an infrastructure
               failure: create, wait, fetch or verify failed). None is never 0. NaN is read as None
               (REFERENCE §3.3: "None becomes NaN").
    baseline   mean and POPULATION std (ddof=0) over the scored rollouts of one group only
               (AsyncGRPO's convention; sync GRPO uses Bessel's nanstd, which is larger by
               sqrt(n/(n-1)): x1.41 for a group of 2, x1.07 for 8).
    advantage  A = (r - mean) / (std + eps) with `scale`, else r - mean. An unscorable rollout gets
               A = 0 and the caller makes no rows for it (it is counted in `GroupStats`, not trained).

Degenerate groups carry no signal and get A = 0 for every rollout, flagged in `GroupStats`:
  * `zero_std`: every scored reward is identical (including a single scored rollout), so std == 0
    exactly. Without the flag, float round-off in `r - mean` divided by eps could turn "no signal"
    into advantages of order 1e-9 / 1e-8 — so they are set to exactly 0.
  * `all_unscorable`: no rollout was scored; mean and std are NaN.

`step_advantages` applies one of two baselines to a step's groups: "group" (GRPO: each group's own, as
above) or "batch" (one mean, and std with `scale`, over every scored reward of the step, as REINFORCE++'s
global normalisation). With "batch", a group whose rollouts all scored alike is trained too: below the
step's mean its rollouts are pushed down, above it up. That is the signal a task gets where a policy fails
every rollout of it while succeeding on others: under "group" such a task's choices are never penalised,
and what the step rewards elsewhere spreads to it unopposed. Stats stay per group either way.

Turn-level credit (`step_turn_advantages`): where a reward function scores each model call of a rollout
(a list per rollout, see `harness_grpo.reward_funcs`), each call's tokens train with

    A_t = A + (r_t - mean_turns) / (std_turns + eps)      (without `scale`: A + r_t - mean_turns)

A is the rollout's advantage above (the per-turn values count in the rollout's reward as their sum);
mean_turns and std_turns are over every scored turn value of the group's (with "batch", the step's)
scored rollouts, so a call is credited against the calls made in the same situation's rollouts and the
tokens every call shares (the tool-call format) get no net push. A turn scored None gets only A.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BASELINES",
    "GroupStats",
    "combine_rewards",
    "group_advantages",
    "group_metrics",
    "step_advantages",
    "step_turn_advantages",
]

BASELINES = ("group", "batch")


@dataclass(frozen=True, slots=True)
class GroupStats:
    """What one group's baseline was computed from (mean/std are NaN when nothing was scored)."""

    n: int
    n_scored: int
    mean: float
    std: float
    zero_std: bool
    all_unscorable: bool

    @property
    def n_unscorable(self) -> int:
        return self.n - self.n_scored


def _scored(reward: float | None, i: int) -> float | None:
    if reward is None:
        return None
    value = float(reward)
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise ValueError(f"reward[{i}] is {value}; use None for an unscorable rollout")
    return value


def group_advantages(
    rewards: Sequence[float | None], *, scale: bool = True, eps: float = 1e-8
) -> tuple[list[float], GroupStats]:
    """Advantages for one group of rollouts of the same task, in input order.

    None/NaN rewards are excluded from the mean and the (population) std and get advantage 0.
    Zero-variance and all-unscorable groups get all zeros (see the module docstring).
    Raises ValueError on an infinite reward.
    """
    values = [_scored(r, i) for i, r in enumerate(rewards)]
    scored = [v for v in values if v is not None]
    n, k = len(values), len(scored)
    if k == 0:
        return [0.0] * n, GroupStats(n, 0, math.nan, math.nan, zero_std=False, all_unscorable=True)
    mean = math.fsum(scored) / k
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in scored) / k)
    if min(scored) == max(scored):
        return [0.0] * n, GroupStats(n, k, mean, 0.0, zero_std=True, all_unscorable=False)
    denom = std + eps if scale else 1.0
    advantages = [0.0 if v is None else (v - mean) / denom for v in values]
    return advantages, GroupStats(n, k, mean, std, zero_std=False, all_unscorable=False)


def step_advantages(
    groups: Sequence[Sequence[float | None]], *, baseline: str = "group", scale: bool = True, eps: float = 1e-8
) -> list[tuple[list[float], GroupStats]]:
    """Each group's advantages (in input order) and its own ``GroupStats``, against ``baseline`` (see the module
    docstring). With "batch", None/NaN get 0 and a step whose scored rewards are all equal gets all zeros."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, not {baseline!r}")
    per_group = [group_advantages(group, scale=scale, eps=eps) for group in groups]
    if baseline == "group":
        return per_group
    values = [[_scored(r, i) for i, r in enumerate(group)] for group in groups]
    scored = [v for group in values for v in group if v is not None]
    if not scored or min(scored) == max(scored):
        return [([0.0] * len(group), stats) for group, (_, stats) in zip(groups, per_group, strict=True)]
    mean = math.fsum(scored) / len(scored)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in scored) / len(scored))
    denom = std + eps if scale else 1.0
    return [
        ([0.0 if v is None else (v - mean) / denom for v in group], stats)
        for group, (_, stats) in zip(values, per_group, strict=True)
    ]


TurnValues = Sequence[float | None] | None
"""One rollout's per-turn values, one per model call in call order; None: the rollout has none."""


def step_turn_advantages(
    groups: Sequence[Sequence[TurnValues]],
    rewards: Sequence[Sequence[float | None]],
    *,
    baseline: str = "group",
    scale: bool = True,
    eps: float = 1e-8,
) -> list[list[list[float] | None]]:
    """The turn-level part of each call's advantage (module docstring), shaped like ``groups``.

    ``groups[g][i]`` is rollout i's per-turn values (None: none), ``rewards[g][i]`` its reward (None:
    unscorable, so its turns neither count in the baseline nor get a value). A rollout without turn values
    gets None; a turn scored None gets 0.0; a pool whose scored turns are all equal gives all zeros.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, not {baseline!r}")
    if len(groups) != len(rewards) or any(len(g) != len(r) for g, r in zip(groups, rewards, strict=False)):
        raise ValueError("per-turn values and rewards must have the same groups and rollouts")
    values = [
        [
            None if turns is None or _scored(reward, i) is None else [_scored(v, t) for t, v in enumerate(turns)]
            for i, (turns, reward) in enumerate(zip(group, group_rewards, strict=True))
        ]
        for group, group_rewards in zip(groups, rewards, strict=True)
    ]
    pools = [values] if baseline == "batch" else [[group] for group in values]
    out: list[list[list[float] | None]] = []
    for pool in pools:  # the pool's turns as one group: group_advantages' baseline, None and zero-std rules
        flat = [v for group in pool for turns in group if turns is not None for v in turns]
        advantages = iter(group_advantages(flat, scale=scale, eps=eps)[0])
        for group in pool:
            out.append([None if turns is None else [next(advantages) for _ in turns] for turns in group])
    return out


def combine_rewards(values: Sequence[float | None], weights: Sequence[float] | None = None) -> float | None:
    """One rollout's reward from several reward functions: weighted nansum; all None/NaN gives None.

    A function that returns None (or NaN) for this rollout is skipped, as in TRL's `nansum`.
    """
    if weights is not None and len(weights) != len(values):
        raise ValueError(f"{len(weights)} weights for {len(values)} reward values")
    total, seen = 0.0, False
    for i, value in enumerate(values):
        v = _scored(value, i)
        if v is not None:
            total += v * (1.0 if weights is None else float(weights[i]))
            seen = True
    return total if seen else None


def group_metrics(groups: Sequence[tuple[Sequence[float | None], GroupStats]]) -> dict[str, float]:
    """Step metrics over groups given as (rewards, stats).

    `reward` is the mean over scored rollouts, `reward_std` the mean per-group std (groups with a
    score), `frac_reward_zero_std` the fraction of scored groups with zero variance (TRL names);
    `rollout/unscorable_frac` and `rollout/unscorable_groups` (groups with nothing scored) are ours.
    """
    scored = [v for rewards, _ in groups for i, r in enumerate(rewards) if (v := _scored(r, i)) is not None]
    live = [s for _, s in groups if not s.all_unscorable]
    n = sum(s.n for _, s in groups)
    return {
        "reward": math.fsum(scored) / len(scored) if scored else math.nan,
        "reward_std": math.fsum(s.std for s in live) / len(live) if live else math.nan,
        "frac_reward_zero_std": sum(s.zero_std for s in live) / len(live) if live else math.nan,
        "rollout/unscorable_frac": (n - len(scored)) / n if n else 0.0,
        "rollout/unscorable_groups": float(sum(s.all_unscorable for _, s in groups)),
    }
