"""The trainer drives a capture proxy running in its own process (``proxy_base_url``), as on separate machines.

The engine and the proxy are started alone (``python -m harness_grpo.engine``, ``python -m proxy`` with an admin
key); the trainer gets both by URL and the admin key from ``HARNESS_PROXY_ADMIN_KEY``, opens every rollout's
session on that proxy, trains on what it captured and pushes its weights to the engine. A wrong or missing key,
or no engine URL, stops the run before any rollout, naming what to fix.
"""

from __future__ import annotations

import functools
import re
import sys
import urllib.request
from pathlib import Path

import pytest

from examples import submit_task
from harness_grpo import HarnessAsyncGRPOTrainer, HarnessGRPOConfig
from harness_grpo.agent_sessions import LocalAgentSessionFactory
from harness_grpo.services import PROXY_ADMIN_KEY_ENV, ServicesError
from tests.support.processes import ReadyProcess, start_engine

ADMIN_KEY = "external-proxy-test-admin-key"


def _captured_tokens(proxy_url: str) -> float:
    with urllib.request.urlopen(f"{proxy_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return float(re.search(r"^proxy_captured_completion_tokens_total (\S+)$", text, re.M).group(1))


def _trainer(tmp_path: Path, engine_url: str | None, proxy_url: str, name: str) -> HarnessAsyncGRPOTrainer:
    factory = functools.partial(
        LocalAgentSessionFactory,
        command=submit_task.agent_command(),
        verifier=submit_task.verifier,
        setup=submit_task.setup,
    )
    args = HarnessGRPOConfig(
        output_dir=str(tmp_path / name),
        proxy_base_url=proxy_url,
        vllm_server_base_url=engine_url,
        num_generations=2,
        max_steps=1,
        learning_rate=1e-4,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    return HarnessAsyncGRPOTrainer(str(submit_task.task_model_path()), factory, args, submit_task.dataset())


@pytest.mark.timeout(600)
def test_the_trainer_trains_through_a_proxy_in_another_process(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(PROXY_ADMIN_KEY_ENV, ADMIN_KEY)
    with (
        start_engine("--model", str(submit_task.task_model_path())) as engine,
        ReadyProcess(
            [sys.executable, "-m", "proxy", "--engine-url", engine.url, "--journal-dir", str(tmp_path / "journal"),
             "--port", "0"],
            r"proxy listening on (http://\S+)",
        ) as proxy,
    ):  # fmt: skip
        proxy_url = proxy.match.group(1)
        trainer = _trainer(tmp_path, engine.url, proxy_url, "run")
        trainer.train()
        assert trainer.services is not None and trainer.services.proxy is None  # none of its own
        assert [entry["step"] for entry in trainer.state.log_history] == [1]
        entry = trainer.state.log_history[0]
        assert entry["rollout/errors"] == 0 and entry["rollout/unscorable_frac"] == 0, entry
        assert _captured_tokens(proxy_url) > 0  # the rollouts' calls went through that proxy
        with urllib.request.urlopen(f"{engine.url}/health", timeout=30) as response:
            assert b'"weight_version":1' in response.read().replace(b" ", b"")

        monkeypatch.setenv(PROXY_ADMIN_KEY_ENV, "not-the-key")
        with pytest.raises(ServicesError, match=f"refused {PROXY_ADMIN_KEY_ENV}"):
            _trainer(tmp_path, engine.url, proxy_url, "wrong-key").train()
        monkeypatch.delenv(PROXY_ADMIN_KEY_ENV)
        with pytest.raises(ServicesError, match=f"set {PROXY_ADMIN_KEY_ENV}"):
            _trainer(tmp_path, engine.url, proxy_url, "no-key").train()
        monkeypatch.setenv(PROXY_ADMIN_KEY_ENV, ADMIN_KEY)
        with pytest.raises(ServicesError, match="needs vllm_server_base_url"):
            _trainer(tmp_path, None, proxy_url, "no-engine").train()
