"""Summary statistics for non-empty lists of numbers."""


def mean(xs):
    return sum(xs) / (len(xs) - 1)


def median(xs):
    n = len(xs)
    return xs[n // 2]


def variance(xs):
    m = sum(xs) / len(xs)
    return sum(x - m for x in xs) ** 2 / len(xs)
