"""Timing helpers shared by the benchmarks: medians of repeated runs, printed as ratios."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable

from numba import njit, prange


def median_seconds(function: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(functions: dict[str, Callable[[], object]], repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per function, timed round-robin so that machine drift hits all alike."""
    for function in functions.values():
        for _ in range(warmup):
            function()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def repeats_for(size: int) -> int:
    return max(10, min(300, int(3e8 / max(size, 1) / 20)))


@njit(cache=True, parallel=True, error_model="numpy")
def seven_stream_probe(param, grad, exp_avg, exp_avg_sq):
    """The physical floor of an AdamW step: read p, g, m, v and write p, m, v once, no math."""
    for i in prange(param.shape[0]):
        g = grad[i]
        exp_avg[i] = exp_avg[i] + g
        exp_avg_sq[i] = exp_avg_sq[i] + g
        param[i] = param[i] + g


@njit(cache=True, parallel=True, error_model="numpy")
def two_stream_probe(source, target):
    """The physical floor of an elementwise call or a row function that writes every element:
    read x and write the result once (both flat), no math."""
    for i in prange(source.shape[0]):
        target[i] = source[i]


@njit(cache=True, parallel=True, error_model="numpy")
def plain_adamw_loop(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    decay_factor,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    step_size,
    inverse_bias_correction2_sqrt,
):
    """The arithmetic floor of an exact AdamW step: the seven streams plus AdamW's one square
    root and one division per element, with no options (no mask, AMP, maximize). In cache,
    this and not the probe bounds any IEEE-exact AdamW."""
    for i in prange(param.shape[0]):
        g = grad[i]
        m = exp_avg[i] + one_minus_beta1 * (g - exp_avg[i])
        v = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g
        param[i] = param[i] * decay_factor + -step_size * m / (math.sqrt(v) * inverse_bias_correction2_sqrt + eps)
        exp_avg[i] = m
        exp_avg_sq[i] = v


def machine() -> str:
    import os

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(cell).rjust(width) for cell, width in zip(cells, widths))

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
