"""Grades /app/stats.py on nine hidden cases; reward = fraction right, with a part per function."""

import json
import math

from module_calls import run_cases

CASES = [
    ("mean", [2, 4, 9], 5.0),
    ("mean", [10], 10.0),
    ("mean", [1.5, 2.5, -1, 7], 2.5),
    ("median", [7, 1, 3], 3),
    ("median", [9, 2, 5, 4], 4.5),
    ("median", [5, 3, 1, 4, 2], 3),
    ("variance", [1, 2, 3, 4], 1.25),
    ("variance", [2, 4, 4, 4, 5, 5, 7, 9], 4.0),
    ("variance", [10, 0], 25.0),
]


def close(got, want: float) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, abs_tol=1e-9)


def grade() -> dict:
    results = run_cases("stats", [[name, [xs]] for name, xs, _ in CASES])
    hits = [close(got, want) for got, (_, _, want) in zip(results, CASES, strict=True)]
    parts = {
        name: sum(h for h, case in zip(hits, CASES, strict=True) if case[0] == name) / 3
        for name in ("mean", "median", "variance")
    }
    return {"reward": sum(hits) / len(CASES), **parts}


print(json.dumps(grade()))
