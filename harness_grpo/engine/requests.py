"""Validation of OpenAI/vLLM request bodies into what the engine runs.

Contract: ``parse_chat`` and ``parse_completion`` take a decoded JSON body and
return a typed request or raise a 400 ``EngineError`` naming the field
(``param``), with vLLM's meaning for each field: ``temperature`` 0 is greedy,
``top_k`` -1 (or 0) and ``top_p`` 1 are off, ``max_completion_tokens``
overrides ``max_tokens``, chat ``logprobs`` needs ``top_logprobs`` set (even
to 0) to return ``logprobs.content``, completions ``logprobs`` is an int.
Fields that would change the sampled distribution (penalties, ``min_p``,
``logit_bias``, guided decoding, ...) are accepted only at their neutral
values; ``n`` must be 1. Chat may ``stream`` (with ``stream_options`` only
then, and only ``include_usage``); completions may not. vLLM's ``ignore_eos`` keeps sampling
past end-of-sequence tokens (fixed-length outputs for benchmarks and tests;
the distribution is unchanged). Other unknown fields are ignored, as vLLM
does. ``Options.sampling_params`` applies the context check
once the prompt length is known.

``parse_chat_tokens`` is a chat body plus ``tokens``, the prompt ids to sample
from (prime-rl's ``/v1/chat/completions/tokens``): a non-empty list of ids in
the vocabulary, checked before anything else. ``parse_tokenize`` reads vLLM's
``TokenizeChatRequest`` (``messages``: ``add_generation_prompt`` default true,
``continue_final_message``, ``add_special_tokens`` default false, never the
first two together) or ``TokenizeCompletionRequest`` (``prompt``:
``add_special_tokens`` default true); ``parse_detokenize`` reads ``tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from harness_grpo.engine.errors import EngineError, bad_request
from harness_grpo.engine.sampling import SamplingParams

MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs

# Accepted only at these values (None always means "not set").
NEUTRAL_VALUES: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
    "use_beam_search": False,
    "echo": False,
    "add_generation_prompt": True,
    "continue_final_message": False,
}
# Refused when set to anything but None (or an empty container).
UNSUPPORTED_FIELDS = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "stop_token_ids",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "prompt_logprobs",
    "suffix",
    "chat_template",
    "documents",
)
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class Options:
    """Sampling and output options shared by both endpoints."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int | None
    top_logprobs: int | None  # None: no per-position logprobs in the response
    return_token_ids: bool
    ignore_eos: bool = False

    def sampling_params(self, prompt_len: int, max_model_len: int, prompt_field: str) -> SamplingParams:
        """Engine parameters for a ``prompt_len``-token prompt; a 400 naming ``prompt_field`` if it can't fit."""
        if prompt_len == 0:
            raise bad_request("the prompt is empty", prompt_field)
        if prompt_len >= max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input.",
                prompt_field,
            )
        max_tokens = self.max_tokens if self.max_tokens is not None else max_model_len - prompt_len
        if prompt_len + max_tokens > max_model_len:
            raise bad_request(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                f"length is {max_model_len} tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {max_model_len} - {prompt_len}).",
                "max_tokens",
            )
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=self.stop,
            seed=self.seed,
            top_logprobs=self.top_logprobs or 0,
            ignore_eos=self.ignore_eos,
        )


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated ``/v1/chat/completions`` body."""

    model: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tool_calls: bool  # tools given and tool_choice is not "none"
    chat_template_kwargs: dict[str, Any]
    options: Options
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with ``usage``


@dataclass(frozen=True, slots=True)
class TokenizeChat:
    """A validated ``/tokenize`` body holding a chat."""

    model: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any]
    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool
    return_token_strs: bool


@dataclass(frozen=True, slots=True)
class TokenizeText:
    """A validated ``/tokenize`` body holding a text ``prompt``."""

    model: str | None
    prompt: str
    add_special_tokens: bool
    return_token_strs: bool


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated ``/v1/completions`` body; ``prompt`` is text or token ids."""

    model: str | None
    prompt: str | list[int]
    options: Options


