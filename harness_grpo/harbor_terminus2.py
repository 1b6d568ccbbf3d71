"""Harbor's own terminus-2 against the capture proxy: its loop and LiteLLM client run on the host, its commands
in a tmux session inside the environment.

``ProxyTerminus2`` has a ``setup`` that first checks tmux is there. ``terminus2_kwargs`` points it at the proxy
(``hosted_vllm/<served name>``, ``api_base`` = proxy ``/v1``, the model's token limits and zero costs in
``model_info``, summarisation off so one rollout stays one trajectory). Harbor imports this module by its
import path when a trial runs terminus-2; nothing else loads it, because LiteLLM takes seconds to import.
"""

from __future__ import annotations

from typing import Any

from harness_grpo.harbor_agents import AgentUnavailableError  # sets Harbor's and LiteLLM's variables first

# isort: split
from harbor.agents.terminus_2 import Terminus2
from harbor.environments.base import BaseEnvironment


class ProxyTerminus2(Terminus2):
    """Harbor's terminus-2, refusing to start (``AgentUnavailableError``) where tmux is not in the environment."""

    async def setup(self, environment: BaseEnvironment) -> None:
        result = await environment.exec("tmux -V")
        if result.return_code != 0:
            raise AgentUnavailableError(
                f"terminus-2 drives a tmux session inside the environment, and tmux is not reachable in the "
                f"{environment.type()} environment: {(result.stderr or result.stdout or '').strip()[:300]}"
            )
        await super().setup(environment)


def terminus2_kwargs(proxy_url: str, *, max_input_tokens: int, max_output_tokens: int) -> dict[str, Any]:
    """``AgentConfig.kwargs`` for ``ProxyTerminus2`` against the proxy at ``proxy_url`` (its root)."""
    return {
        "api_base": f"{proxy_url.rstrip('/')}/v1",
        "model_info": {
            "max_input_tokens": max_input_tokens,
            "max_output_tokens": max_output_tokens,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
        },
        "enable_summarize": False,
        "record_terminal_session": False,
        "suppress_max_turns_warning": True,
    }
