"""Record what the upstream environments answer, for ``test_reference_parity.py`` to compare ours against.

Not a test: run it by hand where the upstream code is available (none of it is a dependency)::

    python tests/envs/make_reference_transcripts.py --textarena DIR --openenv-envs DIR --open-spiel DIR

``--textarena``: a directory holding the ``textarena`` 0.7.4 package (e.g. its wheel unpacked);
``--openenv-envs``: the ``envs`` directory of a huggingface/OpenEnv checkout (``textarena_env``,
``openspiel_env``); ``--open-spiel``: a directory where ``open-spiel`` 2.0.2 is installed
(``pip install --target DIR open-spiel==2.0.2 absl-py attrs ml-collections --no-deps``).
NLTK is replaced by a stub (its data needs a download): TextArena's Wordle then accepts the words
of its bundled en_US and en_GB Hunspell dictionaries; the en_GB ones are dropped here, as our word
list holds the en_US ones only, and the secret word is set by the script.

Each case is played through the upstream OpenEnv ``Environment`` (the object its server wraps) and
stored as the payloads its server sends (``serialize_observation``) plus the final ``state``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import types
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("data") / "reference_transcripts.json.gz"

WORDLE_CASES = [
    ("win_third_guess", "crane", ["[slate]", "TRAIN", "I guess [crane] now"]),
    ("six_misses", "crane", ["[blimp]", "[fuzzy]", "[ghost]", "[dough]", "[witty]", "[react]"]),
    ("two_invalid_in_a_row", "crane", ["[grace]", "no brackets here", "[zzzzz]"]),
    ("invalid_forgiven_after_valid", "apple", ["[apples]", "[maple]", "[maple]", "[ample]", "[12345]", "[apple]"]),
    ("repeated_letters", "sheep", ["[eerie]", "[geese]", "[sheep]"]),
]
SUDOKU_SEEDS = [3, 11]
CATCH_CASES = [
    ("catch_in_column", 4, [2, 2, 1, 1, 1, 1, 1, 1, 1]),
    ("miss_left", 0, [2, 2, 2, 1, 1, 1, 1, 1, 1]),
    ("clamped_left", 1, [0, 0, 0, 0, 2, 1, 1, 1, 1]),
]


def stub_nltk() -> None:
    nltk = types.ModuleType("nltk")
    nltk.download = lambda *args, **kwargs: True
    nltk.pos_tag = lambda words: [(word, "NN") for word in words]
    corpus = types.ModuleType("nltk.corpus")
    corpus.words = types.SimpleNamespace(words=lambda *args: ["crane"])
    nltk.corpus = corpus
    sys.modules["nltk"] = nltk
    sys.modules["nltk.corpus"] = corpus


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def unwrapped(env: Any) -> Any:
    while hasattr(env, "env"):
        env = env.env
    return env


def sudoku_actions(solution: list[list[int]], puzzle: list[list[int]], rng: random.Random) -> dict[str, list[str]]:
    """Two scripts: two invalid moves in a row (game over); and a solve with a wrong digit, a move
    without brackets and a move onto a clue along the way."""
    empty = [(i, j) for i in range(9) for j in range(9) if puzzle[i][j] == 0]
    rng.shuffle(empty)
    good = [f"[{i + 1} {j + 1} {solution[i][j]}]" for i, j in empty]
    i, j = empty[0]
    wrong = f"[{i + 1} {j + 1} {solution[i][j] % 9 + 1}]"
    ci, cj = next((i, j) for i in range(9) for j in range(9) if puzzle[i][j])
    onto_clue = f"I place it at [{ci + 1} {cj + 1} 5]"
    unbracketed = good[3].strip("[]")
    return {
        "invalid_twice": ["[1 1 1 1]", "[10 1 1]"],
        "play": [*good[:3], wrong, unbracketed, onto_clue, *good[4:]],
    }


def record_textarena(args: argparse.Namespace) -> list[dict[str, Any]]:
    sys.path[:0] = [str(args.textarena), str(args.openenv_envs)]
    stub_nltk()
    from openenv.core.env_server.serialization import serialize_observation
    from textarena_env.models import TextArenaAction
    from textarena_env.server.environment import TextArenaEnvironment

    cases = []
    for name, secret, actions in WORDLE_CASES:
        env = TextArenaEnvironment("Wordle-v0", download_nltk=False)
        game = unwrapped(env._ta_env)
        game.dictionary.uk_words = set()
        game.word_list = [secret]
        payloads = [serialize_observation(env.reset())]
        payloads += [serialize_observation(env.step(TextArenaAction(message=action))) for action in actions]
        cases.append(
            {
                "env": "wordle",
                "name": name,
                "reset": {"secret_word": secret},
                "actions": actions,
                "payloads": jsonable(payloads),
                "state": jsonable(env.state.model_dump(exclude={"episode_id"})),
            }
        )
    for seed in SUDOKU_SEEDS:
        for label in ("invalid_twice", "play"):
            env = TextArenaEnvironment("Sudoku-v0", download_nltk=False)
            game = unwrapped(env._ta_env)
            reset_game = game.reset

            def seeded_reset(num_players: int, seed: int | None = None, _reset=reset_game, _seed=seed) -> None:
                _reset(num_players=num_players, seed=_seed)

            game.reset = seeded_reset
            payloads = [serialize_observation(env.reset())]
            actions = sudoku_actions(game.full_grid, game.game_board, random.Random(seed))[label]
            for action in actions:
                payloads.append(serialize_observation(env.step(TextArenaAction(message=action))))
                if payloads[-1]["done"]:
                    break
            cases.append(
                {
                    "env": "sudoku",
                    "name": f"seed{seed}_{label}",
                    "reset": {"seed": seed},
                    "actions": actions[: len(payloads) - 1],
                    "payloads": jsonable(payloads),
                    "state": jsonable(env.state.model_dump(exclude={"episode_id"})),
                }
            )
    return cases


def record_catch(args: argparse.Namespace) -> list[dict[str, Any]]:
    sys.path[:0] = [str(args.open_spiel)]
    from openenv.core.env_server.serialization import serialize_observation
    from openspiel_env.models import OpenSpielAction
    from openspiel_env.server.openspiel_environment import OpenSpielEnvironment

    from harness_grpo.envs.catch.server import COLUMNS

    cases = []
    for name, column, actions in CATCH_CASES:
        seed = next(s for s in range(1000) if random.Random(s).randrange(COLUMNS) == column)
        env = OpenSpielEnvironment("catch")
        env._ospiel_env._chance_event_sampler = lambda state, _column=column: _column
        payloads = [serialize_observation(env.reset())]
        payloads += [serialize_observation(env.step(OpenSpielAction(action_id=a))) for a in actions]
        cases.append(
            {
                "env": "catch",
                "name": name,
                "reset": {"seed": seed},
                "actions": actions,
                "payloads": jsonable(payloads),
                "state": jsonable(env.state.model_dump(exclude={"episode_id"})),
            }
        )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--textarena", type=Path, required=True)
    parser.add_argument("--openenv-envs", type=Path, required=True)
    parser.add_argument("--open-spiel", type=Path, required=True)
    args = parser.parse_args()
    cases = record_textarena(args) + record_catch(args)
    OUT.write_bytes(gzip.compress(json.dumps({"cases": cases}).encode(), mtime=0))
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