def _type_error(key: str, expected: str) -> EngineError:
    return bad_request(f"'{key}' must be {expected}", key)


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(key, "a number")
    return float(value)


def _integer(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _type_error(key, "an integer")
    return value


def _flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(key, "a boolean")
    return value


def _is_id_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_vocab(token_ids: list[int], key: str, vocab_size: int) -> None:
    if not all(0 <= t < vocab_size for t in token_ids):
        raise bad_request(f"{key} token ids must be in [0, {vocab_size})", key)


def _token_ids(body: dict[str, Any], key: str, vocab_size: int, *, non_empty: bool) -> list[int]:
    value = body.get(key)
    if value is None:
        raise bad_request(f"'{key}' is required", key)
    if not _is_id_list(value) or (non_empty and not value):
        raise _type_error(key, "a non-empty list of token ids" if non_empty else "a list of token ids")
    _check_vocab(value, key, vocab_size)
    return value


def _check_neutral(body: dict[str, Any]) -> None:
    for key, neutral in NEUTRAL_VALUES.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) != isinstance(neutral, bool) or not isinstance(value, int | float):
            raise _type_error(key, "a boolean" if isinstance(neutral, bool) else "a number")
        if value != neutral:
            raise bad_request(f"'{key}'={value!r} is not supported by the embedded engine (only {neutral!r})", key)
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) not in (None, {}, []):
            raise bad_request(f"'{key}' is not supported by the embedded engine", key)
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise bad_request("only a {'type': 'text'} response_format is supported", "response_format")


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)``."""
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options in (None, {}):
        return stream, False
    if not stream:
        raise bad_request("'stream_options' can only be set when 'stream' is true", "stream_options")
    if not isinstance(options, dict):
        raise _type_error("stream_options", "an object")
    unsupported = sorted(key for key, value in options.items() if key != "include_usage" and value not in (None, False))
    if unsupported:
        raise bad_request(f"stream_options {unsupported} are not supported by the embedded engine", "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _type_error("stream_options", "an object whose 'include_usage' is a boolean")
    return stream, bool(include_usage)


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("model", "a string")
    return model


def _options(body: dict[str, Any], *, max_tokens_keys: tuple[str, ...], default_max_tokens: int | None) -> Options:
    _check_neutral(body)
    max_tokens = default_max_tokens
    for key in max_tokens_keys:  # later keys override earlier ones
        value = _integer(body, key)
        if value is not None:
            if value < 1:
                raise bad_request(f"'{key}' must be at least 1, got {value}", key)
            max_tokens = value
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise bad_request(f"'temperature' must be non-negative, got {temperature}", "temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    top_k = _integer(body, "top_k")
    top_k = -1 if top_k is None else top_k
    if top_k < -1:
        raise bad_request(f"'top_k' must be -1 (disable) or at least 1, got {top_k}", "top_k")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _type_error("stop", "a non-empty string or a list of non-empty strings")
    return Options(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=tuple(stop),
        seed=_integer(body, "seed"),
        top_logprobs=None,
        return_token_ids=_flag(body, "return_token_ids"),
        ignore_eos=_flag(body, "ignore_eos"),
    )


def _top_logprobs(value: int | None, key: str) -> int | None:
    if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
        raise bad_request(f"'{key}' must be between 0 and {MAX_TOP_LOGPROBS}, got {value}", key)
    return value


def _valid_tools(tools: Any) -> bool:
    return isinstance(tools, list) and all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
        for t in tools
    )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _type_error("messages", "a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"messages[{i}] must be an object with 'role' one of {list(ROLES)}", "messages")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(f"messages[{i}].content must be a string, a list of parts, or null", "messages")
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is not None and not _valid_tools(tools):
        raise _type_error("tools", "a list of {'type': 'function', 'function': {'name': ...}} objects")
    return tools or None


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _type_error("chat_template_kwargs", "an object")
    return dict(kwargs or {})


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """Validate a chat-completions body."""
    messages = _messages(body)
    tools = _tools(body)
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "auto", "none"):
        raise bad_request("only tool_choice 'auto' or 'none' is supported by the embedded engine", "tool_choice")
    kwargs = _template_kwargs(body)
    options = _options(body, max_tokens_keys=("max_tokens", "max_completion_tokens"), default_max_tokens=None)
    top_logprobs = _top_logprobs(_integer(body, "top_logprobs"), "top_logprobs")
    wants_logprobs = _flag(body, "logprobs")
    if top_logprobs is not None and not wants_logprobs:
        raise bad_request("when using 'top_logprobs', 'logprobs' must be set to true", "top_logprobs")
    options = replace(options, top_logprobs=top_logprobs if wants_logprobs else None)
    stream, include_usage = _stream(body)
    return ChatRequest(
        model=_model(body),
        messages=messages,
        tools=tools,
        parse_tool_calls=tools is not None and tool_choice != "none",
        chat_template_kwargs=kwargs,
        options=options,
        stream=stream,
        include_usage=include_usage,
    )


def parse_completion(body: dict[str, Any], vocab_size: int) -> CompletionRequest:
    """Validate a completions body; token-id prompts must lie in ``[0, vocab_size)``."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not _is_id_list(prompt):
            raise _type_error("prompt", "a string or a non-empty list of token ids (one prompt)")
        _check_vocab(prompt, "prompt", vocab_size)
    elif not isinstance(prompt, str) or not prompt:
        raise _type_error("prompt", "a non-empty string or a list of token ids (one prompt)")
    for key in ("stream", "stream_options"):
        if body.get(key) not in (None, False, {}):
            raise bad_request(f"'{key}' is not supported by the embedded engine's /v1/completions", key)
    options = _options(body, max_tokens_keys=("max_tokens",), default_max_tokens=16)
    return CompletionRequest(
        model=_model(body),
        prompt=prompt,
        options=replace(options, top_logprobs=_top_logprobs(_integer(body, "logprobs"), "logprobs")),
    )


