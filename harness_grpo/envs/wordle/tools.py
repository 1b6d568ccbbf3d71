"""``WordleToolEnv``: Wordle as a TRL ``environment_factory`` class."""

from __future__ import annotations

from harness_grpo.envs.textarena.tools import TextArenaToolEnv


class WordleToolEnv(TextArenaToolEnv):
    """One tool, ``guess``. ``reward`` is the game's (1.0 for a win, the last guess's completion after six
    guesses, 0.0 while playing); ``reward_signals`` the server's ``wordle.*`` signals of the last guess.

    The server URL is ``base_url=`` or ``$WORDLE_ENV_URL``; a row's ``seed`` or ``secret_word`` picks the game.
    """

    url_variable = "WORDLE_ENV_URL"
    server_name = "wordle"
    reset_options = ("seed", "secret_word")

    def guess(self, word: str) -> str:
        """Guess the secret five-letter word.

        Args:
            word: A five-letter English word, such as "crane".

        Returns:
            The feedback on the guess (per letter G: right letter in the right place, Y: in the word but
            elsewhere, X: not in the word) and the guesses left, or why the guess was not accepted.
        """
        return self._move(word)
