"""``SudokuToolEnv``: Sudoku as a TRL ``environment_factory`` class."""

from __future__ import annotations

from harness_grpo.envs.textarena.tools import TextArenaToolEnv


class SudokuToolEnv(TextArenaToolEnv):
    """One tool, ``place``. ``reward`` is the game's (1.0 when solved, the share of empty cells filled
    correctly when it ends otherwise, 0.0 while playing).

    The server URL is ``base_url=`` or ``$SUDOKU_ENV_URL``; a row's ``seed`` picks the puzzle.
    """

    url_variable = "SUDOKU_ENV_URL"
    server_name = "sudoku"

    def place(self, row: int, col: int, number: int) -> str:
        """Place a number in an empty cell of the Sudoku grid.

        Args:
            row: Row number, 1 to 9.
            col: Column number, 1 to 9.
            number: The digit to place, 1 to 9.

        Returns:
            The updated board, or why the move was rejected.
        """
        return self._move(f"[{row} {col} {number}]")
