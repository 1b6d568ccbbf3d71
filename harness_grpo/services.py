"""The services a training run needs beside its step loop: engine, capture proxy, weight sync.

``TrainerServices.start(...)`` on rank 0 starts, on one ``ServiceLoop``:

- the engine: the embedded CPU engine and its HTTP server in-process, unless the config names an
  engine URL (``vllm_server_base_url``: a vLLM server, or our engine in another process);
- the capture proxy, only when the session factory runs its sessions against the trainer's own
  proxy (a ``TrainerBoundSessionFactory``), on ``proxy_host:proxy_port`` (the trainer reaches a wildcard
  bind on 127.0.0.1), or, with ``proxy_base_url``, a proxy running elsewhere (``external_proxy``: its
  admin key from ``HARNESS_PROXY_ADMIN_KEY``); a third-party factory brings its own rollout side;
- the weight sync, unless one was injected: ``weight_sync_for`` (in-process to the embedded
  engine; with a URL, NCCL to vLLM or HTTP to our engine, as the engine's ``/v1/models`` says).

Other ranks start only their side of the weight sync. ``stop()`` stops whatever was started, also
after a failed start, and never leaves a thread or a server behind.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness_grpo.config import HarnessGRPOConfig
from harness_grpo.engine.embedded import TINY, TINY_WARM, EmbeddedEngine, resolve_model
from harness_grpo.engine.server import EngineServer
from harness_grpo.rollout_context import PROXY_ADMIN_KEY_ENV as PROXY_ADMIN_KEY_ENV
from harness_grpo.rollout_context import EngineNotTokenExact, ProxyEndpoint, ServicesError, connect_proxy
from harness_grpo.service_loop import ServiceLoop
from harness_grpo.weight_transports import WeightSync, weight_sync_for
from proxy.server import CaptureProxy, ProxyConfig


class EngineUnreachable(ServicesError):
    """The engine at ``vllm_server_base_url`` does not answer."""


@dataclass
class TrainerServices:
    """What ``start`` started (None: not started here); see the module docstring."""

    loop: ServiceLoop | None = None
    engine: EmbeddedEngine | None = None
    engine_server: EngineServer | None = None
    engine_url: str | None = None
    proxy: CaptureProxy | None = None
    proxy_endpoint: ProxyEndpoint | None = None
    weight_sync: WeightSync | None = None

    @classmethod
    def start(
        cls,
        args: HarnessGRPOConfig,
        *,
        model_path: str | None,
        is_main: bool,
        needs_proxy: bool,
        policy_version: int,
        weight_sync: WeightSync | None = None,
    ) -> TrainerServices:
        """Start the run's services (stopping what started if one fails)."""
        services = cls(weight_sync=weight_sync)
        try:
            services._start(args, model_path, is_main, needs_proxy, policy_version)
        except BaseException:
            services.stop()
            raise
        return services

    def _start(
        self, args: HarnessGRPOConfig, model_path: str | None, is_main: bool, needs_proxy: bool, version: int
    ) -> None:
        url, timeout_s = args.vllm_server_base_url, args.weight_sync_timeout_s
        if self.weight_sync is None and (url is not None or not is_main):  # a collective with a URL: every rank
            self.weight_sync = weight_sync_for(url, timeout_s=timeout_s, initial_version=version, is_main=is_main)
        if not is_main:
            return
        self.loop = ServiceLoop()
        if url is None:
            engine_model = args.engine_model or model_path
            if engine_model in (TINY, TINY_WARM):
                engine_model = resolve_model(engine_model)[0]
            self.engine = EmbeddedEngine(
                engine_model,
                num_threads=args.engine_num_threads,
                enable_prefix_caching=args.engine_enable_prefix_caching,
            ).start()
            self.engine_server = EngineServer(self.engine)
            url = self.loop.run(self.engine_server.start())
            if self.weight_sync is None:
                self.weight_sync = weight_sync_for(
                    None, engine=self.engine, timeout_s=timeout_s, initial_version=version, is_main=True
                )
        self.engine_url = url
        if needs_proxy and args.proxy_base_url is not None:
            self.proxy_endpoint = external_proxy(args)
        elif needs_proxy:
            journal = Path(args.output_dir) / "proxy_journal"
            shutil.rmtree(journal, ignore_errors=True)  # an earlier run's sessions: their rollouts were discarded
            config = ProxyConfig(engine_url=url, journal_dir=journal, host=args.proxy_host, port=args.proxy_port)
            self.proxy = CaptureProxy(config)
            port = self.loop.run(self.proxy.start())
            host = "127.0.0.1" if args.proxy_host in ("0.0.0.0", "::", "") else args.proxy_host
            self.proxy_endpoint = ProxyEndpoint(f"http://{host}:{port}", self.proxy.admin_key)
            tier = self.loop.run(self.proxy.engine_tier())
            if not tier.trainable:
                raise EngineNotTokenExact(
                    f"the engine at {url} cannot be trained on: its capture tier is '{tier.tier}' ({tier.detail}). "
                    "Training needs the prompt and sampled token ids and post-temperature logprobs of every call: "
                    "serve vLLM with --logprobs-mode processed_logprobs (it returns token ids on request), "
                    "or leave vllm_server_base_url unset for the embedded engine"
                )

    def engine_weight_version(self) -> int | None:
        """The weight version an external engine reports on ``GET /health`` (the embedded engine's server
        does; vLLM does not: None). None for an engine this run started, or on ranks other than 0."""
        if self.engine is not None or self.engine_url is None:
            return None
        try:
            with urllib.request.urlopen(f"{self.engine_url.rstrip('/')}/health", timeout=30) as response:
                body = response.read()
        except urllib.error.HTTPError:  # it answers, but not with our engine's health
            return None
        except OSError as exc:
            raise EngineUnreachable(f"the engine at {self.engine_url} does not answer GET /health: {exc}") from None
        try:
            version = json.loads(body).get("weight_version") if body else None
        except (ValueError, AttributeError):
            return None
        return version if isinstance(version, int) else None

    def stop(self) -> None:
        """Stop whatever was started, also after a partial start."""
        try:
            if self.loop is not None:
                if self.proxy is not None:
                    self.loop.run(self.proxy.stop(), 30)
                if self.engine_server is not None:
                    self.loop.run(self.engine_server.stop(), 30)
        finally:
            if self.engine is not None:
                self.engine.stop()
            if self.weight_sync is not None:
                self.weight_sync.close()
            if self.loop is not None:
                self.loop.close()
            self.loop = None


def external_proxy(args: HarnessGRPOConfig) -> ProxyEndpoint:
    """The running proxy at ``args.proxy_base_url`` (``connect_proxy``), which needs ``vllm_server_base_url``."""
    url = str(args.proxy_base_url).rstrip("/")
    if args.vllm_server_base_url is None:
        raise ServicesError(
            f"proxy_base_url={url} needs vllm_server_base_url: the engine that proxy forwards to, which the trainer "
            "pushes its weights to (an in-process engine would be one the proxy cannot reach)"
        )
    return connect_proxy(url, sampling=dict(args.sampling_policy()), name="proxy_base_url", probe="trainer start")
