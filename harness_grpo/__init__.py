"""harness-grpo: async GRPO for black-box coding agents behind an exact-token capture proxy.

The public API, one import path per concept::

    from harness_grpo import HarnessAsyncGRPOTrainer, HarnessGRPOConfig, HarnessRolloutOutcome

Names are resolved on first use, so ``import harness_grpo.engine`` (or the proxy) does not pay for
the trainer's imports.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "HarnessAsyncGRPOTrainer": "harness_grpo.trainer",
    "HarnessGRPOConfig": "harness_grpo.config",
    "HarnessRolloutOutcome": "harness_grpo.outcomes",
    "HarnessTurn": "harness_grpo.outcomes",
    "HarnessSession": "harness_grpo.session_protocol",
    "HarnessSessionFactory": "harness_grpo.session_protocol",
    "TrainerBoundSessionFactory": "harness_grpo.session_protocol",
    "SessionContractError": "harness_grpo.session_protocol",
    "VerifyResult": "harness_grpo.session_protocol",
    "RolloutContext": "harness_grpo.rollout_context",
    "RolloutClient": "harness_grpo.rollout_func",
    "RolloutFuncTrainer": "harness_grpo.rollout_func",
    "HarnessAdapter": "harness_grpo.white_box",
    "HarnessRunLimits": "harness_grpo.white_box",
    "LocalAgentSessionFactory": "harness_grpo.agent_sessions",
    "CLIAgentSessionFactory": "harness_grpo.agent_sessions",
    "HarborSessionFactory": "harness_grpo.harbor_service_sessions",
    "with_turn_rule": "harness_grpo.turn_masks",
    "has_tool_call": "harness_grpo.turn_masks",
    "TrainingTrace": "proxy.trace",
    "TrainingTurn": "proxy.trace",
    "CaptureContractError": "proxy.trace",
}
__all__ = [
    "CLIAgentSessionFactory",
    "CaptureContractError",
    "HarborSessionFactory",
    "HarnessAdapter",
    "HarnessAsyncGRPOTrainer",
    "HarnessGRPOConfig",
    "HarnessRolloutOutcome",
    "HarnessRunLimits",
    "HarnessSession",
    "HarnessSessionFactory",
    "HarnessTurn",
    "LocalAgentSessionFactory",
    "RolloutClient",
    "RolloutContext",
    "RolloutFuncTrainer",
    "SessionContractError",
    "TrainerBoundSessionFactory",
    "TrainingTrace",
    "TrainingTurn",
    "VerifyResult",
    "has_tool_call",
    "with_turn_rule",
]

if TYPE_CHECKING:
    from harness_grpo.agent_sessions import CLIAgentSessionFactory, LocalAgentSessionFactory
    from harness_grpo.config import HarnessGRPOConfig
    from harness_grpo.harbor_service_sessions import HarborSessionFactory
    from harness_grpo.outcomes import HarnessRolloutOutcome, HarnessTurn
    from harness_grpo.rollout_context import RolloutContext
    from harness_grpo.rollout_func import RolloutClient, RolloutFuncTrainer
    from harness_grpo.session_protocol import (
        HarnessSession,
        HarnessSessionFactory,
        SessionContractError,
        TrainerBoundSessionFactory,
        VerifyResult,
    )
    from harness_grpo.trainer import HarnessAsyncGRPOTrainer
    from harness_grpo.turn_masks import has_tool_call, with_turn_rule
    from harness_grpo.white_box import HarnessAdapter, HarnessRunLimits
    from proxy.trace import CaptureContractError, TrainingTrace, TrainingTurn


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness_grpo' has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in ("harness_grpo", "proxy"):
            raise
        raise ModuleNotFoundError(
            f"harness_grpo.{name} needs {exc.name!r}, which {sys.executable} cannot import: run it with the "
            "interpreter harness-grpo was installed in (`bash launchers/setup.sh` makes .venv/bin/python) "
            "or install the package there (`pip install -e .`)",
            name=exc.name,
        ) from exc
    value = getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
