"""Grades /app/greet.py: 1 when it greets three hidden names exactly, else 0."""

import json
import subprocess
import sys

NAMES = ["Rui", "Maximilian", "Oona"]


def greets(name: str) -> bool:
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "/app/greet.py", name], capture_output=True, text=True, timeout=10, cwd="/app"
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == f"Hello, {name}!"


print(json.dumps({"reward": int(all(greets(name) for name in NAMES))}))
