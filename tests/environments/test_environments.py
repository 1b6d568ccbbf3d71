"""``environment_factory`` and ``tools=`` as TRL defines them: discovery, schemas, calls, reset and routing.

No model here: these are the rules ``harness_grpo.environments`` applies before and around the tool
loop. The trainer-level checks (a bad tool fails the trainer's construction, naming it) build the
trainer on the tiny model, which the probe reaches before any model is loaded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import datasets
import pytest

from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.environments import Environments, prompt_messages
from harness_grpo.trainer import HarnessAsyncGRPOTrainer


class EchoToolEnv:
    """TRL's quickstart environment, with the names TRL's discovery must skip."""

    def reset(self, **kwargs: Any) -> str | None:
        self.kwargs = kwargs
        return None

    def echo(self, message: str) -> str:
        """Echo the message back.

        Args:
            message: The message to echo.
        """
        return message

    def get_reward(self) -> float:
        return 1.0

    def _helper(self) -> None:
        """Private: never a tool."""


class Counter:
    """An environment with state, an observation and a tool that raises."""

    def reset(self, start: int = 0, **kwargs: Any) -> str:
        self.value = start
        return f" (the counter starts at {start})"

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: How much to add.
        """
        self.value += amount
        return self.value

    def divide(self, by: int) -> float:
        """Divide the counter.

        Args:
            by: The divisor.
        """
        return self.value / by


class NoDocstring:
    def reset(self, **kwargs: Any) -> None:
        return None

    def shout(self, text: str) -> str:
        return text.upper()


def _call(name: str, arguments: str, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tools_are_the_public_methods_and_their_schema_comes_from_the_docstring() -> None:
    environments = Environments(EchoToolEnv)
    assert environments.kinds[None].tool_names == ["echo"]  # not reset, get_reward or _helper
    assert environments.kinds[None].schemas == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo the message back.",
                "parameters": {
                    "type": "object",
                    "properties": {"message": {"type": "string", "description": "The message to echo."}},
                    "required": ["message"],
                },
                "return": {"type": "string"},
            },
        }
    ]
    assert environments.reward_types == [EchoToolEnv]


def test_a_tool_without_a_usable_docstring_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"tool NoDocstring\.shout: .*no docstring"):
        Environments(NoDocstring)

    def undocumented(x: int) -> int:
        """Double it."""
        return 2 * x

    with pytest.raises(ValueError, match=r"undocumented: .*no description for the argument 'x'"):
        Environments(tools=[undocumented])


def test_an_environment_without_reset_and_twice_the_same_tool_name_are_refused() -> None:
    class NoReset:
        def step(self, x: str) -> str:
            """Step.

            Args:
                x: input
            """
            return x

    with pytest.raises(ValueError, match="has no reset"):
        Environments(NoReset)

    def echo(message: str) -> str:
        """Echo.

        Args:
            message: The message.
        """
        return message

    with pytest.raises(ValueError, match="more than one tool named echo"):
        Environments(EchoToolEnv, tools=[echo])


def test_reset_gets_the_row_and_its_observation_is_appended_to_the_last_prompt_message() -> None:
    environments = Environments(Counter)
    row = {"prompt": [{"role": "system", "content": "Count."}, {"role": "user", "content": "Add three."}], "start": 4}
    rollout = environments.start(row)
    assert rollout.environment.value == 4
    assert rollout.prompt == [
        {"role": "system", "content": "Count."},
        {"role": "user", "content": "Add three. (the counter starts at 4)"},
    ]
    assert row["prompt"][1]["content"] == "Add three."  # the dataset row is left as it was
    assert prompt_messages("Hi", None) == [{"role": "user", "content": "Hi"}]
    assert prompt_messages(None, "obs") == [{"role": "user", "content": "obs"}]  # no prompt column: reset's text


def test_each_rollout_gets_its_own_instance() -> None:
    environments = Environments(Counter)
    first, second = environments.start({"prompt": "a", "start": 1}), environments.start({"prompt": "b", "start": 2})
    assert first.environment is not second.environment
    first.toolbox.call(_call("add", '{"amount": 10}'))
    assert (first.environment.value, second.environment.value) == (11, 2)


def test_a_tool_that_raises_or_an_unknown_name_answers_an_error_and_counts_as_a_failure() -> None:
    toolbox = Environments(Counter).start({"prompt": "x", "start": 3}).toolbox
    ok = toolbox.call(_call("add", '{"amount": 2}', "call-7"))
    assert ok.message == {"role": "tool", "tool_call_id": "call-7", "name": "add", "content": "5"}
    assert not ok.failed and not ok.unknown
    raised = toolbox.call(_call("divide", '{"by": 0}'))
    assert raised.failed and not raised.unknown
    assert raised.message["content"] == "{'error': 'division by zero'}"  # TRL's tool message for an error
    unknown = toolbox.call(_call("multiply", '{"by": 2}'))
    assert unknown.failed and unknown.unknown and unknown.message["content"] == "{'error': 'Tool multiply not found.'}"
    for bad in ('{"amount": ', "[1]", '{"count": 1}'):  # not JSON, not an object, a wrong argument name
        result = toolbox.call(_call("add", bad))
        assert result.failed and not result.unknown and result.message["content"].startswith("{'error': ")
    assert toolbox.call({"id": "x", "type": "code", "function": {"name": "add"}}).failed


