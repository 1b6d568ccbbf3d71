"""Grades /app/fizzbuzz.py on sixteen hidden inputs; reward = fraction right."""

import json

from module_calls import run_cases

CASES = [
    (1, "1"),
    (2, "2"),
    (3, "Fizz"),
    (4, "4"),
    (5, "Buzz"),
    (6, "Fizz"),
    (9, "Fizz"),
    (10, "Buzz"),
    (15, "FizzBuzz"),
    (30, "FizzBuzz"),
    (45, "FizzBuzz"),
    (7, "7"),
    (98, "98"),
    (99, "Fizz"),
    (100, "Buzz"),
    (101, "101"),
]


def grade() -> dict:
    results = run_cases("fizzbuzz", [["fizzbuzz", [n]] for n, _ in CASES])
    hits = sum(got == want for got, (_, want) in zip(results, CASES, strict=True))
    return {"reward": hits / len(CASES)}


print(json.dumps(grade()))
