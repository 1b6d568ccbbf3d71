"""A ``LocalAgentSessionFactory`` that also writes down what each of its sessions handed its caller.

``RecordingAgentSessionFactory(record_dir=..., **LocalAgentSessionFactory kwargs)`` behaves exactly as its base
(it is what TRL's worker drives in ``test_trl_harness_worker``); each session's ``verify`` additionally writes
``record_dir/<episode>.json``: the ``seed`` it was created with (TRL's group id), the verifier's reward and the
``TrainingTrace`` its ``fetch_training_trace`` returned. It lives in its own module, not the test file, so TRL's
spawned worker process imports it without pytest.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness_grpo.agent_sessions import LocalAgentSessionFactory, ProcessSession
from harness_grpo.session_protocol import VerifyResult
from proxy.trace import TrainingTrace


class RecordingSession(ProcessSession):
    """A ``ProcessSession`` that records its trace and reward (module docstring)."""

    trace: TrainingTrace | None = None

    def fetch_training_trace(self) -> TrainingTrace:
        self.trace = super().fetch_training_trace()
        return self.trace

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        verdict = super().verify(transcript, final_state)
        assert self.trace is not None, "verify before fetch_training_trace"
        record = {"seed": self.seed, "reward": verdict.env_reward, "trace": json.loads(self.trace.to_json())}
        path = Path(self._factory.record_dir) / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(record))
        return verdict


class RecordingAgentSessionFactory(LocalAgentSessionFactory):
    """``LocalAgentSessionFactory`` whose sessions are ``RecordingSession``s writing into ``record_dir``."""

    def __init__(self, *, record_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record_dir = record_dir

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> RecordingSession:
        return RecordingSession(self, row, self.bound_context(), seed=seed, episode_id=episode_id)
