"""Schedules of a decentralized run: the learning rate on tokens seen (warmup then cosine),
the Chinchilla budget in steps, and the adaptive consensus strength γ."""

from __future__ import annotations

import math
from dataclasses import dataclass


from steadystep import checks
from steadystep.training_stability import chinchilla_step_count, warmup_cosine_lr

__all__ = [
    "AdaptiveConsensus",
    "TokenSchedule",
    "budget_steps",
    "token_lr",
]


def token_lr(
    step: int,
    *,
    workers: int,
    batch: int,
    context: int,
    warmup_tokens: float,
    total_tokens: float,
    base_lr: float,
    min_lr: float = 0.0,
) -> float:
    """Warmup + cosine learning rate on tokens seen = step·N·B·C (SPEC §4)."""
    checks.counts(step=(step, 0), workers=(workers, 1), batch=(batch, 1), context=(context, 1))
    return warmup_cosine_lr(
        float(step * workers * batch * context), float(warmup_tokens), float(total_tokens), base_lr, min_lr
    )


def budget_steps(num_params: int, *, workers: int, batch: int, context: int) -> int:
    """Chinchilla budget (≈20 tokens per parameter of one local model) in steps of N·B·C tokens."""
    checks.counts(num_params=(num_params, 0), workers=(workers, 1), batch=(batch, 1), context=(context, 1))
    return int(chinchilla_step_count(float(num_params), float(workers * batch * context)))


@dataclass(frozen=True)
class TokenSchedule:
    """[`token_lr()`][steadystep.decentral.token_lr] as a function of the step alone, for
    trainers that take ``lr(step)``: warmup then cosine on tokens seen = step·N·B·C. ``peak`` is ``base_lr`` and
    ``total_steps`` the steps the token budget lasts (what an adaptive γ is scaled by).

    >>> schedule = TokenSchedule(workers=8, batch=4, context=64, warmup_tokens=2048 * 10, total_tokens=2048 * 100,
    ...                          base_lr=1e-3)
    >>> schedule(10), schedule(100), schedule.total_steps    # warmup over, then cosine down to min_lr
    (0.001, 0.0, 100)
    """

    workers: int
    batch: int
    context: int
    warmup_tokens: float
    total_tokens: float
    base_lr: float
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        checks.counts(workers=(self.workers, 1), batch=(self.batch, 1), context=(self.context, 1))
        checks.non_negative(
            warmup_tokens=self.warmup_tokens, total_tokens=self.total_tokens, base_lr=self.base_lr, min_lr=self.min_lr
        )

    def __call__(self, step: int) -> float:
        return token_lr(
            step,
            workers=self.workers,
            batch=self.batch,
            context=self.context,
            warmup_tokens=self.warmup_tokens,
            total_tokens=self.total_tokens,
            base_lr=self.base_lr,
            min_lr=self.min_lr,
        )

    @property
    def peak(self) -> float:
        return float(self.base_lr)

    @property
    def total_steps(self) -> int:
        return math.ceil(self.total_tokens / (self.workers * self.batch * self.context))


@dataclass(frozen=True)
class AdaptiveConsensus:
    """Consensus strength that follows the learning rate: γ_t = (lr_t / lr_max)^power once
    t ≥ start·total_steps, and 1 (full mixing) before. As the learning rate decays the
    workers mix less, and the update noise that mixing averages out shrinks with it.

    >>> gamma = AdaptiveConsensus(power=2.0, start=0.5)
    >>> gamma(step=10, total_steps=100, lr=0.5, peak_lr=1.0), gamma(step=60, total_steps=100, lr=0.5, peak_lr=1.0)
    (1.0, 0.25)
    """

    power: float = 1.0
    start: float = 0.0  # the fraction of the run after which γ follows the learning rate

    def __post_init__(self) -> None:
        checks.non_negative(power=self.power)
        if not 0.0 <= self.start <= 1.0:
            raise ValueError(f"start must be a fraction of the run in [0, 1]; got {self.start!r}")

    def __call__(self, *, step: int, total_steps: int, lr: float, peak_lr: float) -> float:
        if step < self.start * total_steps or peak_lr <= 0.0:
            return 1.0
        return float(min(1.0, max(0.0, lr / peak_lr)) ** self.power)
