"""Environments for the built-in tool loop: ``environment_factory`` and ``tools=`` as TRL's GRPO trainer reads them.

Contract (TRL's ``GRPOTrainer``, REFERENCE §3.6):

- ``environment_factory`` is a class or any callable taking no arguments that returns an environment
  instance, or a dict of them keyed by the dataset's ``environment`` column. The trainer builds one
  instance per rollout (``Environments.start``) and calls ``reset(**row)`` on it first: the whole row
  (every column; the ``environment`` key removed in the dict case). ``reset`` returns an observation
  string, appended to the last prompt message, or None.
- Every public method of the environment's class other than ``reset`` and ``get_reward`` is a tool,
  and so is every function passed as ``tools=``. A tool's JSON schema comes from its type hints and
  its Google-style docstring (a description, and an ``Args:`` entry per argument) through
  transformers' ``get_json_schema``; a tool without them is a ``ValueError`` at start-up naming it.
  With a dict of factories a rollout sees only its own environment's tools (plus ``tools=``).
- ``get_reward()`` on an environment class is one more reward source, named after the class, read
  after the episode (``harness_grpo.reward_funcs``).
- A tool call (``Toolbox.call``) is an OpenAI ``tool_calls`` entry; its JSON arguments are the tool's
  keyword arguments. What the tool returns becomes the tool message's content (``str()`` of it, as
  TRL does); a tool that raises, arguments that are not a JSON object, a call of another type and an
  unknown tool name all answer ``{'error': '...'}`` as the content instead and count as failed calls
  (an unknown name also as ``unknown``). ``async def`` tools run on the rollout's own event loop.

Each instance is used by one rollout only, on that rollout's worker thread; nothing here is shared
between rollouts but the factories and the standalone ``tools`` (which must be thread-safe).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

EnvironmentFactory = Callable[[], Any]
"""Builds one environment instance; its ``reset(**row)`` starts an episode (TRL's ``EnvironmentFactory``)."""

Message = dict[str, Any]
ENVIRONMENT_COLUMN = "environment"
NOT_TOOLS = ("reset", "get_reward")
EMPTY_PROMPT: list[Message] = [{"role": "user", "content": ""}]


def tool_names(environment_type: type) -> list[str]:
    """The tools of an environment class: its public functions other than ``reset`` and ``get_reward``."""
    return [
        name
        for name, _ in inspect.getmembers(environment_type, predicate=inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def tool_schema(function: Callable[..., Any], label: str) -> dict[str, Any]:
    """The OpenAI function schema transformers builds from ``function``'s type hints and docstring.

    ``ValueError`` naming ``label`` (say ``EchoToolEnv.echo``) when it has no usable docstring or hints.
    """
    try:
        return get_json_schema(function)
    except (DocstringParsingException, TypeHintParsingException) as exc:
        raise ValueError(
            f"tool {label}: {exc}. A tool needs a type hint on every argument and a Google-style docstring: "
            "a description, then 'Args:' with one line per argument (transformers' get_json_schema)"
        ) from exc


@dataclass(frozen=True)
class ToolCallResult:
    """One executed tool call: the tool message sent back, and how it went."""

    name: str
    message: Message
    failed: bool
    unknown: bool
    seconds: float


class Toolbox:
    """The tools one rollout may call: name -> callable, and their schemas (what the model is shown)."""

    def __init__(self, functions: Mapping[str, Callable[..., Any]], schemas: Sequence[dict[str, Any]]) -> None:
        self.functions = dict(functions)
        self.schemas = list(schemas)
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, tool_call: Mapping[str, Any]) -> ToolCallResult:
        """Run one OpenAI ``tool_calls`` entry; a failure is an error tool message, never an exception."""
        started = time.monotonic()
        function = tool_call.get("function") or {}
        name = str(function.get("name") or tool_call.get("name") or "")
        unknown = False
        try:
            if tool_call.get("type", "function") != "function":
                raise ValueError(f"Unsupported tool call type: {tool_call.get('type')}")
            if name not in self.functions:
                unknown = True
                raise ValueError(f"Tool {name} not found.")
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(arguments, dict):
                raise ValueError(f"the arguments of {name} must be a JSON object, got {arguments!r}")
            result = self.functions[name](**arguments)
            if inspect.isawaitable(result):
                result = self._event_loop().run_until_complete(result)
            content, failed = (result if isinstance(result, str) else str(result)), False
        except Exception as exc:
            content, failed = str({"error": str(exc)}), True
        message = {"role": "tool", "tool_call_id": tool_call.get("id") or "", "name": name, "content": content}
        return ToolCallResult(name, message, failed, unknown, time.monotonic() - started)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def close(self) -> None:
        """Close the event loop the rollout's async tools ran on, if any."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None


@dataclass
class EnvironmentRollout:
    """One rollout's start: its environment instance (reset), prompt (observation appended) and tools."""

    environment: Any
    environment_name: str | None
    prompt: list[Message]
    toolbox: Toolbox


@dataclass
class _Kind:
    """One environment factory as probed at start-up: its tools' names and schemas."""

    factory: EnvironmentFactory
    type: type
    tool_names: list[str]
    schemas: list[dict[str, Any]]
    spare: list[Any] = field(default_factory=list)  # the probe instance, handed to the first rollout


class Environments:
    """``environment_factory`` (a callable or a dict of them) and ``tools``, checked once at start-up.

    Probing builds one instance per factory (kept for the first rollout), so a factory that fails, an
    instance without ``reset``, a tool without a usable schema or two tools with one name fail the
    trainer's construction, not its rollouts.
    """

    def __init__(
        self,
        environment_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory] | None = None,
        tools: Sequence[Callable[..., Any]] | None = None,
    ) -> None:
        if environment_factory is None and not tools:
            raise ValueError("the built-in tool loop needs environment_factory= or tools=")
        self.tools = list(tools or [])
        for tool in self.tools:
            if not callable(tool):
                raise TypeError(f"tools= takes functions; got {type(tool).__name__}")
        names = [getattr(tool, "__name__", "") for tool in self.tools]
        self.tool_schemas = [
            tool_schema(tool, getattr(tool, "__qualname__", name)) for tool, name in zip(self.tools, names, strict=True)
        ]
        _check_unique(names, "tools=")
        self.multi = isinstance(environment_factory, Mapping)
        if environment_factory is None:
            factories: dict[str | None, EnvironmentFactory] = {}
        elif self.multi:
            factories = dict(environment_factory)
        else:
            factories = {None: environment_factory}
        self.kinds: dict[str | None, _Kind] = {}
        for name, factory in factories.items():
            if not callable(factory):
                raise TypeError(f"environment_factory[{name!r}] is a {type(factory).__name__}, not a class or callable")
            self.kinds[name] = self._probe(name, factory, names)
        self._lock = threading.Lock()

    def _probe(self, name: str | None, factory: EnvironmentFactory, standalone: list[str]) -> _Kind:
        label = "environment_factory" if name is None else f"environment_factory[{name!r}]"
        instance = factory()
        cls = type(instance)
        if not callable(getattr(instance, "reset", None)):
            raise ValueError(f"{label} built a {cls.__name__}, which has no reset(**row) method")
        methods = tool_names(cls)
        _check_unique(standalone + methods, f"{label} ({cls.__name__}) with tools=")
        schemas = [tool_schema(getattr(instance, m), f"{cls.__name__}.{m}") for m in methods]
        return _Kind(factory, cls, methods, schemas, spare=[instance])

    @property
    def reward_types(self) -> list[type]:
        """The environment classes that define ``get_reward``, each once, in factory order."""
        seen: list[type] = []
        for kind in self.kinds.values():
            if callable(getattr(kind.type, "get_reward", None)) and kind.type not in seen:
                seen.append(kind.type)
        return seen

    def check_rows(self, rows: Iterable[Mapping[str, Any]] | Any) -> None:
        """With a dict of factories, ``ValueError`` unless every row's ``environment`` names one of them."""
        if not self.multi:
            return
        column_names = getattr(rows, "column_names", None)
        if column_names is not None:  # a datasets.Dataset: read the one column
            found = set(rows[ENVIRONMENT_COLUMN]) if ENVIRONMENT_COLUMN in column_names else {None}
        else:
            found = {row.get(ENVIRONMENT_COLUMN) for row in rows}
        unknown = sorted(repr(name) for name in found if name not in self.kinds)
        if unknown:
            raise ValueError(
                f"train_dataset rows have environment={', '.join(unknown)}, not among the environments passed to "
                f"environment_factory: expected one of {sorted(str(k) for k in self.kinds)} in each row's "
                f"'{ENVIRONMENT_COLUMN}' column"
            )

    def start(self, row: Mapping[str, Any]) -> EnvironmentRollout:
        """A new instance for ``row`` (its environment's, in the dict case), reset with the row, and its tools."""
        if not self.kinds:
            toolbox = Toolbox({f.__name__: f for f in self.tools}, self.tool_schemas)
            return EnvironmentRollout(None, None, prompt_messages(row.get("prompt"), None), toolbox)
        name = row.get(ENVIRONMENT_COLUMN) if self.multi else None
        if name not in self.kinds:
            raise ValueError(f"row has environment={name!r}; expected one of {sorted(str(k) for k in self.kinds)}")
        kind = self.kinds[name]
        with self._lock:
            instance = kind.spare.pop() if kind.spare else None
        if instance is None:
            instance = kind.factory()
        reset_kwargs = {k: v for k, v in row.items() if k != ENVIRONMENT_COLUMN} if self.multi else dict(row)
        observation = instance.reset(**reset_kwargs)
        if observation is not None and not isinstance(observation, str):
            raise TypeError(f"{kind.type.__name__}.reset returned a {type(observation).__name__}; expected str or None")
        functions = {f.__name__: f for f in self.tools}
        functions.update({m: getattr(instance, m) for m in kind.tool_names})
        toolbox = Toolbox(functions, self.tool_schemas + kind.schemas)
        return EnvironmentRollout(instance, name, prompt_messages(row.get("prompt"), observation), toolbox)


def prompt_messages(prompt: Any, observation: str | None) -> list[Message]:
    """The row's prompt as chat messages (a string is one user message; none is an empty one), with
    ``observation`` appended to the last message's content."""
    if prompt is None:
        messages = [dict(m) for m in EMPTY_PROMPT]
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(m, Mapping) for m in prompt):
        messages = [dict(m) for m in prompt]
    else:
        raise ValueError(f"a row's prompt must be a string or a list of chat messages, got {prompt!r:.200}")
    if observation:
        content = messages[-1].get("content")
        if isinstance(content, list):
            messages[-1]["content"] = [*content, {"type": "text", "text": observation}]
        else:
            messages[-1]["content"] = (content or "") + observation
    return messages


def _check_unique(names: list[str], where: str) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{where}: more than one tool named {', '.join(repeated)}; tool names must be unique")
