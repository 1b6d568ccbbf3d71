"""Which turns train is decided by the trace's loss masks; a turn rule is one way to set them.

``mask_turns(trace, keep)`` returns the trace with the completion of every turn ``keep`` rejects
turned into context (mask 0): the tokens stay in every sequence that contains them, as context,
and nothing else changes. ``with_turn_rule(harness_session_factory, keep)`` applies it to every
trace a factory's sessions return, before the trainer builds rows::

    factory = with_turn_rule(functools.partial(LocalAgentSessionFactory, ...), has_tool_call)
    HarnessAsyncGRPOTrainer(model, factory, args, dataset)

(TRL's old ``train_turn_fn=has_tool_call`` did this inside the trainer; the documented API has no
such hook.) The wrapper keeps the wrapped factory's protocol: a trainer-bound factory stays bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness_grpo.outcomes import HarnessTurn
from harness_grpo.session_protocol import TrainerBoundSessionFactory, fetch_trace
from proxy.trace import TrainingTrace

TurnRule = Callable[[HarnessTurn], bool]


def has_tool_call(turn: HarnessTurn) -> bool:
    """Train the turns that emitted a tool call."""
    return bool(turn.tool_calls)


def mask_turns(trace: TrainingTrace, keep: TurnRule) -> TrainingTrace:
    """``trace`` with the completions of the turns ``keep`` rejects masked to 0 (a new trace; ids kept)."""
    turns = []
    for turn in trace.turns:
        if keep(HarnessTurn.of(turn)):
            turns.append(turn)
            continue
        n_prompt = len(turn.prompt_token_ids)
        masked = [*turn.loss_mask[:n_prompt], *[0] * (len(turn.loss_mask) - n_prompt)]
        turns.append(turn.model_copy(update={"loss_mask": masked}))
    return TrainingTrace.model_construct(schema_version=trace.schema_version, turns=turns)


class _RuledSession:
    """A session whose trace goes through the rule; everything else is the wrapped session's."""

    def __init__(self, inner: Any, keep: TurnRule) -> None:
        self._inner, self._keep = inner, keep

    def fetch_training_trace(self) -> TrainingTrace:
        return mask_turns(fetch_trace(self._inner), self._keep)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _RuledFactory:
    """The wrapped factory with ruled sessions; other attributes (``prompt_rows``, ...) are the inner's."""

    def __init__(self, inner: Any, keep: TurnRule) -> None:
        self._inner, self._keep = inner, keep

    def create(self, prompt: Any, seed: int | None = None, episode_id: str | None = None) -> _RuledSession:
        return _RuledSession(self._inner.create(prompt, seed=seed, episode_id=episode_id), self._keep)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class _BoundRuledFactory(_RuledFactory):
    """The same for a ``TrainerBoundSessionFactory``."""

    def bind_rollout(self, context: Any) -> None:
        self._inner.bind_rollout(context)

    def create_from_row(self, row: Any, *, seed: int, episode_id: str) -> _RuledSession:
        return _RuledSession(self._inner.create_from_row(row, seed=seed, episode_id=episode_id), self._keep)


class with_turn_rule:
    """``harness_session_factory`` whose sessions' traces are masked by ``keep`` (module docstring)."""

    def __init__(self, harness_session_factory: Callable[..., Any], keep: TurnRule) -> None:
        self.build, self.keep = harness_session_factory, keep
        self.__name__ = getattr(harness_session_factory, "__name__", type(harness_session_factory).__name__)

    def __call__(self, **kwargs: Any) -> _RuledFactory:
        inner = self.build(**kwargs)
        bound = isinstance(inner, TrainerBoundSessionFactory)
        return (_BoundRuledFactory if bound else _RuledFactory)(inner, self.keep)
