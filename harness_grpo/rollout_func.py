"""``rollout_func``: TRL's escape hatch, a user function that owns generation and the environment.

TRL 1.16 (``GRPOTrainer(rollout_func=...)``) calls ``rollout_func(prompts, trainer) -> dict`` with one
prompt per completion and trains on the ``prompt_ids``, ``completion_ids`` and ``logprobs`` it returns;
every other key reaches the reward functions. Here the same function runs inside the capture path:

- It is called once per rollout, on a rollout worker thread (rollouts run concurrently, up to
  ``max_concurrent_rollouts``), with the one-prompt slice ``[row["prompt"]]``; a group is
  ``num_generations`` such calls for one dataset row, as TRL's repeated prompts are.
- ``trainer`` is a ``RolloutFuncTrainer``: the trainer's attributes (``args``, ``state``,
  ``processing_class``, ``num_generations``, ...) plus ``rollout_clients``, one ``RolloutClient`` per
  prompt. Its model calls go through that client (``client.chat(messages, tools)``, or any
  OpenAI-compatible client given ``client.base_url`` and ``client.api_key``): the capture proxy,
  under this rollout's own session key, with the trainer's sampling policy and call budget.
- What trains is what the proxy captured, exact tokens, the engine's logprobs and the proxy's loss
  masks, as for any agent. Of the returned dict (each value a list with one entry per prompt, or
  one value for all):

  ``env_reward``      the rollout's reward (``outcome.env_reward``; without a ``rollout_reward_fn`` it
                      is the reward; None or missing: unscorable, and missing is an error then)
  ``prompt_ids``,     TRL's required keys, optional here; when given, ``prompt_ids + completion_ids``
  ``completion_ids``  must be ids the proxy captured for this rollout (one turn's prompt and sampled
                      ids, or a whole captured sequence), else training stops: ids from elsewhere
                      (a client of its own, a re-tokenization) would not be what trains
  ``logprobs``, ``logprob_token_ids``, ``env_mask``: accepted and not read (the captured ones are the truth)
  any other key       ``outcome.extra_fields[key]``, for ``rollout_reward_fn`` (TRL hands them to
                      reward functions as keyword arguments)

A function that raises makes its rollout unscorable (``TimeoutError``, which ``client.chat`` raises
once ``rollout_timeout_s`` has passed, marks it timed out); an output that breaks the contract above,
or a reward for a rollout that made no captured model call, stops training with a
``CaptureContractError`` saying what was wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness_grpo.proxy_chat import post_chat_completion
from harness_grpo.rollout_context import BoundSessionFactory, RolloutContext
from harness_grpo.session_protocol import VerifyResult
from proxy.capture_graph import sequences_from_trace
from proxy.trace import CaptureContractError, TrainingTrace, Violation

RolloutFunc = Callable[[list[Any], Any], Mapping[str, Any]]
"""``rollout_func(prompts, trainer) -> dict`` (TRL's ``RolloutFunc``)."""

TRAINED_KEYS = ("prompt_ids", "completion_ids", "logprobs", "logprob_token_ids", "env_mask")


@dataclass
class RolloutClient:
    """Where one rollout's model calls go: the capture proxy, under the rollout's session key.

    ``base_url`` is an OpenAI-compatible root (ending in ``/v1``) and ``api_key`` the session key, so
    ``openai.OpenAI(base_url=client.base_url, api_key=client.api_key)`` works as well as ``chat``.
    """

    base_url: str
    api_key: str
    model: str
    deadline: float | None = None  # time.monotonic() after which chat raises TimeoutError

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **body: Any) -> dict:
        """One chat completion; the whole response (``choices[0].message``; with ``return_token_ids=True`` also
        ``prompt_token_ids`` and ``choices[0].token_ids``). Sampling follows the trainer's policy whatever is
        sent; a failed call raises ``ModelCallError`` (``harness_grpo.proxy_chat``)."""
        payload = {"model": self.model, "messages": messages, **body}
        if tools:
            payload["tools"] = tools
        return post_chat_completion(self.base_url, self.api_key, payload, self.deadline)


class RolloutFuncTrainer:
    """What ``rollout_func`` receives as ``trainer``: the trainer's attributes, plus ``rollout_clients`` (one
    ``RolloutClient`` per prompt of this call), ``processing_class`` and ``num_generations`` (TRL's names)."""

    def __init__(self, trainer: Any, clients: list[RolloutClient]) -> None:
        self._trainer = trainer
        self.rollout_clients = clients

    @property
    def processing_class(self) -> Any:
        return self._trainer.tokenizer

    @property
    def num_generations(self) -> int:
        return self._trainer.args.num_generations

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)


def _violation(detail: str) -> CaptureContractError:
    return CaptureContractError([Violation("rollout_func_output", "", detail)])


def per_prompt(output: Any, n_prompts: int) -> list[dict[str, Any]]:
    """``output`` split into one dict per prompt (a list value: one entry each; any other value: the same for all).
    ``CaptureContractError`` unless ``output`` is a mapping of string keys whose lists have ``n_prompts`` entries."""
    if not isinstance(output, Mapping):
        raise _violation(f"rollout_func must return a dict, it returned {type(output).__name__}")
    split: list[dict[str, Any]] = [{} for _ in range(n_prompts)]
    for key, value in output.items():
        if not isinstance(key, str):
            raise _violation(f"rollout_func returned a non-string key {key!r}")
        if isinstance(value, list | tuple):
            if len(value) != n_prompts:
                raise _violation(
                    f"rollout_func returned {key!r} with {len(value)} entries for {n_prompts} prompt(s): one per "
                    "prompt (it is called once per rollout, with one prompt)"
                )
            for entry, item in zip(split, value, strict=True):
                entry[key] = item
        else:
            for entry in split:
                entry[key] = value
    return split


