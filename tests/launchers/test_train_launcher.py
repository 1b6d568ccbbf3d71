"""``launchers/train.py``, the main job, as a user runs it: a process on the embedded CPU default.

- A run killed with SIGKILL mid-step resumes from its last checkpoint (``--resume``) and
  finishes: every step is logged once, the dataset position and policy version carry over.
- ``--report_to tensorboard`` writes the trainer's metrics (the names users know) as scalars.
- ``--config file.yaml`` sets any flag, and flags override it; a bad file is a usage error.
- Under ``torchrun`` with two ranks (DDP over gloo on CPU), rank 0 alone runs the services and
  prints, both ranks train and checkpoint, and the run finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness_grpo.checkpoints import TRAINER_STATE
from tests.launchers.runs import wait_for_launcher

REPO = Path(__file__).resolve().parents[2]
SMALL_RUN = [
    "--num_generations", "4",
    "--groups_per_step", "1",
    "--max_concurrent_rollouts", "4",
    "--disable_tqdm", "true",
]  # fmt: skip


def _launch(output_dir: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, str(REPO / "launchers" / "train.py"), "--output_dir", str(output_dir), *SMALL_RUN, *extra]
    log = (output_dir.parent / f"{output_dir.name}-{time.monotonic_ns()}.log").open("w")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, text=True)


def _log_path(output_dir: Path) -> Path:
    return max(output_dir.parent.glob(f"{output_dir.name}-*.log"), key=lambda p: p.stat().st_mtime)


@pytest.mark.timeout(900)
def test_sigkilled_run_resumes_from_its_last_checkpoint_and_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    first = _launch(out, "--max_steps", "5", "--save_steps", "2", "--save_total_limit", "5")
    checkpoint = out / "checkpoint-2" / TRAINER_STATE
    deadline = time.monotonic() + 600
    while not checkpoint.exists():
        assert first.poll() is None, (
            f"train.py exited before its first checkpoint:\n{_log_path(out).read_text()[-4000:]}"
        )
        assert time.monotonic() < deadline, "no checkpoint-2 within 600s"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # mid-run: step 3 is in flight
    assert first.wait(30) == -signal.SIGKILL
    assert not (out / "checkpoint-4").exists()
    saved = json.loads(checkpoint.read_text())
    assert saved["global_step"] == 2 and saved["policy_version"] == 2 and saved["dataset_position"] >= 2

    second = _launch(out, "--max_steps", "5", "--save_steps", "2", "--save_total_limit", "5", "--resume", "true")
    text = wait_for_launcher(second, _log_path(out), 600)
    assert second.returncode == 0, text[-4000:]
    assert f"resumed from {out / 'checkpoint-2'} at step 2" in text, text[-4000:]
    assert "done at step 5" in text, text[-4000:]
    final = json.loads((out / "checkpoint-5" / TRAINER_STATE).read_text())
    assert final["global_step"] == 5
    assert [entry["step"] for entry in final["log_history"]] == [1, 2, 3, 4, 5]
    assert final["log_history"][:2] == saved["log_history"]
    # The resume pushes the checkpoint's weights to the fresh engine (one sync), then one per step.
    assert final["policy_version"] == saved["policy_version"] + 1 + 3
    assert final["dataset_position"] > saved["dataset_position"]
    assert (out / "checkpoint-5" / "model.safetensors").exists()


@pytest.mark.timeout(600)
def test_report_to_tensorboard_writes_the_trainer_metrics_and_log_completions_prints_episodes(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    out.mkdir()
    run = _launch(
        out, "--max_steps", "2", "--save_strategy", "no", "--report_to", "tensorboard", "--log_completions", "true"
    )
    text = wait_for_launcher(run, _log_path(out), 500)
    assert run.returncode == 0, text[-4000:]
    assert "─ step 1 g" in text and "─ step 2 g" in text and "[assistant]" in text, text[-4000:]  # whole episodes
    events = list(out.glob("runs/*/events.out.tfevents.*"))
    assert events, f"no tensorboard event file under {out}/runs"
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    for name in (
        "train/reward",
        "train/reward_std",
        "train/rewards/harness_reward/mean",
        "train/rollout/correctness_mean",  # the launcher shapes the reward (examples/rewards.py)
        "train/rollout/timed_out_frac",
        "train/rollout/unscorable_frac",
        "train/staleness/mean",
        "train/learning_rate",
        "train/policy_version",
    ):
        assert name in tags, f"{name} not among {sorted(tags)}"
    assert [event.step for event in accumulator.Scalars("train/reward")] == [1, 2]
    assert [event.step for event in accumulator.Tensors("completions/text_summary")] == [1, 2]  # the episodes table


@pytest.mark.timeout(600)
def test_two_ranks_under_torchrun_train_and_checkpoint_together(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    log = tmp_path / "torchrun.log"
    argv = [
        str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
        str(REPO / "launchers" / "train.py"), "--output_dir", str(out), *SMALL_RUN,
        "--max_steps", "3", "--save_steps", "3",
    ]  # fmt: skip
    with log.open("w") as sink:
        run = subprocess.Popen(argv, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    text = wait_for_launcher(run, log, 500)
    assert run.returncode == 0, text[-4000:]
    for step in (1, 2, 3):
        assert text.count(f"step {step}/3 ") == 1, f"step {step} not printed once (by rank 0 alone):\n{text[-4000:]}"
    assert text.count("done at step 3") == 1, text[-4000:]
    state = out / "checkpoint-3" / "accelerate_state"
    assert (state / "random_states_0.pkl").exists() and (state / "random_states_1.pkl").exists()
    final = json.loads((out / "checkpoint-3" / TRAINER_STATE).read_text())
    assert final["global_step"] == 3 and final["policy_version"] == 3


def _launcher_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_launcher", REPO / "launchers" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_config_file_sets_any_setting_and_flags_override_it(tmp_path: Path) -> None:
    launcher = _launcher_module()
    config = tmp_path / "run.yaml"
    config.write_text("harness: opencode\nlearning_rate: 0.01\nnum_generations: 4\nmax_concurrent_rollouts: 4\n")
    launch, args = launcher.parse(["--config", str(config), "--num_generations", "2"])
    assert launch.harness == "opencode"
    assert args.learning_rate == 0.01  # from the file
    assert args.num_generations == 2  # the flag wins over the file
    assert args.temperature == launcher.SHELL_CHORE_DEFAULTS["temperature"]  # the file's harness picked its defaults
    assert args.rollout_timeout_s == launcher.CLI_DEFAULTS["rollout_timeout_s"]
    assert args.output_dir.endswith("train-opencode")


def test_the_clis_on_the_embedded_engine_train_their_shell_chore_model_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launcher = _launcher_module()
    built = []
    monkeypatch.setattr(
        launcher, "shell_chore_model", lambda instructions, agent: built.append((agent, instructions)) or f"sft-{agent}"
    )
    rows = [{"prompt": [{"role": "user", "content": "Make `a`."}]}, {"prompt": [{"role": "user", "content": "B."}]}]
    for agent in ("mini-swe-agent", "opencode", "codex", "claude-code"):
        _, args = launcher.parse(["--harness", agent, "--difficulty", "easy"])
        assert args.max_model_calls == launcher.SHELL_CHORE_DEFAULTS["max_model_calls"]
        assert launcher.default_cli_model(agent, rows, args) == f"sft-{agent}"
        assert built.pop() == (agent, ["Make `a`.", "B."])
    _, args = launcher.parse(["--harness", "terminus-2"])
    assert launcher.default_cli_model("terminus-2", rows, args) == "tiny-warm"
    _, remote = launcher.parse(["--harness", "mini-swe-agent", "--vllm_server_base_url", "http://127.0.0.1:1"])
    assert launcher.default_cli_model("mini-swe-agent", rows, remote) == "tiny-warm"  # what such an engine serves
    with pytest.raises(SystemExit):
        launcher.parse(["--difficulty", "easy"])  # tool-agent has no Harbor tasks
    assert "--difficulty selects Harbor tasks" in capsys.readouterr().err


def test_the_prebuilt_shell_chore_models_are_the_ones_the_launcher_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m harness_grpo.tiny_model --shell-chores`` (the test command's set-up) asks for the very SFT
    models ``--harness CLI --difficulty easy`` serves: same CLIs, same instructions, so neither a run nor a timed
    test builds one."""
    from harness_grpo.harbor_tasks import load_task_dataset
    from harness_grpo.tiny_model import __main__ as tiny_model_cli
    from harness_grpo.tiny_model import shell_sft

    launcher = _launcher_module()
    asked: dict[str, list[tuple[str, list[str]]]] = {"set-up": [], "launcher": []}
    monkeypatch.setattr(
        shell_sft, "shell_chore_model", lambda instructions, agent: asked["set-up"].append((agent, instructions))
    )
    monkeypatch.setattr(
        launcher, "shell_chore_model", lambda instructions, agent: asked["launcher"].append((agent, instructions))
    )
    tiny_model_cli.shell_chore_models()
    for agent in shell_sft.SHELL_CHORE_AGENTS:
        launch, args = launcher.parse(["--harness", agent, "--difficulty", "easy"])
        launcher.default_cli_model(agent, load_task_dataset(launcher.TASKS, difficulty=launch.difficulty), args)
    assert len(asked["set-up"]) == 4 and asked["set-up"] == asked["launcher"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: 0.01\nlearnin_rate: 2\n", "unknown settings learnin_rate"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("a: [1,\n", "--config"),
    ],
)
def test_config_file_errors_name_the_file_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    launcher = _launcher_module()
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        launcher.parse(["--config", str(config)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and str(config) in err, err


def test_an_engine_that_is_not_token_exact_stops_the_launcher_with_what_to_do(tmp_path: Path) -> None:
    """An OpenAI-compatible server without token ids (or with raw logprobs) can't be trained on: exit 2, why."""
    from aiohttp import web

    from harness_grpo.service_loop import ServiceLoop

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]})

    async def chat(request: web.Request) -> web.Response:
        message = {"role": "assistant", "content": "hi"}
        return web.json_response({"id": "c", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        ]})  # fmt: skip

    async def start() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    loop = ServiceLoop("text-only-engine")
    runner, port = loop.run(start())
    try:
        out = tmp_path / "run"
        out.mkdir()
        run = _launch(out, "--max_steps", "1", "--vllm_server_base_url", f"http://127.0.0.1:{port}")
        text = wait_for_launcher(run, _log_path(out), 300)
    finally:
        loop.run(runner.cleanup())
        loop.close()
    assert run.returncode == 2, text[-4000:]
    assert "cannot start: the engine at" in text and "capture tier is 'text'" in text, text[-4000:]
    assert "--logprobs-mode processed_logprobs" in text, text[-4000:]
