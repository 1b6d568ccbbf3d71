"""TextArena's single-player game state and the transcript its LLM observation wrapper shows the player.

``SinglePlayerGame`` reproduces ``textarena.state.SinglePlayerState`` (turns, one invalid move
forgiven with a warning and the next one ending the game, outcome and rewards) together with
``LLMObservationWrapper``, which renders every observation as ``"\\n[SENDER] message"`` appended to
one growing transcript. A game subclass implements ``play(action)`` with its rules; the action
arrives already formatted as TextArena's ``ActionFormattingWrapper`` does (``[...]`` added when it
has no brackets).
"""

from __future__ import annotations

from typing import Any

GAME_ID = -1
ROLE_MAPPING = {0: "Player", GAME_ID: "GAME"}
INVALID_MOVE = (
    "You attempted an invalid move. Reason: {reason} "
    "Please resubmit a valid move and remember to follow the game rules to avoid penalties."
)


def format_action(action: str) -> str:
    """TextArena's ``ActionFormattingWrapper``: wrap an action without brackets in ``[...]``."""
    return action if "[" in action or "]" in action else f"[{action}]"


class SinglePlayerGame:
    """One game's state and transcript; see the module docstring."""

    def __init__(
        self, prompt: str, game_state: dict[str, Any], max_turns: int | None = None, error_allowance: int = 1
    ) -> None:
        self.game_state = game_state
        self.max_turns = max_turns
        self.error_allowance = error_allowance
        self.turn = 0
        self.done = False
        self.rewards: dict[int, float] | None = None
        self.game_info: dict[int, dict[str, Any]] = {0: {"role": "Player 0", "invalid_move": False, "turn_count": 0}}
        self.logs: list[tuple[int, str]] = []
        self.error_count = 0
        self.made_invalid_move = False
        self.transcript = ""
        self._unseen: list[tuple[int, str]] = []
        self.add_observation(prompt)

    def play(self, action: str) -> None:
        """Apply the player's (formatted) action; ends with ``end_step()``."""
        raise NotImplementedError

    def add_observation(self, message: str, from_id: int = GAME_ID, *, player_action: bool = False) -> None:
        if player_action:
            for role in ROLE_MAPPING.values():
                message = message.replace(f"[{role}]", "")
        self.logs.append((from_id, message))
        self._unseen.append((from_id, message))

    def observe(self) -> str:
        """The transcript with every observation added since the last call appended."""
        for from_id, message in self._unseen:
            sender = "GAME" if from_id == GAME_ID else ROLE_MAPPING.get(from_id, f"Player {from_id}")
            self.transcript += f"\n[{sender}] {message}"
        self._unseen.clear()
        return self.transcript

    def set_invalid_move(self, reason: str, reward: float) -> None:
        if self.error_allowance > self.error_count:
            self.error_count += 1
            self.made_invalid_move = True
            self.add_observation(INVALID_MOVE.format(reason=reason))
        else:
            self.rewards = {0: reward}
            self.game_info[0]["reason"] = f"Invalid Move: {reason}"
            self.game_info[0]["invalid_move"] = True
            self.done = True

    def set_outcome(self, reward: float, reason: str) -> None:
        self.rewards = {0: reward}
        self.game_info[0]["reason"] = reason
        self.done = True

    def turn_limit_reached(self) -> bool:
        return self.max_turns is not None and self.turn >= self.max_turns and not self.done

    def end_step(self) -> None:
        if not self.made_invalid_move:
            self.error_count = 0
            self.turn += 1
            self.game_info[0]["turn_count"] += 1
        if not self.done:
            self.made_invalid_move = False
