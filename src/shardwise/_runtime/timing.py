"""Timing that is fair on a shared, noisy machine: warm-up excluded, runners alternated
round-robin within one process, medians reported."""

from __future__ import annotations

import math
import numbers
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from shardwise._errors import ArgumentError, ArgumentTypeError


def block(x: Any) -> Any:
    """Wait for a result of any library to be ready, arrays nested in any pytree too (a
    training step returns its loss and its parameters, or a Flax ``TrainState``).

    >>> block((1, [2], {"a": 3}))
    (1, [2], {'a': 3})
    """
    try:
        leaves = jax.tree_util.tree_leaves(x)
    except (TypeError, ValueError):  # (a dict whose keys do not sort, in another library's)
        items = x.values() if isinstance(x, dict) else x if isinstance(x, tuple | list) else ()
        for item in items:
            block(item)
        return x
    for leaf in leaves:
        ready = getattr(leaf, "block_until_ready", None)
        if callable(ready):
            ready()
    return x


QUIET_SECONDS = 0.01
"""Idle time before each timed turn of :func:`alternate`, in seconds: PyTorch's OpenMP
workers spin for a few milliseconds after each call, holding the cores, and would slow
whichever runner comes next."""


TURN_SECONDS = 0.2
"""Each runner's turn at the devices lasts this long at least (several calls of a small
program, their mean counted), so that the scheduler's hiccups on a shared machine average
out."""


def alternate(
    runners: Mapping[str, Callable[[], Any]], repeat: int, at_least: float = 0.0
) -> dict[str, float]:
    """Median seconds of each runner, the runners taking turns (A B C A B C …) so that
    drift in the machine's speed falls on all of them alike, each turn started on a quiet
    machine (:data:`QUIET_SECONDS`), so that no runner pays for the one before it. One
    warm-up call each first. A turn calls its runner until ``at_least`` seconds have passed
    (once at least) and counts the mean: one call of a few milliseconds is at the mercy of
    the scheduler, many in a row are not."""
    if not runners:
        return {}
    for fn in runners.values():
        block(fn())
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            time.sleep(QUIET_SECONDS)
            start = time.perf_counter()
            calls, took = 0, 0.0
            while calls == 0 or took < at_least:
                block(runners[name]())
                calls += 1
                took = time.perf_counter() - start
            times[name].append(took / calls)
    return {name: statistics.median(ts) for name, ts in times.items()}


def paired_ratio(a: Callable[[], Any], b: Callable[[], Any], pairs: int) -> float:
    """Median over back-to-back pairs of ``a``'s time ÷ ``b``'s, the order swapped every
    pair: each ratio compares two runs a few milliseconds apart, so the machine's drift
    (which moves medians taken across a whole round by several percent) cancels."""
    block(a())
    block(b())
    ratios = []
    for k in range(pairs):
        took = {}
        for name, fn in (("a", a), ("b", b)) if k % 2 == 0 else (("b", b), ("a", a)):
            start = time.perf_counter()
            block(fn())
            took[name] = time.perf_counter() - start
        ratios.append(took["a"] / took["b"])
    return statistics.median(ratios)


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls after one warm-up call."""
    block(fn())
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def best_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Fastest of ``repeat`` calls after one warm-up call (for a machine's limits)."""
    block(fn())
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        block(fn())
        best = min(best, time.perf_counter() - start)
    return best


def check_seconds(value: float, what: str, least: float, most: float) -> float:
    """``value``, a number of seconds from ``least`` to ``most``, as a float (a timeout).

    >>> check_seconds(30, "--timeout", 1, 86400)
    30.0
    >>> check_seconds(float("inf"), "--timeout", 1, 86400)
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: --timeout inf is not a number of seconds from 1 to 86400: ...
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"{what} is {type(value).__name__} {value!r}; give a number of seconds, e.g. 30."
        )
    if not (math.isfinite(value) and least <= value <= most):
        raise ArgumentError(
            f"{what} {value!r} is not a number of seconds from {least:g} to {most:g}: give "
            f"one in that range, e.g. {what} 30."
        )
    return float(value)


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Spearman rank correlation of predicted and measured times (ties share their mean
    rank), rounded to 4 places; ``None`` for fewer than 3 pairs or where either side is
    constant. (``scipy.stats.spearmanr`` says the same, but importing ``scipy.stats`` takes
    seconds, which a verify from the command line would pay each time.)

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 25])
    0.8
    """
    if len(predicted) < 3:
        return None
    a, b = _ranks(predicted), _ranks(measured)
    if a.std() == 0 or b.std() == 0:
        return None
    return round(float(np.corrcoef(a, b)[0, 1]), 4)


def _ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank."""
    arr = np.asarray(x, dtype=float)
    order = arr.argsort(kind="stable")
    r = np.empty(len(arr))
    r[order] = np.arange(len(arr), dtype=float)
    for v in np.unique(arr):
        tie = arr == v
        r[tie] = r[tie].mean()
    return r


SEPARATED = 1.25
"""Two plans' measured medians are told apart where one is this many times the other: on
simulated CPU devices plans within it trade places from one run to the next."""


def ordered_pairs(
    predicted: Sequence[float], measured: Sequence[float], apart: float = SEPARATED
) -> tuple[float | None, int]:
    """Of the pairs of plans whose measured times differ by more than ``apart`` times, the
    share the prediction orders alike, and how many such pairs there are (``None`` for the
    share where there is none): a ranking's accuracy where the machine can tell plans apart.

    >>> ordered_pairs([1, 2, 3], [1.0, 1.1, 3.0])  # (1, 2) too close to tell apart
    (1.0, 2)
    >>> ordered_pairs([3, 2, 1], [1.0, 2.0, 4.0])
    (0.0, 3)
    """
    right = told = 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            lo, hi = sorted((measured[i], measured[j]))
            if hi <= apart * lo:
                continue
            told += 1
            right += (predicted[i] - predicted[j]) * (measured[i] - measured[j]) > 0
    return (round(right / told, 4) if told else None), told
