"""The built-in tool loop: the trainer plays the agent for ``environment_factory`` and ``tools=``.

One more agent behind the capture proxy: each rollout is a ``ToolLoopSession``, a ``ProxySession``
(``harness_grpo.white_box``) whose model calls go through the trainer's proxy under the rollout's
own key, so its trace, rows, loss and metrics are the harness mode's.

The loop (``run_tool_loop``), as TRL's GRPO trainer runs it: generate; if the reply has tool calls
(several in one turn are run in order, one tool message each), run them, append the assistant
message and the tool messages, generate again; stop when

- the model answers without a tool call (``no_tool_call``),
- ``max_tool_calling_iterations`` rounds of tool calls have run and the model asks for more
  (``max_tool_calling_iterations``; None: no cap),
- ``max_completion_length`` is spent (``max_completion_length``): in this mode it counts every token
  of the conversation after the prompt, the model's and the tool results', as TRL's GRPO trainer
  does. Each call asks for at most what is left; tool results that would leave no room are not sent
  (the tools ran, the model never sees their results) and the episode ends,
- the proxy's call budget (``max_model_calls``) answers instead of the model (``max_model_calls``),
- or the rollout's time runs out (``timeout``: ``TimeoutError``, the trainer keeps tokens and reward).

Token counts are exact for what the model sampled and saw (the engine's ids of every reply); the
length of tool results the next prompt will carry is computed before that call from the template the
way TRL does (``ToolSuffixLength``: a dummy conversation rendered with and without the tool messages,
cut after the end-of-turn token), which is what the proxy's token-in bridge sends the engine for a
prefix-preserving template. The ``Episode`` (prompt, completion messages, environment, counts) is
what reward functions and the ``tools/*`` metrics read after the rollout.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness_grpo.environments import EnvironmentRollout, Environments, Message, Toolbox
from harness_grpo.rollout_context import BoundSessionFactory, RolloutContext
from harness_grpo.session_protocol import VerifyResult
from harness_grpo.white_box import ProxySession, ToolReport

log = logging.getLogger(__name__)

NO_TOOL_CALL = "no_tool_call"
MAX_ITERATIONS = "max_tool_calling_iterations"
MAX_COMPLETION_LENGTH = "max_completion_length"
MAX_MODEL_CALLS = "max_model_calls"
TIMEOUT = "timeout"
EXHAUSTED = frozenset({MAX_ITERATIONS, MAX_COMPLETION_LENGTH, MAX_MODEL_CALLS, TIMEOUT})


@dataclass
class Episode:
    """What the built-in tool loop knows of one rollout (``HarnessRolloutOutcome.episode``).

    ``prompt``: the messages the first call sent (``reset``'s observation appended); ``completion``:
    the assistant and tool messages after it, as TRL's reward functions receive ``completions``;
    ``parallel_calls``: tool calls per assistant turn that made any; ``completion_tokens``: model and
    tool-result tokens the conversation spent after the prompt; ``stop_reason``: one of the module's
    stop reasons.
    """

    environment: Any
    environment_name: str | None
    prompt: list[Message]
    completion: list[Message] = field(default_factory=list)
    tool_calls: int = 0
    tool_failures: int = 0
    unknown_names: int = 0
    parallel_calls: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    stop_reason: str | None = None

    @property
    def loop_exhausted(self) -> bool:
        """The episode ended on a limit (iterations, tokens, calls or time), not because the model stopped."""
        return self.stop_reason in EXHAUSTED


@dataclass(frozen=True)
class ToolLoopLimits:
    """``max_tool_calling_iterations`` (None: no cap), ``max_completion_length`` (the whole conversation's
    tokens after the prompt) and the ``chat_template_kwargs`` every call renders with."""

    max_iterations: int | None
    max_completion_length: int
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)


Chat = Callable[[dict[str, Any]], dict[str, Any]]
"""One chat completion: request body -> the whole reply (with ``prompt_token_ids`` and ``token_ids``)."""


class ToolSuffixLength:
    """Tokens the template adds to a conversation for tool messages after an assistant turn, up to the
    next generation prompt (TRL's ``_get_tool_suffix_ids``; the rendering is cut after the turn's
    end-of-turn token, where the engine stopped sampling)."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self._lock = threading.Lock()  # rollouts run on several threads; a fast tokenizer is not re-entrant

    def __call__(self, tool_messages: list[Message]) -> int:
        dummy = [
            {"role": "user", "content": "dummy"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}],
            },
        ]
        prefix = self._render(dummy, add_generation_prompt=False)
        full = self._render(dummy + tool_messages, add_generation_prompt=True)
        ends = [i for i, token in enumerate(prefix) if token in self.eos_ids]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template is not prefix-preserving: tool messages change the turns before them")
        return len(full) - len(prefix)

    def _render(self, messages: list[Message], *, add_generation_prompt: bool) -> list[int]:
        with self._lock:
            ids = self.tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False, **self.kwargs
            )
        return list(ids)


