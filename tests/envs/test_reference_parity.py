"""Our servers answer exactly what the upstream environments answer, over the wire.

``data/reference_transcripts.json.gz`` holds, per scripted episode, every payload OpenEnv's own
``textarena_env`` / ``openspiel_env`` environment produced around the real TextArena 0.7.4 /
OpenSpiel 2.0.2 game, and the final state (``make_reference_transcripts.py`` recorded them).
Each episode is replayed against our server through our client, and every step's observation,
reward and done, and the final state, must be equal. The Wordle cases cover a win, six misses,
two invalid moves in a row, an invalid move forgiven after a valid one and repeated letters; the
Sudoku cases a solve with a wrong digit, an unbracketed move and a clue overwrite along the way,
and two invalid moves in a row; Catch a catch, a miss and the paddle clamped at the edge.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from harness_grpo.envs.catch import OpenSpielAction, OpenSpielEnv
from harness_grpo.envs.serving import LocalEnvServer
from harness_grpo.envs.textarena import TextArenaAction, TextArenaEnv

CASES = json.loads(gzip.decompress((Path(__file__).with_name("data") / "reference_transcripts.json.gz").read_bytes()))[
    "cases"
]
CLIENTS = {"wordle": TextArenaEnv, "sudoku": TextArenaEnv, "catch": OpenSpielEnv}


def action(env: str, value: Any) -> Any:
    return OpenSpielAction(action_id=value) if env == "catch" else TextArenaAction(message=value)


def test_the_recording_covers_every_game() -> None:
    assert {case["env"] for case in CASES} == set(CLIENTS)
    assert {case["payloads"][-1]["reward"] for case in CASES if case["env"] == "catch"} == {1.0, -1.0}


@pytest.mark.parametrize("case", CASES, ids=[f"{case['env']}-{case['name']}" for case in CASES])
def test_replayed_episode_matches_upstream(case: dict[str, Any], servers: dict[str, LocalEnvServer]) -> None:
    client = CLIENTS[case["env"]](base_url=servers[case["env"]].url).sync()
    try:
        reference = [client._parse_result(payload) for payload in case["payloads"]]
        results = [client.reset(**case["reset"])]
        results += [client.step(action(case["env"], value)) for value in case["actions"]]
        for index, (ours, theirs) in enumerate(zip(results, reference, strict=True)):
            assert ours == theirs, f"step {index} of {case['name']} differs from upstream"
        state = client.state().model_dump(exclude={"episode_id"})
        assert json.loads(json.dumps(state)) == case["state"]
    finally:
        client.close()
