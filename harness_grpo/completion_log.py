"""``log_completions``: whole episodes, printed with rich and sent as a table to the ``report_to`` backends.

At every logged step (TRL: every ``logging_steps``) the trainer hands over the step's groups with
their rewards. ``episode_rows`` makes one row per rollout: step, group, task prompt, the whole
episode as text (its final message history: every turn's messages, the assistant's tool calls and
the tool results, then the last reply), reward, advantage (the group's, as trained), the verifier's
``env_reward``, turns, tool calls and why it was unscorable. ``log_episodes`` then

- prints ``num_completions_to_print`` of them (None: all), each a panel with its episode;
- writes the table, as TRL does, to ``output_dir/completions/completions_<step>.parquet`` and sends
  it to wandb and trackio when they are in ``report_to`` (``backend.log({"completions":
  backend.Table(dataframe=table)})``), and to tensorboard as a markdown text summary ``completions``
  at the step, written by transformers' ``TensorBoardCallback``'s own writer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from harness_grpo.advantages import step_advantages

COLUMNS = ("step", "group", "prompt", "episode", "reward", "advantage", "env_reward", "turns", "tool_calls", "error")


def _text(content: Any) -> str:
    """A message's content as text (content parts: their text, other parts by type)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) and "text" in p else f"<{p.get('type', '?')}>" for p in content]
        return "\n".join(str(p) for p in parts)
    return json.dumps(content)


def render_episode(messages: Sequence[dict[str, Any]]) -> str:
    """The messages of an episode as text: one block per message, the assistant's tool calls and tool results
    included (a tool result names its call's tool)."""
    names = {
        call.get("id"): (call.get("function") or {}).get("name", "?")
        for m in messages
        for call in m.get("tool_calls") or []
    }
    blocks = []
    for message in messages:
        role = message.get("role", "?")
        lines = [f"[tool {names.get(message.get('tool_call_id'), '?')}]" if role == "tool" else f"[{role}]"]
        for key in ("reasoning_content", "reasoning"):
            if message.get(key):
                lines.append(f"(reasoning) {_text(message[key])}")
        content = _text(message.get("content"))
        if content:
            lines.append(content)
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            lines.append(f"-> {function.get('name', '?')}({function.get('arguments', '')})")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def episode_rows(
    groups: Sequence[Any],
    rewards: Sequence[Sequence[float | None]],
    *,
    step: int,
    scale_rewards: bool,
    baseline: str = "group",
) -> list[dict[str, Any]]:
    """One row per rollout of ``groups`` (``RolloutGroup``s; ``rewards[i]``: group i's rewards), columns ``COLUMNS``;
    the advantages the trainer used (``step_advantages`` with ``baseline`` and ``scale_rewards``)."""
    rows = []
    advantaged = step_advantages(rewards, baseline=baseline, scale=scale_rewards)
    for group, group_rewards, (advantages, _) in zip(groups, rewards, advantaged, strict=True):
        prompt = group.row.get("prompt")
        for outcome, reward, advantage in zip(group.outcomes, group_rewards, advantages, strict=True):
            rows.append(
                {
                    "step": step,
                    "group": group.group_id,
                    "prompt": _text(prompt) if not isinstance(prompt, list) else render_episode(prompt),
                    "episode": render_episode(outcome.completion),
                    "reward": reward,
                    "advantage": float(advantage),
                    "env_reward": outcome.env_reward,
                    "turns": len(outcome.trace),
                    "tool_calls": outcome.tool_call_count,
                    "error": outcome.error or "",
                }
            )
    return rows


def print_episodes(console: Console, rows: Iterable[dict[str, Any]], limit: int | None) -> None:
    """Each row as a rich panel (step, group, reward, advantage, turns, tool calls; the error), at most ``limit``."""
    for index, row in enumerate(rows):
        if limit is not None and index >= limit:
            break
        title = (
            f"step {row['step']} {row['group']} reward {row['reward']} advantage {row['advantage']:.3f} "
            f"env_reward {row['env_reward']} turns {row['turns']} tool calls {row['tool_calls']}"
        )
        body: list[Any] = [Text(row["episode"] or "(no captured turn)")]
        if row["error"]:
            body.append(Text(f"unscorable: {row['error']}", style="red"))
        console.print(Panel(Group(*body), title=Text(title), title_align="left"))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """``rows`` as a markdown table (newlines as ``<br>``, pipes escaped), for tensorboard's text plugin."""

    def cell(value: Any) -> str:
        return str("" if value is None else value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def report_table(
    rows: Sequence[dict[str, Any]], *, report_to: Sequence[str], callbacks: Iterable[Any], step: int, output_dir: Path
) -> None:
    """Write ``rows`` to ``output_dir/completions/completions_<step>.parquet`` and send them to the ``report_to``
    backends that take a table (see the module docstring)."""
    import pandas as pd

    table = pd.DataFrame(list(rows), columns=list(COLUMNS))
    folder = output_dir / "completions"
    folder.mkdir(parents=True, exist_ok=True)
    table.to_parquet(folder / f"completions_{step:05d}.parquet")
    backends = []
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            backends.append(wandb)
    if "trackio" in report_to:
        import trackio

        backends.append(trackio)
    for backend in backends:
        backend.log({"completions": backend.Table(dataframe=table)})
    if "tensorboard" in report_to:
        from transformers.integrations import TensorBoardCallback

        for callback in callbacks:
            if isinstance(callback, TensorBoardCallback) and callback.tb_writer is not None:
                callback.tb_writer.add_text("completions", markdown_table(rows), step)
                callback.tb_writer.flush()


def log_episodes(
    groups: Sequence[Any],
    rewards: Sequence[Sequence[float | None]],
    *,
    step: int,
    scale_rewards: bool,
    baseline: str = "group",
    console: Console,
    limit: int | None,
    report_to: Sequence[str],
    callbacks: Iterable[Any],
    output_dir: Path,
) -> list[dict[str, Any]]:
    """Print and report the step's episodes (see the module docstring); returns the table's rows."""
    rows = episode_rows(groups, rewards, step=step, scale_rewards=scale_rewards, baseline=baseline)
    print_episodes(console, rows, limit)
    report_table(rows, report_to=report_to, callbacks=callbacks, step=step, output_dir=output_dir)
    return rows
