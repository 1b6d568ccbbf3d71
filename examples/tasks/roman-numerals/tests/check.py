"""Grades /app/roman.py on twelve hidden inputs; reward = fraction right."""

import json

from module_calls import run_cases

CASES = [
    (1, "I"),
    (3, "III"),
    (4, "IV"),
    (9, "IX"),
    (14, "XIV"),
    (40, "XL"),
    (58, "LVIII"),
    (90, "XC"),
    (400, "CD"),
    (1994, "MCMXCIV"),
    (2024, "MMXXIV"),
    (3999, "MMMCMXCIX"),
]


def grade() -> dict:
    results = run_cases("roman", [["to_roman", [n]] for n, _ in CASES])
    hits = sum(got == want for got, (_, want) in zip(results, CASES, strict=True))
    return {"reward": hits / len(CASES)}


print(json.dumps(grade()))
