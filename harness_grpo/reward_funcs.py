"""Rewards as TRL's GRPO trainer computes them: reward functions, their weights, and ``None`` per function.

A run's reward has one column per source, in this order:

- each of ``reward_funcs`` (named after the function), weighted by ``reward_weights`` (default 1 each);
- ``<EnvClass>``, weight 1, for each environment class with a ``get_reward()`` method: its value on
  the rollouts of that exact class, None on the others (TRL's rule);
- ``harness_reward``, weight 1: ``rollout_reward_fn(outcome)`` when one is given, else, for session
  factories, the verifier's ``env_reward`` (the only column when nothing else is given).

A reward function is called once per training step over the step's rollouts that ran (the failed
ones are unscorable and never reach it), as TRL calls it per batch::

    f(prompts=[...], completions=[...], completion_ids=[...], environments=[...], trainer_state=state,
      log_metric=log_metric, **columns)

``prompts``: the messages of each rollout's first model call (``reset``'s observation appended; for
an agent, the row's ``prompt``); ``completions``: the messages after them (assistant turns and tool
results); ``completion_ids``: the token ids after the prompt in the last turn, when the conversation
is one sequence (else every turn's sampled ids, concatenated); ``environments``: the rollouts'
environment instances after their episodes (built-in tool loop only); ``columns``: every dataset
column but ``prompt``, one value per rollout; ``log_metric(name, value)``: logged as the step's
mean. It returns one float or None per rollout (NaN reads as None), sync or ``async``.

A rollout's reward is the weighted sum of its columns with None skipped (TRL's ``nansum``); a rollout
with no usable column is unscorable (None: excluded from its group's baseline, no rows).

Per-turn rewards (ours, beyond TRL): for a rollout, a function may return a list instead of a number,
one float or None per model call of the rollout, in call order (one per entry of its ``trace``; with
the built-in tool loop, one per assistant message of ``completions``). Its column value is the list's
sum (None skipped; all None: None), so the rollout's reward and every metric read as before, and each
call's tokens also get turn-level credit (``harness_grpo.advantages.step_turn_advantages``) from the
weighted per-turn values of the functions that returned lists. A game can say which moves helped, not
only whether the game was won.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from harness_grpo.advantages import combine_rewards
from harness_grpo.outcomes import HarnessRolloutOutcome
from harness_grpo.rollout_metrics import REWARD_NAME

if TYPE_CHECKING:
    from harness_grpo.environments import Environments
    from harness_grpo.rollouts import RolloutGroup

RewardFunc = Callable[..., list[float | None] | list[float | list[float | None] | None]]
"""``f(prompts, completions, **kwargs) -> list[float | None]``, one value per rollout, or per rollout a list of
per-turn values (module docstring)."""
TurnRewards = list[float | None] | None
"""One rollout's weighted per-turn rewards, one per model call; None when no function scored its turns."""


def callable_name(func: Any) -> str:
    """A reward function's column name: its ``__name__`` (a partial's function's), else its class name."""
    if isinstance(func, functools.partial):
        return callable_name(func.func)
    return getattr(func, "__name__", None) or type(func).__name__