def run_tool_loop(
    chat: Chat,
    episode: Episode,
    toolbox: Toolbox,
    limits: ToolLoopLimits,
    suffix_length: Callable[[list[Message]], int],
    report: ToolReport,
) -> None:
    """Run one episode to its end (module docstring), filling ``episode`` and ``report`` as it goes.

    ``chat`` is the only way to the model. ``TimeoutError`` from it ends the episode (``timeout``) and
    propagates; any other error propagates (the rollout is unscorable).
    """
    messages = [dict(m) for m in episode.prompt]
    budget = limits.max_completion_length
    ran: Counter[str] = Counter()  # the calls that ran, by tool name
    report.calls, report.failures = ran, 0
    start: int | None = None  # the first prompt's length
    pending = 0  # tokens after the prompt the next call's prompt will hold: replies and tool results so far
    iterations = 0
    while True:
        body: dict[str, Any] = {"messages": messages, "max_tokens": budget - pending, "return_token_ids": True}
        if toolbox.schemas:
            body["tools"] = toolbox.schemas
        if limits.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(limits.chat_template_kwargs)
        try:
            reply = chat(body)
        except TimeoutError:
            episode.stop_reason = TIMEOUT
            raise
        if "prompt_token_ids" not in reply:  # the proxy's own answer once the call budget is spent
            episode.stop_reason = MAX_MODEL_CALLS
            return
        choice = reply["choices"][0]
        prompt_length = len(reply["prompt_token_ids"])
        start = prompt_length if start is None else start
        if prompt_length - start != pending:
            log.debug("tool loop: the prompt grew by %d tokens, %d predicted", prompt_length - start, pending)
        used = prompt_length - start + len(choice.get("token_ids") or [])
        episode.completion_tokens = used
        message = {"role": "assistant", **{k: v for k, v in choice["message"].items() if k != "role"}}
        calls = list(message.get("tool_calls") or [])
        messages.append(message)
        episode.completion.append(message)
        if choice.get("finish_reason") == "length" or used >= budget:
            episode.stop_reason = MAX_COMPLETION_LENGTH
            return
        if not calls:
            episode.stop_reason = NO_TOOL_CALL
            return
        if limits.max_iterations is not None and iterations >= limits.max_iterations:
            episode.stop_reason = MAX_ITERATIONS
            return
        episode.parallel_calls.append(len(calls))
        results = [toolbox.call(call) for call in calls]
        for result in results:
            ran[result.name] += 1
            episode.tool_calls += 1
            episode.tool_failures += result.failed
            episode.unknown_names += result.unknown
            report.latency_s.append((result.name, result.seconds))
        report.failures = episode.tool_failures
        tool_messages = [result.message for result in results]
        pending = used + suffix_length(tool_messages)
        if pending >= budget:  # no room left for the model to read them and answer
            episode.stop_reason = MAX_COMPLETION_LENGTH
            return
        messages += tool_messages
        episode.completion += tool_messages
        iterations += 1


class ToolLoopSession(ProxySession):
    """One rollout of the built-in tool loop (see the module docstring); no verifier: reward functions score it."""

    def __init__(
        self,
        factory: ToolLoopSessionFactory,
        rollout: EnvironmentRollout,
        context: RolloutContext,
        *,
        seed: int,
        episode_id: str,
    ) -> None:
        calls = None if factory.limits.max_iterations is None else factory.limits.max_iterations + 1
        if context.max_model_calls is not None:
            calls = context.max_model_calls if calls is None else min(calls, context.max_model_calls)
        super().__init__(
            context,
            {"episode_id": episode_id, "seed": seed, "mode": "tool-loop", "environment": rollout.environment_name},
            max_model_calls=calls,
        )
        self._factory = factory
        self.toolbox = rollout.toolbox
        self.tool_loop_episode = Episode(rollout.environment, rollout.environment_name, rollout.prompt)

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        self.start_clock(timeout_s)
        run_tool_loop(
            self.chat_completion,
            self.tool_loop_episode,
            self.toolbox,
            self._factory.limits,
            self._factory.suffix_length,
            self.tool_report,
        )
        return 0

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        return VerifyResult(env_reward=None)

    def close(self) -> None:
        try:
            self.toolbox.close()
        finally:
            super().close()


class ToolLoopSessionFactory(BoundSessionFactory):
    """The trainer's factory for ``environment_factory`` / ``tools=`` rollouts (a ``TrainerBoundSessionFactory``)."""

    def __init__(
        self,
        environments: Environments,
        *,
        tokenizer: Any,
        max_tool_calling_iterations: int | None,
        max_completion_length: int,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if max_tool_calling_iterations is not None and max_tool_calling_iterations < 0:
            raise ValueError("max_tool_calling_iterations must be >= 0 (or None: no cap)")
        if max_completion_length < 1:
            raise ValueError("max_completion_length must be >= 1")
        self.environments = environments
        self.limits = ToolLoopLimits(
            max_tool_calling_iterations, max_completion_length, dict(chat_template_kwargs or {})
        )
        self.suffix_length = ToolSuffixLength(tokenizer, chat_template_kwargs)

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> ToolLoopSession:
        context = self.bound_context()
        rollout = self.environments.start(row)
        try:
            return ToolLoopSession(self, rollout, context, seed=seed, episode_id=episode_id)
        except BaseException:
            rollout.toolbox.close()
            raise
