"""Session factories that also write down what each of their sessions handed their caller.

``RecordingAgentSessionFactory(record_dir=..., **LocalAgentSessionFactory kwargs)`` and
``RecordingHarborSessionFactory(server_url, record_dir=..., **HarborSessionFactory kwargs)`` behave exactly as their
bases (they are what TRL's worker drives in ``test_trl_harness_worker*``); each session's ``verify`` additionally
writes ``record_dir/<uuid>.json``: the ``seed`` it was created with (TRL's group id), the verifier's reward and the
``TrainingTrace`` its ``fetch_training_trace`` returned. They live in their own module, not the test files, so TRL's
spawned worker process imports them without pytest.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness_grpo.agent_sessions import LocalAgentSessionFactory, ProcessSession
from harness_grpo.harbor_service_sessions import HarborServiceSession, HarborSessionFactory
from harness_grpo.session_protocol import VerifyResult
from proxy.trace import TrainingTrace


class Recording:
    """Mixin over a session with ``seed`` and a ``_factory`` with ``record_dir``: records its trace and reward."""

    trace: TrainingTrace | None = None
    seed: int | None
    _factory: Any

    def fetch_training_trace(self) -> TrainingTrace:
        self.trace = super().fetch_training_trace()  # type: ignore[misc]
        return self.trace

    def verify(self, transcript: Any = None, final_state: Any = None) -> VerifyResult:
        verdict = super().verify(transcript, final_state)  # type: ignore[misc]
        assert self.trace is not None, "verify before fetch_training_trace"
        record = {"seed": self.seed, "reward": verdict.env_reward, "trace": json.loads(self.trace.to_json())}
        (Path(self._factory.record_dir) / f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))
        return verdict


class RecordingSession(Recording, ProcessSession):
    """A ``ProcessSession`` that records its trace and reward (module docstring)."""


class RecordingAgentSessionFactory(LocalAgentSessionFactory):
    """``LocalAgentSessionFactory`` whose sessions are ``RecordingSession``s writing into ``record_dir``."""

    def __init__(self, *, record_dir: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record_dir = record_dir

    def create_from_row(self, row: Mapping[str, Any], *, seed: int, episode_id: str) -> RecordingSession:
        return RecordingSession(self, row, self.bound_context(), seed=seed, episode_id=episode_id)


class RecordingServiceSession(Recording, HarborServiceSession):
    """A ``HarborServiceSession`` that records its trace and reward (module docstring)."""


class RecordingHarborSessionFactory(HarborSessionFactory):
    """``HarborSessionFactory`` whose sessions are ``RecordingServiceSession``s writing into ``record_dir``."""

    def __init__(self, server_url: str, *, record_dir: str, **kwargs: Any) -> None:
        super().__init__(server_url, **kwargs)
        self.record_dir = record_dir

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> RecordingServiceSession:
        chosen = super().create(task, seed, episode_id)
        session = RecordingServiceSession(self, chosen.task_index, chosen.instruction)
        session.seed = seed
        return session
