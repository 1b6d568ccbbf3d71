"""Small shell chores for coding-agent CLIs, verified from the agent's working directory.

Each task asks for a file with a given word in it; the verifier reads the working directory after
the agent ended (never the agent's report): 1.0 when the file holds the word, 0.5 when the file
exists without it, else 0.0. Used by ``launchers/train.py --harness opencode`` (or codex,
claude-code, mini-swe-agent) with the warm-started tiny model on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

NAMES = ["hello.txt", "notes.txt", "answer.txt", "out.txt"]
WORDS = ["hi", "done", "42", "yes"]


def dataset() -> list[dict[str, Any]]:
    """One task per (file name, word)."""
    return [
        {"prompt": f"Create a file named {name} containing the word {word}. Use the shell.", "file": name, "word": word}
        for name in NAMES
        for word in WORDS
    ]


def verifier(workdir: Path, task: Mapping[str, Any]) -> float:
    """1.0: the file holds the word (a whitespace-separated token); 0.5: the file exists without it; 0.0: no file."""
    path = workdir / str(task["file"])
    if not path.is_file():
        return 0.0
    return 1.0 if str(task["word"]) in path.read_text(errors="replace").split() else 0.5
