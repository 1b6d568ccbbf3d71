"""Data-parallel training: two gloo ranks on CPU take the step one process would take.

The trainer runs under accelerate as it does with ``accelerate launch``/``torchrun`` (here DDP,
since accelerate's FSDP2 needs GPUs; the FSDP2 gather is tested in ``test_weight_sync``). Each
rank builds the real ``HarnessAsyncGRPOTrainer`` on the tiny model and calls its optimizer step on
the same rows. Checked against one process on the same rows: the summed loss, the gradient norm
(which a missing world-size factor would halve), the trained tokens; ranks end with identical
weights, equal to the one-process weights; and a step whose rows all land on one rank (the other
runs only zero-loss filler micro-batches) finishes instead of hanging in a collective.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from harness_grpo.distributed import shard_rows
from tests.support.rows import scored_rows

STEPS = (
    ("one row", [(40, 1.0)]),
    ("five rows", [(300, 1.0), (120, -1.0), (90, 0.5), (60, -0.5), (200, 1.5)]),
)


def _worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from examples.white_box_submit import SubmitTaskSessionFactory
    from harness_grpo.config import HarnessGRPOConfig
    from harness_grpo.trainer import HarnessAsyncGRPOTrainer

    torch.set_num_threads(1)
    args = HarnessGRPOConfig(
        output_dir=str(Path(out_dir) / "run"),
        max_steps=len(STEPS),
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        num_generations=2,
        max_tokens_per_microbatch=320,  # several micro-batches per rank in the second step
        report_to=[],
        use_cpu=True,
    )
    trainer = HarnessAsyncGRPOTrainer(model_dir, SubmitTaskSessionFactory, args, [{"prompt": "unused"}])
    assert trainer.accelerator.num_processes == world
    vocab = trainer.tokenizer.vocab_size
    results: dict[str, Any] = {"steps": []}
    for _, spec in STEPS:
        metrics = trainer._optimize(scored_rows(spec, seed=len(spec), vocab=vocab))
        results["steps"].append({k: metrics[k] for k in ("loss", "grad_norm", "trained_tokens", "num_tokens")})
    model = trainer.accelerator.unwrap_model(trainer.model)
    results["params"] = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save(results, Path(out_dir) / f"rank{rank}-of-{world}.pt")
    trainer.accelerator.wait_for_everyone()
    if world > 1:
        torch.distributed.destroy_process_group()
    os._exit(0)  # skip gloo's finalization abort (pytorch/pytorch#179291); the results are on disk


def _run(world: int, model_dir: Path, out_dir: Path) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = mp.start_processes(
        _worker, args=(world, port, str(model_dir), str(out_dir)), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 240
    while not procs.join(timeout=1):
        if time.monotonic() > deadline:
            for process in procs.processes:
                process.kill()
            pytest.fail(f"{world} rank(s) did not finish in 240s")
    return [torch.load(out_dir / f"rank{r}-of-{world}.pt") for r in range(world)]


def test_shard_rows_balances_tokens_and_places_each_row_once() -> None:
    rows = scored_rows([(n, 1.0) for n in (300, 120, 90, 60, 200, 10)], seed=6, vocab=100)
    shares = [shard_rows(rows, rank, 2) for rank in range(2)]
    assert sorted(r.rollout_id for share in shares for r in share) == sorted(r.rollout_id for r in rows)
    assert [sum(len(r) for r in share) for share in shares] == [390, 390]
    assert shard_rows(rows, 0, 1) == rows


@pytest.mark.timeout(600)
def test_two_ranks_take_the_one_process_step(tmp_path: Path) -> None:
    from harness_grpo.tiny_model import tiny_model_path

    model_dir = tiny_model_path()
    (one,) = _run(1, model_dir, tmp_path)
    zero, first = _run(2, model_dir, tmp_path)
    for step, ((name, _), single, r0, r1) in enumerate(
        zip(STEPS, one["steps"], zero["steps"], first["steps"], strict=True)
    ):
        assert r0 == r1, f"step {step} ({name}): ranks disagree on the merged metrics"
        assert r0["trained_tokens"] == single["trained_tokens"] and r0["num_tokens"] == single["num_tokens"]
        assert r0["loss"] == pytest.approx(single["loss"], rel=1e-5, abs=1e-7), name
        assert r0["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4), name
    for name, p in zero["params"].items():
        assert torch.equal(p, first["params"][name]), f"{name} differs between the ranks"
        # Two AdamW steps move a weight by at most ~2 * lr; reduction order changes only the last bits.
        assert torch.allclose(p, one["params"][name], atol=2e-5), f"{name} differs from the one-process run"
