"""The trainer's capture proxy listens where ``proxy_host``/``proxy_port`` say, so a tunnel can be set up for it."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.services import TrainerServices
from harness_grpo.tiny_model import tiny_model_path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_trainers_proxy_listens_on_the_configured_port(tmp_path: Path) -> None:
    port = _free_port()
    args = HarnessGRPOConfig(
        output_dir=str(tmp_path), proxy_host="127.0.0.1", proxy_port=port, report_to=[], num_generations=2
    )
    services = TrainerServices.start(
        args, model_path=str(tiny_model_path()), is_main=True, needs_proxy=True, policy_version=0
    )
    try:
        assert services.proxy_endpoint is not None
        assert services.proxy_endpoint.base_url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as reply:
            assert reply.status == 200
    finally:
        services.stop()
