"""What the ``examples/grpo_<name>`` recipes share: their flags, their environment servers, the CPU model.

A recipe is a ``Recipe``: its environment classes (``environment_factory``, one class or a dict keyed by
the rows' ``environment`` column), its dataset, its reward functions, the random moves of the CPU
default's format SFT, and its settings. ``main(recipe)`` runs it::

    python examples/grpo_catch/grpo_catch.py                    # CPU: the tiny model, a local env server
    python examples/grpo_catch/grpo_catch.py --model Qwen/Qwen3-0.6B --env-url http://127.0.0.1:8001 \\
        --vllm_server_base_url http://127.0.0.1:8000 --output_dir runs/catch-qwen

- ``--env-url URL`` (or ``NAME=URL`` per server in a multi-environment recipe) uses a running OpenEnv
  server; without it the recipe starts our offline one (``python -m harness_grpo.envs NAME``) on
  loopback and stops it at the end. The tool classes read the URL from their variable
  (``CATCH_ENV_URL`` ...), which is set here.
- ``--model tiny`` (the default) is the warm-started tiny model after a short format SFT on this
  recipe's tools (``harness_grpo.tiny_model.tool_sft``: random moves, so it calls the tools right but
  plays at random; GRPO learns the rest), with ``Recipe.tiny`` settings; any other value is a Hub id
  or path, trained as it is.
- Every ``HarnessGRPOConfig`` field is a flag (``--max_steps``, ``--learning_rate``, ``--report_to`` ...).

At the end it prints the mean reward of the first and the last ``--window`` steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.envs.serving import LocalEnvServer
from harness_grpo.envs.tool_env import EpisodeToolEnv
from harness_grpo.tiny_model.tool_sft import TOOL_SFT_RECIPE, Moves, random_episodes, tool_format_model
from harness_grpo.trainer import HarnessAsyncGRPOTrainer

TINY = "tiny"

COMMON = {
    "learning_rate": 1e-6,
    "num_generations": 8,
    "groups_per_step": 2,
    "temperature": 1.0,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "chat_template_kwargs": {"enable_thinking": False},
}
"""Every recipe's settings unless it or a flag says otherwise (real-model values; ``Recipe.tiny`` for CPU)."""
TINY_COMMON = {"chat_template_kwargs": {}}
"""The tiny model's: it has no thinking mode, and its format SFT renders chats as the tool loop then will."""


@dataclass
class Recipe:
    """One recipe; see the module docstring.

    ``dataset(size)`` returns ``size`` rows (a ``prompt`` and the columns ``reset`` and the reward functions
    read). ``moves`` and ``sft_turns`` drive the format SFT of ``--model tiny``. ``settings`` override
    ``COMMON`` for every model, ``tiny`` for the tiny model only.
    """

    name: str
    environment_factory: type[EpisodeToolEnv] | Mapping[str, type[EpisodeToolEnv]]
    dataset: Callable[[int], list[dict[str, Any]]]
    reward_funcs: Sequence[Callable[..., list[float | None]]]
    moves: Moves
    sft_turns: int
    dataset_size: int = 256
    settings: Mapping[str, Any] = field(default_factory=dict)
    tiny: Mapping[str, Any] = field(default_factory=dict)

    @property
    def environment_classes(self) -> list[type[EpisodeToolEnv]]:
        factory = self.environment_factory
        return list(factory.values()) if isinstance(factory, Mapping) else [factory]


@dataclass
class RecipeArguments:
    """The recipe's own flags (the trainer's are ``HarnessGRPOConfig``'s)."""

    model: str = field(
        default=TINY,
        metadata={"help": "Hub id or path of the policy; tiny: the warm tiny model after a format SFT on these tools."},
    )
    env_url: list[str] = field(
        default_factory=list,
        metadata={"help": "A running env server: URL, or NAME=URL per server; default: start ours on loopback."},
    )
    dataset_size: int | None = field(default=None, metadata={"help": "Rows in the training dataset."})
    sft_episodes: int = field(default=128, metadata={"help": "Random episodes the tiny model's format SFT trains on."})
    sft_steps: int = field(default=TOOL_SFT_RECIPE["steps"], metadata={"help": "Steps of the tiny model's format SFT."})
    window: int = field(default=5, metadata={"help": "Steps averaged for the first/last reward summary."})


