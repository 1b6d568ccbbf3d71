"""The stacks and tasks the Harbor session tests run on.

``agent_stack`` (the fake engine unless ``HARNESS_AGENT_ENGINE`` says otherwise) and ``warm_tiny_stack`` (the
embedded engine serving the warm-started tiny model) are the agent CLI tests' stacks: engine <- recording
relay <- capture proxy, so a test can compare a session's trace with what the engine served. ``make_task``
writes a Harbor task (the local sandbox tests' helper); ``bound_factory`` builds a ``HarborTrialSessionFactory``
bound to a stack's proxy as the trainer binds it.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness_grpo.harbor_local import check_prerequisites
from harness_grpo.harbor_sessions import HarborTrialSessionFactory
from harness_grpo.rollout_context import ProxyEndpoint, RolloutContext
from tests.agents.conftest import AgentStack, agent_engine, agent_stack, warm_tiny_stack
from tests.sandbox.conftest import make_task

__all__ = ["agent_engine", "agent_stack", "bound_factory", "make_task", "warm_tiny_stack"]

AGENT_MODEL = "harness-model"
"""The model name agents send; the proxy serves the engine's model whatever they ask."""


def bound_factory(
    stack: AgentStack,
    *,
    sampling: dict[str, Any] | None = None,
    max_model_calls: int | None = None,
    max_output_tokens: int | None = None,
    **kwargs: Any,
) -> HarborTrialSessionFactory:
    """A ``HarborTrialSessionFactory`` built with ``sampling`` and bound to ``stack``'s proxy with these budgets."""
    sampling = dict(sampling or {})
    factory = HarborTrialSessionFactory(sampling=sampling, **kwargs)
    factory.bind_rollout(
        RolloutContext(
            ProxyEndpoint(stack.url, stack.proxy.admin_key),
            sampling=sampling,
            max_model_calls=max_model_calls,
            max_output_tokens=max_output_tokens,
            model_name=AGENT_MODEL,
        )
    )
    return factory


@pytest.fixture(autouse=True)
def _local_sandbox_available() -> None:
    check_prerequisites()