def _resolve(value: Any) -> Any:
    """``value``, awaited on a fresh event loop when it is awaitable (an ``async`` reward function's result)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    return asyncio.run(wait())


def _get_reward_column(environment_type: type) -> RewardFunc:
    def get_reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return [_resolve(e.get_reward()) if type(e) is environment_type else None for e in environments]

    get_reward.__name__ = environment_type.__name__
    return get_reward


class RewardFunctions:
    """The reward columns of a run, their weights, and how one step's rollouts are scored (module docstring).

    ``environments`` is None for session factories (agents), whose verifier reward is a column; with the
    built-in tool loop there is no verifier, and a run without ``reward_funcs``, ``get_reward`` or
    ``rollout_reward_fn`` has no reward: ``ValueError``.
    """

    def __init__(
        self,
        reward_funcs: RewardFunc | Sequence[RewardFunc] | None = None,
        reward_weights: Sequence[float] | None = None,
        *,
        rollout_reward_fn: Callable[[HarnessRolloutOutcome], float | None] | None = None,
        environments: Environments | None = None,
    ) -> None:
        if reward_funcs is None:
            funcs: list[Any] = []
        elif isinstance(reward_funcs, (list, tuple)):
            funcs = list(reward_funcs)
        else:
            funcs = [reward_funcs]
        for i, func in enumerate(funcs):
            if isinstance(func, (str, torch.nn.Module)):
                shown = repr(func) if isinstance(func, str) else type(func).__name__
                raise ValueError(
                    f"reward_funcs[{i}] is {shown}: HarnessAsyncGRPOTrainer takes reward functions only, not reward "
                    "models; pass a function f(prompts, completions, **kwargs) -> list[float | None] that scores "
                    "with your model"
                )
            if not callable(func):
                raise TypeError(f"reward_funcs[{i}] is a {type(func).__name__}, not a function")
        if reward_weights is not None and len(reward_weights) != len(funcs):
            raise ValueError(
                f"Number of reward weights ({len(reward_weights)}) must match number of reward functions ({len(funcs)})"
            )
        weights = [float(w) for w in reward_weights] if reward_weights is not None else [1.0] * len(funcs)
        self.funcs: list[RewardFunc] = funcs
        self.env_mode = environments is not None
        for environment_type in environments.reward_types if environments is not None else []:
            self.funcs.append(_get_reward_column(environment_type))
            weights.append(1.0)
        self.names = [callable_name(f) for f in self.funcs]
        self.rollout_reward_fn = rollout_reward_fn
        self.has_harness_column = rollout_reward_fn is not None or not self.env_mode
        if self.has_harness_column:
            self.names.append(REWARD_NAME)
            weights.append(1.0)
        self.weights = weights
        if not self.names:
            raise ValueError(
                "No reward source provided. Pass reward_funcs, an environment_factory whose environment defines a "
                "get_reward method, or rollout_reward_fn"
            )

    @property
    def shaped(self) -> bool:
        """The reward is not the verifier's alone (a session factory with reward functions or a rollout_reward_fn)."""
        return not self.env_mode and (len(self.names) > 1 or self.rollout_reward_fn is not None)

    def score(
        self, groups: Sequence[RolloutGroup], trainer_state: Any = None
    ) -> tuple[list[list[float | None]], dict[str, list[float | None]], dict[str, float], list[list[TurnRewards]]]:
        """``(rewards per group, values per column over the flattened rollouts, metrics the functions logged,
        per-turn rewards per group)``; a rollout's per-turn rewards are the weighted nansum, turn by turn, of the
        functions that returned a list for it (None where none did)."""
        pairs = [(group.row, outcome) for group in groups for outcome in group.outcomes]
        ran = [i for i, (_, outcome) in enumerate(pairs) if _ran(outcome)]
        columns: dict[str, list[float | None]] = {name: [None] * len(pairs) for name in self.names}
        turns: list[TurnRewards] = [None] * len(pairs)
        logged: defaultdict[str, list[float]] = defaultdict(list)
        if ran:
            kwargs = self._kwargs([pairs[i] for i in ran], trainer_state, lambda n, v: logged[n].append(float(v)))
            calls = [len(pairs[i][1].trace) for i in ran]
            k = len(self.funcs)
            for name, weight, func in zip(self.names[:k], self.weights[:k], self.funcs, strict=True):
                values, per_turn = _column_values(name, _resolve(func(**kwargs)), calls)
                for i, value, turn_values in zip(ran, values, per_turn, strict=True):
                    columns[name][i] = value
                    if turn_values is not None:
                        turns[i] = _add_turns(turns[i], turn_values, weight)
            if self.has_harness_column:
                for i in ran:
                    columns[REWARD_NAME][i] = self._harness_reward(pairs[i][1])
        flat = [combine_rewards([columns[n][i] for n in self.names], self.weights) for i in range(len(pairs))]
        rewards, turn_rewards, at = [], [], 0
        for group in groups:
            rewards.append(flat[at : at + len(group.outcomes)])
            turn_rewards.append(turns[at : at + len(group.outcomes)])
            at += len(group.outcomes)
        logged_means = {name: sum(values) / len(values) for name, values in logged.items()}
        return rewards, columns, logged_means, turn_rewards

    def _harness_reward(self, outcome: HarnessRolloutOutcome) -> float | None:
        reward = outcome.env_reward if self.rollout_reward_fn is None else self.rollout_reward_fn(outcome)
        return _check_values(REWARD_NAME, [reward], 1)[0]

    def _kwargs(
        self,
        pairs: list[tuple[dict[str, Any], HarnessRolloutOutcome]],
        trainer_state: Any,
        log_metric: Callable[[str, float], None],
    ) -> dict[str, Any]:
        columns = {key for row, _ in pairs for key in row if key not in ("prompt", "completion", "completion_ids")}
        kwargs: dict[str, Any] = {
            "prompts": [outcome.episode.prompt if outcome.episode else row.get("prompt") for row, outcome in pairs],
            "completions": [_completion(outcome) for _, outcome in pairs],
            "completion_ids": [_completion_ids(outcome) for _, outcome in pairs],
            **{key: [row.get(key) for row, _ in pairs] for key in sorted(columns)},
            "trainer_state": trainer_state,
            "log_metric": log_metric,
        }
        if self.env_mode:
            kwargs["environments"] = [outcome.episode.environment for _, outcome in pairs]
        return kwargs