def parse(recipe: Recipe, argv: Sequence[str] | None = None) -> tuple[RecipeArguments, HarnessGRPOConfig]:
    """Flags over ``recipe.tiny`` (for ``--model tiny``) over ``recipe.settings`` over ``COMMON``."""
    parser = HfArgumentParser((RecipeArguments, HarnessGRPOConfig))
    parser.set_defaults(output_dir=os.path.join("runs", recipe.name), **COMMON, **recipe.settings)
    known, _ = parser.parse_known_args(args=argv)
    if known.model == TINY:
        parser.set_defaults(**TINY_COMMON, **recipe.tiny)
    recipe_args, config = parser.parse_args_into_dataclasses(args=argv)
    return recipe_args, config


def server_urls(recipe: Recipe, given: Sequence[str]) -> dict[str, str | None]:
    """Server name -> the URL ``--env-url`` gives it (None: start one); ``ValueError`` on a name it does not use."""
    names = [cls.server_name for cls in recipe.environment_classes]
    urls: dict[str, str | None] = dict.fromkeys(names)
    for item in given:
        name, separator, url = item.partition("=")
        if not separator or "://" in name:
            if len(urls) > 1:
                raise ValueError(f"--env-url {item}: this recipe uses {', '.join(names)}; write NAME=URL")
            name, url = names[0], item
        if name not in urls:
            raise ValueError(f"--env-url {item}: this recipe uses {', '.join(names)}, not {name!r}")
        urls[name] = url
    return urls


@contextlib.contextmanager
def environment_servers(recipe: Recipe, given: Sequence[str], capacity: int) -> Iterator[dict[str, str]]:
    """Each server's URL, in its tool class's variable, starting the ones not given (stopped on exit)."""
    variables = {cls.server_name: cls.url_variable for cls in recipe.environment_classes}
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, url in server_urls(recipe, given).items():
            if url is None:
                url = stack.enter_context(LocalEnvServer(name, max_concurrent_envs=capacity)).url
                print(f"{name} environment server: {url}", flush=True)
            urls[name] = os.environ[variables[name]] = url
        yield urls


def tiny_policy(recipe: Recipe, episodes: int, steps: int, seed: int) -> str:
    """The warm tiny model after ``steps`` of format SFT on ``episodes`` random episodes of this recipe (cached)."""
    from harness_grpo.tiny_model.warm_start import warm_tiny_model_path

    rows = recipe.dataset(64)
    chats = random_episodes(
        recipe.environment_factory, rows, recipe.moves, episodes=episodes, max_turns=recipe.sft_turns, seed=seed
    )
    return str(tool_format_model(warm_tiny_model_path(), chats, {**TOOL_SFT_RECIPE, "steps": steps}))


def main(recipe: Recipe, argv: Sequence[str] | None = None) -> int:
    """Run ``recipe`` with the command line's settings (module docstring); writes ``output_dir/log_history.json``."""
    recipe_args, config = parse(recipe, argv)
    try:
        server_urls(recipe, recipe_args.env_url)
    except ValueError as error:
        print(f"cannot run {recipe.name}: {error}", file=sys.stderr)
        return 2
    with environment_servers(recipe, recipe_args.env_url, capacity=max(64, 2 * config.max_concurrent_rollouts)):
        model = recipe_args.model
        if model == TINY:
            model = tiny_policy(recipe, recipe_args.sft_episodes, recipe_args.sft_steps, config.seed)
        trainer = HarnessAsyncGRPOTrainer(
            model,
            args=config,
            train_dataset=recipe.dataset(recipe_args.dataset_size or recipe.dataset_size),
            reward_funcs=list(recipe.reward_funcs),
            environment_factory=recipe.environment_factory,
        )
        trainer.train()
    if not trainer.is_main:
        return 0
    history = trainer.state.log_history
    Path(config.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(config.output_dir) / "log_history.json").write_text(json.dumps(history, indent=1))
    curve = [entry["reward"] for entry in history if "reward" in entry]
    if curve:
        window = min(recipe_args.window, len(curve))
        first, last = statistics.mean(curve[:window]), statistics.mean(curve[-window:])
        print(f"reward: first {window} steps {first:.3f} -> last {window} steps {last:.3f}")
    return 0
