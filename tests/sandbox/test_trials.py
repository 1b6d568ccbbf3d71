"""Real Harbor trials through ``LocalEnvironment``: the oracle scores 1, nop scores 0."""

from __future__ import annotations

import asyncio

from tests.sandbox.conftest import make_task, run_trial


def test_oracle_scores_one_and_nop_scores_zero(tmp_path):
    task = make_task(tmp_path, "answer", app={"README": "write the answer here\n"})

    async def both():
        return await asyncio.gather(
            run_trial(task, "oracle", tmp_path / "trials-oracle"), run_trial(task, "nop", tmp_path / "trials-nop")
        )

    oracle, nop = asyncio.run(both())
    assert oracle.exception_info is None, oracle.exception_info
    assert oracle.verifier_result.rewards == {"reward": 1}
    assert nop.exception_info is None, nop.exception_info
    assert nop.verifier_result.rewards == {"reward": 0}
