"""Catch (OpenSpiel catch): ``OpenSpielEnv`` client, ``OpenSpielAction``, ``CatchToolEnv``."""

from harness_grpo.envs.catch.client import OpenSpielEnv
from harness_grpo.envs.catch.models import OpenSpielAction, OpenSpielObservation, OpenSpielState
from harness_grpo.envs.catch.tools import CatchToolEnv

__all__ = ["CatchToolEnv", "OpenSpielAction", "OpenSpielEnv", "OpenSpielObservation", "OpenSpielState"]
