"""``log_completions``: whole episodes printed with rich, saved as parquet and sent to tensorboard, on real steps.

A ``rollout_func`` sends the tiny model (real proxy, real embedded engine) an episode that already holds
an assistant tool call and its tool result, so every captured episode has a tool call, a tool result
and a sampled reply; the printed panels and the tensorboard text summary must show all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas
import pytest

from harness_grpo.completion_log import COLUMNS, markdown_table, render_episode
from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.trainer import HarnessAsyncGRPOTrainer

TOOL_RESULT = "notes.txt: remember to submit"
EPISODE = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Read notes.txt."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
]


def tool_episode(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    (client,) = trainer.rollout_clients
    reply = client.chat(EPISODE, return_token_ids=True)
    ids = reply["choices"][0]["token_ids"]
    return {"env_reward": [sum(t % 2 for t in ids) / max(len(ids), 1)]}


def test_render_episode_shows_turns_tool_calls_and_results() -> None:
    text = render_episode([*EPISODE, {"role": "assistant", "content": "Done | ok"}])
    assert text.split("\n\n") == [
        "[system]\nYou are a careful agent.",
        "[user]\nRead notes.txt.",
        '[assistant]\n-> read_file({"path": "notes.txt"})',
        f"[tool read_file]\n{TOOL_RESULT}",
        "[assistant]\nDone | ok",
    ]
    table = markdown_table(
        [
            {"step": 1, "episode": "a|b\nc", "reward": None}
            | dict.fromkeys(("group", "prompt", "advantage", "env_reward", "turns", "tool_calls", "error"), 0)
        ]
    )
    assert "a\\|b<br>c" in table and table.count("\n") == 2


@pytest.mark.timeout(600)
def test_log_completions_prints_episodes_and_writes_a_tensorboard_table(tmp_path: Path, capsys: Any) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = HarnessGRPOConfig(
        output_dir=str(tmp_path),
        seed=0,
        max_steps=2,
        num_generations=2,
        groups_per_step=2,
        max_completion_length=8,
        rollout_timeout_s=120,
        save_strategy="no",
        report_to=["tensorboard"],
        disable_tqdm=True,
        log_completions=True,
        num_completions_to_print=3,
        advantage_baseline="batch",
    )
    trainer = HarnessAsyncGRPOTrainer(
        "tiny", args=args, train_dataset=[{"prompt": "Read notes.txt."}], rollout_func=tool_episode
    )
    trainer.train()
    out = capsys.readouterr().out
    assert out.count("[tool read_file]") == 2 * 3  # three of the four episodes of each step
    assert out.count('-> read_file({"path": "notes.txt"})') == 6 and out.count(TOOL_RESULT) == 6
    assert out.count("step 1 g") == 3 and out.count("step 2 g") == 3 and "advantage" in out

    events = list(tmp_path.glob("**/events.out.tfevents.*"))
    assert events, f"no tensorboard event file under {tmp_path}"
    accumulator = EventAccumulator(str(events[0].parent), size_guidance={"tensors": 0})
    accumulator.Reload()
    tables = accumulator.Tensors("completions/text_summary")
    assert [event.step for event in tables] == [1, 2]
    for event in tables:
        table = event.tensor_proto.string_val[0].decode()
        assert table.count("[tool read_file]") == 4  # every episode of the step, not only the printed ones
        assert table.count(TOOL_RESULT) == 4 and table.count("[assistant]") >= 8

    for step in (1, 2):  # TRL's parquet file per logged step
        saved = pandas.read_parquet(tmp_path / "completions" / f"completions_{step:05d}.parquet")
        assert list(saved.columns) == list(COLUMNS) and len(saved) == 4 and set(saved["step"]) == {step}
        assert all(TOOL_RESULT in episode for episode in saved["episode"])
        assert saved["reward"].tolist() == pytest.approx(saved["env_reward"].tolist())
        rewards = saved["reward"].tolist()  # the step's baseline, not each group's: (r - step mean) / step std
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        expected = [(r - mean) / (std + 1e-8) if std > 0 else 0.0 for r in rewards]
        assert saved["advantage"].tolist() == pytest.approx(expected)