def _ran(outcome: HarnessRolloutOutcome) -> bool:
    return outcome.error is None and outcome.training_trace is not None


def _check_values(name: str, values: Any, n: int) -> list[float | None]:
    """``values`` as floats or None (NaN: None); ``ValueError`` naming the function when they are not ``n`` numbers."""
    _check_length(name, values, n)
    return [_number(name, value) for value in values]


def _column_values(
    name: str, values: Any, calls: list[int]
) -> tuple[list[float | None], list[list[float | None] | None]]:
    """A function's result over rollouts with ``calls[i]`` model calls each: ``(column values, per-turn values)``.

    A number or None is the rollout's value (per-turn None); a list of ``calls[i]`` numbers or None is per-turn,
    and the value is their sum (all None: None). ``ValueError`` naming the function otherwise.
    """
    _check_length(name, values, len(calls))
    column: list[float | None] = []
    per_turn: list[list[float | None] | None] = []
    for value, n_calls in zip(values, calls, strict=True):
        if isinstance(value, (list, tuple)):
            if len(value) != n_calls:
                raise ValueError(
                    f"The reward function '{name}' returned {len(value)} per-turn rewards for a rollout of "
                    f"{n_calls} model calls; a per-turn list holds one float or None per model call"
                )
            turn_values = [_number(name, v) for v in value]
            scored = [v for v in turn_values if v is not None]
            column.append(math.fsum(scored) if scored else None)
            per_turn.append(turn_values)
        else:
            column.append(_number(name, value))
            per_turn.append(None)
    return column, per_turn


def _check_length(name: str, values: Any, n: int) -> None:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
        shown = len(values) if isinstance(values, Sequence) else type(values).__name__
        raise ValueError(
            f"The reward function '{name}' returned {shown} rewards, but {n} were expected (one per rollout); "
            "it must return a list of float or None"
        )


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        number = float(value)
        return None if math.isnan(number) else number
    raise ValueError(f"The reward function '{name}' returned {value!r}; expected a float or None")


def _add_turns(total: TurnRewards, values: list[float | None], weight: float) -> list[float | None]:
    """``total`` plus ``weight * values``, turn by turn, None skipped (a turn is None until a value lands)."""
    out = list(total) if total is not None else [None] * len(values)
    for t, value in enumerate(values):
        if value is not None:
            out[t] = (out[t] or 0.0) + weight * value
    return out


def _completion(outcome: HarnessRolloutOutcome) -> list[dict[str, Any]]:
    """The messages after the first model call's: the episode's, or those of the last turn's history."""
    if outcome.episode is not None:
        return list(outcome.episode.completion)
    first = len((outcome.trace[0].get("request") or {}).get("messages") or []) if outcome.trace else 0
    return list(outcome.completion[first:])


def _completion_ids(outcome: HarnessRolloutOutcome) -> list[int]:
    if not outcome.trace:
        return []
    first, last = outcome.trace[0], outcome.trace[-1]
    prompt = first["prompt_token_ids"]
    if last["prompt_token_ids"][: len(prompt)] == prompt:
        return [*last["prompt_token_ids"][len(prompt) :], *last["completion_token_ids"]]
    return [token for entry in outcome.trace for token in entry["completion_token_ids"]]
