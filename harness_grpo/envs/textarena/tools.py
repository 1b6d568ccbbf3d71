"""The tool-class side of a TextArena game: the transcript, read a move at a time."""

from __future__ import annotations

from typing import Any

from harness_grpo.envs.textarena.client import TextArenaEnv
from harness_grpo.envs.textarena.models import TextArenaAction
from harness_grpo.envs.tool_env import EpisodeToolEnv


class TextArenaToolEnv(EpisodeToolEnv):
    """Shared by ``WordleToolEnv`` and ``SudokuToolEnv``: ``reset`` answers the game's opening text, a move
    answers what the move added to the transcript (and says when the game is over).

    ``reset(**row)`` passes the row's ``seed`` (if any) to the server, so the rows of one GRPO group,
    which share their row, play the same game. ``reward_signals`` holds the last step's signals.
    """

    client_class = TextArenaEnv
    reset_options: tuple[str, ...] = ("seed",)

    def reset(self, **kwargs: Any) -> str:
        """Start a new game on its own server session and return its opening text."""
        options = {key: kwargs[key] for key in self.reset_options if kwargs.get(key) is not None}
        result = self._start_episode(**options)
        self._transcript = result.observation.messages[0].content if result.observation.messages else ""
        self.reward_signals: dict[str, float] = {}
        return self._transcript.strip()

    def _move(self, message: str) -> str:
        result = self._play(TextArenaAction(message=message))
        transcript = result.observation.messages[0].content if result.observation.messages else ""
        added, self._transcript = transcript[len(self._transcript) :], transcript
        self.reward_signals = dict(result.observation.info.get("reward_signals", {}))
        if result.done:
            added += f"\nThe game is over (reward {self.reward:g})."
        return added.strip()
