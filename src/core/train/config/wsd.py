"""The arithmetic of warmup-stable-decay schedules and their budget branches (Hägele et al. 2024, "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations", https://arxiv.org/abs/2405.18392): a warm-up, a constant
rate, then a decay over the last `decay_fraction` of the steps. Because the stable phase does not depend on the
length of the run, one run serves several budgets: a branch of budget B takes the run's state where B's decay would
start and decays from there over B's own decay steps.

Pure Python (the schemas, rules and optim.py share it; no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SHAPES = ("linear", "cosine", "1-sqrt")  # schedule.decay_shape
FRACTION_TOLERANCE = 1e-9  # budget fractions closer than this are the same budget (pause_at against branches)


def decay_steps(total_steps: int, decay_fraction: float) -> int:
    """Optimiser steps of the decay of a `total_steps` run (at least 1)."""
    return max(1, round(decay_fraction * total_steps))


def decay_start(total_steps: int, decay_fraction: float) -> int:
    """Steps taken before the decay begins: the stable phase ends here."""
    return total_steps - decay_steps(total_steps, decay_fraction)


def decayed(progress: float, shape: str) -> float:
    """The decay's factor from 1 (progress 0) to 0 (progress 1)."""
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(progress)
    raise ValueError(f"schedule.decay_shape={shape!r} must be one of {', '.join(SHAPES)}")


@dataclass(frozen=True)
class Branch:
    """One budget of a run with branches: `steps` optimiser steps, decaying from `decay_start`."""

    fraction: float  # of the run's total_steps
    steps: int
    decay_start: int


def branch_plan(total_steps: int, decay_fraction: float, fractions: list[float]) -> list[Branch]:
    """The budgets of a run whose schedule.branches are `fractions` (the run itself, fraction 1.0, included), in
    increasing order; [] without branches. ValueError naming the fraction when one cannot be a budget."""
    if not fractions:
        return []
    plan = []
    for fraction in sorted({*fractions, 1.0}):
        steps = round(fraction * total_steps)
        if steps < 1:
            raise ValueError(f"schedule.branches: {fraction} of schedule.total_steps={total_steps} is no step at "
                             f"all; drop it or raise trainer.max_steps (or the budget)")
        if plan and steps == plan[-1].steps:
            raise ValueError(f"schedule.branches: {plan[-1].fraction} and {fraction} of schedule.total_steps="
                             f"{total_steps} are both {steps} steps; drop one of them")
        plan.append(Branch(fraction, steps, decay_start(steps, decay_fraction)))
    return plan


def branch_at(plan: list[Branch], fraction: float) -> Branch | None:
    """The budget of `plan` at `fraction` (within FRACTION_TOLERANCE), None when it has none."""
    return next((b for b in plan if abs(b.fraction - fraction) <= FRACTION_TOLERANCE), None)


def check_phases(warmup_steps: int, total_steps: int, decay_fraction: float, fractions: list[float]) -> None:
    """The warm-up ends before the decay starts, for the run and for each of its branches. ValueError with the
    numbers and the fix."""
    start = decay_start(total_steps, decay_fraction)
    if start < warmup_steps:
        raise ValueError(f"schedule.decay_fraction={decay_fraction} of schedule.total_steps={total_steps} starts the "
                         f"decay at step {start}, inside the warm-up (schedule.warmup_steps={warmup_steps}); lower "
                         f"the warm-up or the decay fraction, or raise trainer.max_steps (or the budget)")
    for branch in branch_plan(total_steps, decay_fraction, fractions):
        if branch.fraction < 1.0 and branch.decay_start < 1:
            raise ValueError(f"schedule.branches: the branch at {branch.fraction} of schedule.total_steps="
                             f"{total_steps} is a {branch.steps}-step run with no stable phase to branch from (its "
                             f"decay would start at step 0); drop that fraction or lower schedule.decay_fraction")
        if branch.decay_start < warmup_steps:
            raise ValueError(f"schedule.branches: the branch at {branch.fraction} of schedule.total_steps="
                             f"{total_steps} is a {branch.steps}-step run whose decay would start at step "
                             f"{branch.decay_start}, inside the warm-up (schedule.warmup_steps={warmup_steps}); drop "
                             f"that fraction, or lower the warm-up to {branch.decay_start} or less")