def test_async_tools_run_on_the_rollouts_own_loop() -> None:
    async def wait_and_echo(text: str) -> str:
        """Echo after a pause.

        Args:
            text: What to echo.
        """
        await asyncio.sleep(0)
        return text

    toolbox = Environments(tools=[wait_and_echo]).start({"prompt": "x"}).toolbox
    assert toolbox.call(_call("wait_and_echo", '{"text": "hi"}')).message["content"] == "hi"
    assert toolbox.call(_call("wait_and_echo", '{"text": "again"}')).message["content"] == "again"
    toolbox.close()


class Calculator:
    def reset(self, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return " [calculator]"

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b


class Speller:
    def reset(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def spell(self, word: str) -> str:
        """Spell a word.

        Args:
            word: The word.
        """
        return "-".join(word)


def test_a_dict_of_factories_routes_on_the_environment_column_and_shows_only_that_environments_tools() -> None:
    environments = Environments({"math": Calculator, "words": Speller})
    math_rollout = environments.start({"prompt": "1+1?", "environment": "math", "level": 2})
    assert isinstance(math_rollout.environment, Calculator) and math_rollout.environment_name == "math"
    assert math_rollout.environment.kwargs == {"prompt": "1+1?", "level": 2}  # 'environment' removed first
    assert [s["function"]["name"] for s in math_rollout.toolbox.schemas] == ["add"]
    assert math_rollout.prompt == [{"role": "user", "content": "1+1? [calculator]"}]
    words = environments.start({"prompt": "spell", "environment": "words"})
    assert [s["function"]["name"] for s in words.toolbox.schemas] == ["spell"]
    assert words.toolbox.call(_call("add", '{"a": 1, "b": 2}')).unknown  # another environment's tool
    environments.check_rows([{"environment": "math"}, {"environment": "words"}])
    with pytest.raises(ValueError, match=r"environment='chess'.*expected one of \['math', 'words'\]"):
        environments.check_rows([{"environment": "math"}, {"environment": "chess"}])
    with pytest.raises(ValueError, match="environment='chess'"):
        environments.check_rows(datasets.Dataset.from_list([{"prompt": "p", "environment": "chess"}]))
    with pytest.raises(ValueError, match="environment=None"):
        environments.check_rows([{"prompt": "no environment column"}])


def test_a_single_class_gets_the_whole_row_and_routes_itself() -> None:
    class Router:
        """One class for two tasks: reset routes on a column, every tool is shown, a wrong one raises."""

        def reset(self, task: str, **kwargs: Any) -> None:
            self.task = task

        def add(self, a: int, b: int) -> int:
            """Add two numbers.

            Args:
                a: The first.
                b: The second.
            """
            if self.task != "math":
                raise ValueError(f"add is a math tool; this is a {self.task} task")
            return a + b

        def spell(self, word: str) -> str:
            """Spell a word.

            Args:
                word: The word.
            """
            if self.task != "words":
                raise ValueError(f"spell is a words tool; this is a {self.task} task")
            return "-".join(word)

    environments = Environments(Router)
    rollout = environments.start({"prompt": "spell cat", "task": "words", "environment": "kept"})
    assert [s["function"]["name"] for s in rollout.toolbox.schemas] == ["add", "spell"]
    assert rollout.toolbox.call(_call("spell", '{"word": "cat"}')).message["content"] == "c-a-t"
    wrong = rollout.toolbox.call(_call("add", '{"a": 1, "b": 2}'))
    assert wrong.failed and not wrong.unknown and "this is a words task" in wrong.message["content"]


def _args(tmp_path: Path) -> HarnessGRPOConfig:
    return HarnessGRPOConfig(output_dir=str(tmp_path), num_generations=2, report_to=[], save_strategy="no")


def test_the_trainer_refuses_a_bad_environment_before_loading_anything(tmp_path: Path) -> None:
    rows = [{"prompt": "shout hello"}]
    with pytest.raises(ValueError, match=r"NoDocstring\.shout"):
        HarnessAsyncGRPOTrainer(
            "tiny",
            args=_args(tmp_path),
            train_dataset=rows,
            reward_funcs=lambda **kw: [],
            environment_factory=NoDocstring,
        )
    with pytest.raises(ValueError, match="environment='chess'"):
        HarnessAsyncGRPOTrainer(
            "tiny",
            args=_args(tmp_path),
            train_dataset=[{"prompt": "x", "environment": "chess"}],
            reward_funcs=lambda **kw: [],
            environment_factory={"math": Calculator},
        )
    with pytest.raises(ValueError, match="No reward source provided"):
        HarnessAsyncGRPOTrainer("tiny", args=_args(tmp_path), train_dataset=rows, environment_factory=Counter)
    with pytest.raises(ValueError, match="pass one"):
        HarnessAsyncGRPOTrainer("tiny", lambda **kw: None, _args(tmp_path), rows, environment_factory=Counter)
    with pytest.raises(TypeError, match=r"needs harness_session_factory .* environment_factory= .* or rollout_func="):
        HarnessAsyncGRPOTrainer("tiny", args=_args(tmp_path), train_dataset=rows)
    with pytest.raises(TypeError, match=r"pass args=\.\.\., train_dataset=\.\.\. by keyword"):
        HarnessAsyncGRPOTrainer("tiny", _args(tmp_path), rows)  # type: ignore[arg-type]
