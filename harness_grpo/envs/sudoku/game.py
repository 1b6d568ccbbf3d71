"""Sudoku-v0 as TextArena plays it: a 9x9 puzzle with 60 clues and a unique solution, one cell a move.

The rules, messages and rewards are TextArena 0.7.4's ``SudokuEnv`` (``clues=60``,
``max_turns=100``): a move is the first ``[row column number]`` in the action (1-based); one
that is malformed, out of bounds, on a clue cell, or not the solution's digit for that cell is an
invalid move (the first one a warning, a second in a row ends the game with the share of empty
cells filled correctly); a full board ends the game with reward 1; reaching the turn limit ends
it with that share. Puzzles are generated exactly as TextArena generates them (a shuffled
backtracking fill, then cells removed in shuffled order while the solution stays unique), from a
``random.Random`` the caller seeds: the same seed gives the same puzzle as TextArena's
``reset(seed=...)``.
"""

from __future__ import annotations

import copy
import random
import re

from harness_grpo.envs.textarena.game import SinglePlayerGame

Grid = list[list[int]]
CLUES = 60
MAX_TURNS = 100
MOVE = re.compile(r"\[(\d+)\s(\d+)\s(\d+)\]")


def player_prompt(player_id: int = 0) -> str:
    return (
        f"You are Player {player_id}. You are playing Sudoku.\n"
        "Here is the current state of the Sudoku grid. Each row is numbered from 1 to 9, "
        "and each column is also numbered from 1 to 9.\n"
        "Empty cells are represented by '.', and pre-filled cells contain digits from 1 to 9.\n\n"
        "Current Sudoku Grid:\n"
        "Your objective is to fill the empty cells in the 9x9 grid with digits from 1 to 9 such that:\n"
        "1. Each row contains all digits from 1 to 9 without repetition.\n"
        "2. Each column contains all digits from 1 to 9 without repetition.\n"
        "3. Each of the nine 3x3 subgrids contains all digits from 1 to 9 without repetition.\n\n"
        "Rules and Instructions:\n"
        "1. **Do not overwrite** the initial numbers provided in the grid.\n"
        "2. **Only fill** empty cells represented by '.'.\n"
        "3. You may respond in any manner you prefer, but ensure that your response includes the format "
        "of '[row column number]'.\n"
        "4. **Ensure** that your move does not violate Sudoku rules. Invalid moves will result in penalties.\n"
        "Examples:\n"
        "- **Valid Move**:\n"
        "  - Grid Snippet Before Move:\n"
        "  \n"
        "  - Move: `[5 3 7]`\n"
        "  - Explanation: Placing 7 at row 5, column 3 does not violate any Sudoku rules.\n\n"
        "- **Invalid Move** (Overwriting a pre-filled cell):\n"
        "  - Grid Snippet Before Move:\n"
        "  \n"
        "  - Move: `[1 1 9]`\n"
        "  - Explanation: Cell (1,1) is already filled with 5. You cannot overwrite it.\n\n"
        "- **Invalid Move** (Violating Sudoku rules):\n"
        "  - Grid Snippet Before Move:\n"
        "  \n"
        "  - Move: `[1 3 5]`\n"
        "  - Explanation: Placing 5 in row 1, column 3 violates the rule since 5 already exists in row 1.\n\n"
        "The history of your moves and thoughts will be appended as you play more rounds. Use the history of "
        "your move to improve your decision making by avoiding the moves you have tried. Good luck!\n\n"
    )


def render(board: Grid) -> str:
    """The grid with ``C1``..``C9`` and ``R1``..``R9`` labels, ``.`` for empty cells, as TextArena shows it."""
    header = "   " + " ".join(f"C{j + 1}" + ("  " if (j + 1) % 3 == 0 else "") for j in range(9))
    lines = [header]
    for i, row in enumerate(board):
        line = f"R{i + 1} "
        for j, number in enumerate(row):
            line += f" {number if number else '.'} "
            if (j + 1) % 3 == 0 and j < 8:
                line += "| "
        lines.append(line.strip())
        if (i + 1) % 3 == 0 and i < 8:
            lines.append("   " + "- " * 16)
    return "\n".join(lines)