def parse_chat_tokens(body: dict[str, Any], vocab_size: int) -> tuple[ChatRequest, list[int]]:
    """Validate a ``/v1/chat/completions/tokens`` body: ``(the chat request, the prompt ids to sample from)``."""
    tokens = _token_ids(body, "tokens", vocab_size, non_empty=True)
    return parse_chat(body), tokens


def parse_tokenize(body: dict[str, Any]) -> TokenizeChat | TokenizeText:
    """Validate a ``/tokenize`` body: a chat when it has ``messages``, else a text ``prompt``."""
    return_token_strs = _flag(body, "return_token_strs")
    if "messages" not in body:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise _type_error("prompt", "a string (or send 'messages')")
        return TokenizeText(_model(body), prompt, _flag(body, "add_special_tokens", True), return_token_strs)
    if body.get("chat_template") is not None:
        raise bad_request("'chat_template' is not supported by the embedded engine", "chat_template")
    add_generation_prompt = _flag(body, "add_generation_prompt", True)
    continue_final_message = _flag(body, "continue_final_message")
    if add_generation_prompt and continue_final_message:
        raise bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "continue_final_message"
        )
    return TokenizeChat(
        model=_model(body),
        messages=_messages(body),
        tools=_tools(body),
        chat_template_kwargs=_template_kwargs(body),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        add_special_tokens=_flag(body, "add_special_tokens"),
        return_token_strs=return_token_strs,
    )


def parse_detokenize(body: dict[str, Any], vocab_size: int) -> tuple[str | None, list[int]]:
    """Validate a ``/detokenize`` body: ``(model, tokens)``; ``tokens`` may be empty."""
    return _model(body), _token_ids(body, "tokens", vocab_size, non_empty=False)
