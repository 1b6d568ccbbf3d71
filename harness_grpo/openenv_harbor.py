"""``python -m harness_grpo.openenv_harbor serve ...``: OpenEnv's ``openenv harbor`` CLI, with ``sandbox="local"``.

    python -m harness_grpo.openenv_harbor serve --dataset examples/tasks --llm-url http://127.0.0.1:8000 \\
        --host 127.0.0.1 --port 8200 --capture-port 8300 --expose direct

Every argument goes to OpenEnv's own CLI (``openenv.cli.commands.harbor``); the one difference is that a rollout asking
for ``sandbox="local"`` runs in our local sandbox (``harness_grpo.harbor_local:LocalEnvironment``), every other sandbox
as ``openenv harbor`` runs it.

Why a wrapper: ``openenv harbor`` hands a rollout's sandbox to Harbor as ``EnvironmentConfig(type=sandbox)``, and
Harbor's ``type`` is its closed ``EnvironmentType`` enum, its environment registry keyed by it, so there is neither a
name nor a plugin entry point through which an outside environment can be selected; only ``import_path`` can, and
``openenv harbor`` sets that for nothing but its own e2b variant. So ``install()`` wraps
``openenv.harbor.rollout.build_trial_config`` (the one function that builds a rollout's ``TrialConfig``, looked up
by ``run_rollout`` at call time): for ``local`` it builds the configuration as for Harbor's ``docker`` type and then
puts ours in its place (``import_path`` of ``LocalEnvironment``, ``delete`` and ``force_build`` kept), allowing the
sandbox the capture proxy's port, the port of the intercept URL. That URL must be this machine's loopback, as
``--expose direct`` makes it (the sandbox's only way out is that port of 127.0.0.1); any other is refused by name.
"""

from __future__ import annotations

import functools
import sys
from typing import Any
from urllib.parse import urlsplit

from harness_grpo.harbor_sessions import environment_config

LOOPBACK = {"127.0.0.1", "localhost"}


def install() -> None:
    """Make this process's ``openenv harbor`` run ``sandbox="local"`` in ``LocalEnvironment`` (idempotent)."""
    from openenv.harbor import rollout

    build = rollout.build_trial_config
    if getattr(build, "runs_local_sandbox", False):
        return

    @functools.wraps(build)
    def build_trial_config(*, sandbox: str, intercept_url: str, **kwargs: Any) -> Any:
        if sandbox != "local":
            return build(sandbox=sandbox, intercept_url=intercept_url, **kwargs)
        url = urlsplit(intercept_url)
        if url.hostname not in LOOPBACK or url.port is None:
            raise ValueError(
                f"the local sandbox reaches only this machine's loopback, and the capture proxy is at {intercept_url}: "
                "serve with --expose direct"
            )
        config = build(sandbox="docker", intercept_url=intercept_url, **kwargs)
        local = environment_config("local", {"allow_ports": [url.port]})
        local.delete, local.force_build = config.environment.delete, config.environment.force_build
        config.environment = local
        return config

    build_trial_config.runs_local_sandbox = True  # type: ignore[attr-defined]
    rollout.build_trial_config = build_trial_config


def main(argv: list[str] | None = None) -> None:
    """``openenv harbor`` with ``install()`` done first."""
    install()
    from openenv.cli.commands.harbor import app

    app(args=sys.argv[1:] if argv is None else argv, prog_name="openenv harbor")


if __name__ == "__main__":
    main()