def check_captured_ids(result: Mapping[str, Any], trace: TrainingTrace) -> None:
    """``CaptureContractError`` unless the rollout's returned ``prompt_ids + completion_ids`` (when given) are ids
    the proxy captured: one turn's prompt and sampled ids, or a whole captured sequence."""
    prompt_ids, completion_ids = result.get("prompt_ids"), result.get("completion_ids")
    if prompt_ids is None and completion_ids is None:
        return
    if prompt_ids is None or completion_ids is None:
        raise _violation("rollout_func returned only one of prompt_ids and completion_ids")
    returned = (*prompt_ids, *completion_ids)
    captured = {tuple(s.token_ids) for s in sequences_from_trace(trace)}
    captured |= {(*t.prompt_token_ids, *t.completion_token_ids) for t in trace.turns}
    if returned not in captured:
        raise _violation(
            f"rollout_func returned {len(prompt_ids)} prompt ids + {len(completion_ids)} completion ids that the "
            f"proxy did not capture for this rollout ({len(trace.turns)} captured turn(s)): generate through "
            "trainer.rollout_clients, and return the ids it answered (return_token_ids=True), never re-tokenized text"
        )


class RolloutFuncSession:
    """One rollout run by ``rollout_func``: a proxy session, the call, and what it returned."""

    def __init__(
        self,
        factory: RolloutFuncSessionFactory,
        row: Mapping[str, Any],
        context: RolloutContext,
        *,
        seed: int,
        episode_id: str,
    ) -> None:
        self._factory = factory
        self.prompt = row["prompt"]
        self.lease = context.lease({"episode_id": episode_id, "seed": seed, "mode": "rollout_func"})
        assert self.lease.key is not None
        self.client = RolloutClient(f"{context.proxy.base_url}/v1", self.lease.key, context.model_name)
        self._returned = False
        self._output: Any = None
        self.result: dict[str, Any] | None = None  # this rollout's share of the output, once checked
        self.extra_fields: dict[str, Any] = {}

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        self.client.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        view = RolloutFuncTrainer(self._factory.trainer, [self.client])
        self._output = self._factory.rollout_func([self.prompt], view)
        self._returned = True
        return 0

    def fetch_training_trace(self) -> TrainingTrace:
        trace = self.lease.trace()
        if self._returned:  # its output must keep the contract
            (self.result,) = per_prompt(self._output, 1)
            check_captured_ids(self.result, trace)
            if not trace.turns and self.result.get("env_reward") is not None:
                raise _violation(
                    "rollout_func returned a reward for a rollout that made no model call through the proxy: "
                    "generate through trainer.rollout_clients"
                )
            self.extra_fields = {k: v for k, v in self.result.items() if k not in (*TRAINED_KEYS, "env_reward")}
        return trace

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        result = self.result or {}
        if self.result is not None and "env_reward" not in result and self._factory.needs_env_reward:
            raise ValueError(
                "rollout_func returned no 'env_reward' and the trainer has no rollout_reward_fn: return the "
                "rollout's reward as 'env_reward', or score outcome.extra_fields with rollout_reward_fn"
            )
        reward = result.get("env_reward")
        return VerifyResult(env_reward=None if reward is None else float(reward))

    def close(self) -> None:
        self.lease.release()


class RolloutFuncSessionFactory(BoundSessionFactory):
    """Runs each rollout by ``rollout_func`` against the trainer's proxy (a ``TrainerBoundSessionFactory``).

    ``trainer`` is what the function's ``trainer`` argument forwards to; ``needs_env_reward``: the
    function must return ``env_reward`` (no ``rollout_reward_fn`` will score its outcomes).
    """

    def __init__(self, rollout_func: RolloutFunc, trainer: Any, *, needs_env_reward: bool) -> None:
        if not callable(rollout_func):
            raise TypeError(f"rollout_func must be callable as rollout_func(prompts, trainer), got {rollout_func!r}")
        self.rollout_func = rollout_func
        self.trainer = trainer
        self.needs_env_reward = needs_env_reward

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> RolloutFuncSession:
        return RolloutFuncSession(self, row, self.bound_context(), seed=seed, episode_id=episode_id)


def rollout_func_factory(
    rollout_func: RolloutFunc,
    trainer: Any,
    *,
    harness_session_factory: Any,
    harness_adapter: Any,
    needs_env_reward: bool,
) -> RolloutFuncSessionFactory:
    """The trainer's session factory for ``rollout_func``, which owns generation and the environment, so neither
    a ``harness_session_factory`` nor a ``harness_adapter`` may come with it (``ValueError`` naming them)."""
    given = [
        name
        for name, value in (("harness_session_factory", harness_session_factory), ("harness_adapter", harness_adapter))
        if value is not None
    ]
    if given:
        raise ValueError(
            f"rollout_func owns generation and the environment, so {' and '.join(given)} can't come with it: pass "
            "rollout_func alone, or a harness_session_factory (with a harness_adapter for a tool loop of your own)"
        )
    return RolloutFuncSessionFactory(rollout_func, trainer, needs_env_reward=needs_env_reward)
