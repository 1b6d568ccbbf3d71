"""Grades /app/top.txt: a third of a point for each of the top three words in its right line."""

import json

EXPECTED = ["the", "cat", "on"]


def grade() -> dict:
    try:
        with open("/app/top.txt") as f:
            lines = [line.strip().lower() for line in f.read().splitlines() if line.strip()]
    except (OSError, ValueError):
        lines = []
    if len(lines) > len(EXPECTED):
        lines = []
    hits = [int(i < len(lines) and lines[i] == word) for i, word in enumerate(EXPECTED)]
    return {"reward": sum(hits) / len(EXPECTED), "first": hits[0], "second": hits[1], "third": hits[2]}


print(json.dumps(grade()))
