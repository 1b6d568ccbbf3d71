#!/bin/bash
cat > /app/stats.py <<'EOF'
"""Summary statistics for non-empty lists of numbers."""


def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    ordered = sorted(xs)
    n = len(ordered)
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def variance(xs):
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
EOF