def is_safe(grid: Grid, row: int, col: int, number: int) -> bool:
    if number in grid[row] or number in (grid[i][col] for i in range(9)):
        return False
    top, left = 3 * (row // 3), 3 * (col // 3)
    return all(grid[i][j] != number for i in range(top, top + 3) for j in range(left, left + 3))


def _find_empty(grid: Grid) -> tuple[int, int] | None:
    for i in range(9):
        for j in range(9):
            if grid[i][j] == 0:
                return (i, j)
    return None


def _fill(grid: Grid, rng: random.Random) -> bool:
    empty = _find_empty(grid)
    if empty is None:
        return True
    row, col = empty
    numbers = list(range(1, 10))
    rng.shuffle(numbers)
    for number in numbers:
        if is_safe(grid, row, col, number):
            grid[row][col] = number
            if _fill(grid, rng):
                return True
            grid[row][col] = 0
    return False


def _count_solutions(grid: Grid, limit: int = 2, found: int = 0) -> int:
    if found >= limit:
        return found
    empty = _find_empty(grid)
    if empty is None:
        return found + 1
    row, col = empty
    for number in range(1, 10):
        if is_safe(grid, row, col, number):
            grid[row][col] = number
            found = _count_solutions(grid, limit, found)
            grid[row][col] = 0
    return found


def generate(rng: random.Random, clues: int = CLUES) -> tuple[Grid, Grid]:
    """``(solution, puzzle)``: a full grid and the same grid with all but ``clues`` cells emptied, uniquely solvable."""
    solution = [[0] * 9 for _ in range(9)]
    _fill(solution, rng)
    puzzle = copy.deepcopy(solution)
    cells = [(i, j) for i in range(9) for j in range(9)]
    rng.shuffle(cells)
    while len(cells) > clues:
        row, col = cells.pop()
        removed, puzzle[row][col] = puzzle[row][col], 0
        if _count_solutions(copy.deepcopy(puzzle)) != 1:
            puzzle[row][col] = removed
    return solution, puzzle


class SudokuGame(SinglePlayerGame):
    """One Sudoku game; see the module docstring."""

    def __init__(self, solution: Grid, puzzle: Grid) -> None:
        self.solution = solution
        self.puzzle = puzzle
        board = copy.deepcopy(puzzle)
        super().__init__(
            player_prompt(), {"board": board, "rendered_board": render(puzzle), "completed": False}, MAX_TURNS
        )
        self.add_observation(f"Game Board:\n{render(board)}")

    @classmethod
    def new(cls, rng: random.Random) -> SudokuGame:
        return cls(*generate(rng))

    def play(self, action: str) -> None:
        board = self.game_state["board"]
        self.add_observation(action, from_id=0, player_action=True)
        match = MOVE.search(action)
        if match is None:
            reason = "Invalid move format. Player 0 did not respond with valid 'row column number'."
            self.set_invalid_move(reason, self.completion())
        else:
            row, col, number = map(int, match.groups())
            if not (1 <= row <= 9 and 1 <= col <= 9 and 1 <= number <= 9):
                reason = (
                    f"Invalid move. Player 0 attempted to place {number} at ({row}, {col}), which is out of bounds."
                )
                self.set_invalid_move(reason, self.completion())
            else:
                if board[row - 1][col - 1] != 0:
                    reason = f"Invalid move. Player 0 attempted to overwrite a pre-filled cell ({row}, {col})."
                    self.set_invalid_move(reason, self.completion())
                elif self.solution[row - 1][col - 1] == number:
                    board[row - 1][col - 1] = number
                    self.add_observation(f"Board state: \n{render(board)}")
                else:
                    reason = (
                        f"Invalid move. Player 0 attempted to place {number} at ({row}, {col}), "
                        "which violates Sudoku rules."
                    )
                    self.set_invalid_move(reason, self.completion())
                if board == self.solution:
                    self.game_state["completed"] = True
                    self.set_outcome(1, "Congratulations! Player 0 completed the Sudoku puzzle.")
                self.game_state["rendered_board"] = render(board)
        if self.turn_limit_reached():
            completion = self.completion()
            filled = round(completion * 100)
            reason = f"The turn limit has been reached. You correctly filled {filled}% of the empty cells."
            self.set_outcome(completion, reason)
        self.end_step()

    def completion(self) -> float:
        """The share of the puzzle's empty cells that hold the solution's digit."""
        board = self.game_state["board"]
        empty = [(i, j) for i in range(9) for j in range(9) if self.puzzle[i][j] == 0]
        if not empty:
            return 0.0
        return sum(board[i][j] == self.solution[i][j] for i, j in empty) / len(empty)
