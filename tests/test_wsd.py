"""schedule=wsd: the factor curve of each decay shape, the budget-branch plan, the refusals of impossible
schedules and branches (core/train/config/wsd.py, schemas.py, rules.py), and compare.py --scaling reading budgets
(core/report/scaling.py). The runs with branches are in tests/test_branches.py."""

from __future__ import annotations

import json
import math
import os
import signal
from dataclasses import asdict
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict
from test_compare import done, write_run

from archsweep.core.report import compare
from archsweep.core.report.runs import load_run
from archsweep.core.report.scaling import run_points
from archsweep.core.train.config import rules
from archsweep.core.train.config.schemas import check_schemas
from archsweep.core.train.config.wsd import Branch, branch_plan
from archsweep.core.train.lifecycle.branches import BRANCH_DIR, STATE, Budgets, stable_path, stable_points
from archsweep.core.train.lifecycle.checks import build_task
from archsweep.core.train.lifecycle.interrupts import Interrupted, StopOnSignal
from archsweep.core.train.optimisers.optim import wsd, wsd_factor
from archsweep.core.train.runs.results import Results

CONF = Path(__file__).resolve().parents[1] / "conf"

# warm-up 2, 10 steps, decay over the last 3 (steps 7, 8, 9 at progress 1/3, 2/3, 1)
STABLE = [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
CURVES = {
    "linear": [2 / 3, 1 / 3, 0.0],
    "cosine": [0.75, 0.25, 0.0],  # (1 + cos(pi/3)) / 2, (1 + cos(2 pi/3)) / 2
    "1-sqrt": [1 - math.sqrt(1 / 3), 1 - math.sqrt(2 / 3), 0.0],
}


@pytest.mark.parametrize("shape", CURVES)
def test_the_factor_warms_up_holds_then_decays_by_its_shape_to_the_floor(shape):
    assert [wsd_factor(s, 2, 10, 0.3, shape, 0.0) for s in range(10)] == pytest.approx(STABLE + CURVES[shape])
    floor = [0.1 + 0.9 * f for f in CURVES[shape]]  # min_lr_ratio 0.1: the same fall onto the floor
    assert [wsd_factor(s, 2, 10, 0.3, shape, 0.1) for s in range(7, 12)] == pytest.approx(floor + [0.1, 0.1])


def test_the_scheduler_sets_those_rates_step_by_step():
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scheduler = wsd(optimizer, warmup_steps=2, total_steps=10, decay_fraction=0.3, decay_shape="linear",
                    min_lr_ratio=0.0)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.5 * f for f in STABLE + CURVES["linear"]])


def test_the_branch_plan_shares_the_stable_phase_and_decays_each_budget_over_its_own_share():
    assert branch_plan(1000, 0.2, [0.25, 0.5]) == [Branch(0.25, 250, 200), Branch(0.5, 500, 400),
                                                   Branch(1.0, 1000, 800)]
    assert branch_plan(1000, 0.2, [0.1, 1.0]) == [Branch(0.1, 100, 80), Branch(1.0, 1000, 800)]
    assert branch_plan(1000, 0.2, []) == []


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_the_default_wsd_schedule_is_accepted():
    cfg = composed("schedule=wsd", "schedule.branches=[0.25,0.5,1.0]")
    schedule = check_schemas(cfg).groups["schedule"]
    assert (schedule.decay_fraction, schedule.decay_shape, schedule.min_lr_ratio) == (0.2, "1-sqrt", 0.0)
    assert schedule.total_steps == cfg.trainer.max_steps and schedule.branches == [0.25, 0.5, 1.0]
    rules.check_rules(cfg, build_task(cfg))


REFUSED = [
    (["schedule.decay_fraction=0"], r"schedule.decay_fraction=0.0 must be in \(0, 1\]"),
    (["schedule.decay_shape=exp"], r"schedule.decay_shape='exp' must be one of linear, cosine, 1-sqrt"),
    (["schedule.min_lr_ratio=1.5"], r"schedule.min_lr_ratio=1.5 must be in \[0, 1\]"),
    (["schedule.branches=[0.5,0.25]"], r"schedule.branches=\[0.5, 0.25\] must be increasing fractions of "
                                       r"schedule.total_steps in \(0, 1\]"),
    (["schedule.branches=[0,0.5]"], r"schedule.branches=\[0.0, 0.5\] must be increasing fractions"),
    (["trainer.max_steps=100", "schedule.warmup_steps=90"],
     r"schedule.decay_fraction=0.2 of schedule.total_steps=100 starts the decay at step 80, inside the warm-up "
     r"\(schedule.warmup_steps=90\)"),
    (["trainer.max_steps=1000", "schedule.branches=[0.2,1.0]"],
     r"the branch at 0.2 of schedule.total_steps=1000 is a 200-step run whose decay would start at step 160, "
     r"inside the warm-up \(schedule.warmup_steps=200\); drop that fraction, or lower the warm-up to 160 or less"),
    (["trainer.max_steps=10", "schedule.warmup_steps=0", "schedule.branches=[0.5,0.52]"],
     r"0.5 and 0.52 of schedule.total_steps=10 are both 5 steps; drop one of them"),
    (["trainer.max_steps=10", "schedule.warmup_steps=0", "schedule.decay_fraction=1.0", "schedule.branches=[0.5]"],
     r"the branch at 0.5 .* no stable phase to branch from"),
]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_an_impossible_wsd_schedule_is_refused_with_the_numbers(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_schemas(composed("schedule=wsd", *overrides))


def test_branches_need_the_wsd_schedule():
    with pytest.raises(ValueError, match=r"schedule.branches=\[0.5\] needs schedule=wsd: budget branches decay "
                                         r"from a stable phase, which schedule=cosine does not have"):
        check_schemas(composed("schedule=cosine", "schedule.branches=[0.5]"))


def test_a_budget_that_puts_a_branch_in_the_warmup_is_refused_after_it_sets_the_steps():
    cfg = composed("schedule=wsd", "schedule.warmup_steps=20", "schedule.branches=[0.25]", "trainer.max_steps=1000")
    task = build_task(cfg)
    rules.decay_phases(cfg, task)
    with open_dict(cfg):
        cfg.trainer.max_steps = 80  # as apply_budget sets it: the 0.25 branch is 20 steps, decaying from step 16
    with pytest.raises(ValueError, match=r"the branch at 0.25 of schedule.total_steps=80 is a 20-step run whose "
                                         r"decay would start at step 16"):
        rules.decay_phases(cfg, task)


def test_branches_of_a_data_parallel_run_are_refused():
    cfg = composed("trainer=ddp", "schedule=wsd", "schedule.branches=[0.5]")
    with pytest.raises(ValueError, match=r"schedule.branches=\[0.5\] with trainer.strategy=ddp: budget branches run "
                                         r"on one device only"):
        rules.branches_on_one_process(cfg, build_task(cfg))


def budgets(flops: float, loss_at) -> list[dict]:
    return [{"fraction": f, "steps": int(1000 * f), "decay_start": int(800 * f), "tokens": int(1e6 * f),
             "flops": flops * f, "branch_train_flops": None if f == 1.0 else 0.2 * flops * f,
             "val/loss": loss_at(flops * f)} for f in (0.1, 0.2, 0.5, 1.0)]


def test_scaling_takes_every_budget_of_every_run_as_a_point(tmp_path):
    """One run per (norm, width) with branches at 0.1, 0.2, 0.5 of 1e12 FLOPs: the best width of each budget follows
    loss = 10 C^-b, the other is 5% worse; the fit goes through the 4 budgets of the frontier."""
    s = tmp_path / "branches"
    i = 0
    for norm, b in (("pre", 0.05), ("post", 0.08)):
        for width, worse in ((32, 1.0), (64, 1.05)):
            law = lambda c, b=b, worse=worse: 10 * c ** -b * worse
            flops = 1e12 * (1 + 0.004 * (width == 64))
            write_run(s / str(i), [f"norm={norm}", f"model.d_model={width}", "seed=0"],
                      done(law(flops), 0.0, 0.0, total_flops=flops, budgets=budgets(flops, law)))
            i += 1
    report = compare([s], scaling="norm")
    fits = {f.variant: f for f in report.scaling}
    for variant, b in (("pre", 0.05), ("post", 0.08)):
        fit = fits[variant]
        assert len(fit.points) == 8 and len(fit.frontier) == 4
        assert [round(c / 1e11) for c, _, _ in fit.frontier] == [1, 2, 5, 10]
        assert all("model.d_model=32, budget " in label for _, _, label in fit.frontier), fit.frontier
        assert fit.exponent == pytest.approx(b, rel=1e-6) and fit.exponent_se == pytest.approx(0, abs=1e-9)


def test_a_run_without_budgets_is_one_point_and_a_budget_without_the_metric_is_left_out(tmp_path):
    plain = write_run(tmp_path / "plain", ["norm=pre", "seed=0"], done(2.0, 0.0, 0.0, total_flops=5e11))
    branched = budgets(1e12, lambda c: 10 * c ** -0.05)
    del branched[0]["val/loss"]
    with_budgets = write_run(tmp_path / "b", ["norm=pre", "seed=1"],
                             done(2.0, 0.0, 0.0, total_flops=1e12, budgets=branched))
    assert run_points(load_run(plain), "val/loss") == {1.0: (5e11, 2.0)}
    points = run_points(load_run(with_budgets), "val/loss")
    assert sorted(points) == [0.2, 0.5, 1.0] and points[0.5] == (5e11, pytest.approx(10 * 5e11 ** -0.05))


def test_a_resume_past_a_branch_start_without_its_state_is_refused_and_a_fresh_run_forgets_old_budgets(tmp_path):
    plan = branch_plan(40, 0.2, [0.25, 0.5])  # branches of 10 and 20 steps, decaying from steps 8 and 16
    with pytest.raises(ValueError, match=r"the branch at 0.25 \(10 steps\) decays from step 8, which this run, "
                                         r"resumed at step 12, has passed without saving stable_step8.ckpt"):
        stable_points(plan, tmp_path, 12)
    (tmp_path / BRANCH_DIR).mkdir()
    stable_path(tmp_path, 8).write_bytes(b"state")
    assert stable_points(plan, tmp_path, 12).paths == {8: stable_path(tmp_path, 8), 16: stable_path(tmp_path, 16)}
    (tmp_path / BRANCH_DIR / STATE).write_text('{"budgets": []}')
    stable_points(plan, tmp_path, None)  # from step 0: what an earlier attempt recorded is not this run's
    assert not (tmp_path / BRANCH_DIR / STATE).exists()


def test_a_signal_a_branch_noted_in_its_last_step_stops_before_the_next_branch_with_that_branch_recorded(tmp_path):
    """The fit of a branch (or of the run) completes when the signal comes in its last step or final validation;
    the budget it measured is kept and the next branch does not start (it once ran, losing the signal)."""
    plan = branch_plan(40, 0.2, [0.25, 0.5, 1.0])
    fitted = []

    def fit(branch: Branch) -> tuple[dict, int | None]:
        fitted.append(branch.fraction)
        return {**asdict(branch), "val/loss": 1.0}, signal.SIGTERM if branch.fraction == 0.25 else None

    run = Results(status="completed", steps=40, total_flops=4e9, flops_per_token=1e3, splits={"val": {"loss": 0.9}})
    with pytest.raises(Interrupted) as stop:
        Budgets(plan, tmp_path).complete(run, fit)
    assert stop.value.signum == signal.SIGTERM and stop.value.step == 40 and fitted == [0.25]
    kept = json.loads((tmp_path / BRANCH_DIR / STATE).read_text())["budgets"]
    assert [b["fraction"] for b in kept] == [0.25]
    # the run's own fit noted one: no branch starts; continued without a signal, only the missing branch is fitted
    with pytest.raises(Interrupted):
        Budgets(plan, tmp_path).complete(run, fit, pending=signal.SIGINT)
    assert fitted == [0.25]
    budgets = Budgets(plan, tmp_path).complete(run, lambda b: (fit(b)[0], None))
    assert fitted == [0.25, 0.5] and [b["fraction"] for b in budgets] == [0.25, 0.5, 1.0]
    assert budgets[2]["val/loss"] == 0.9


class SignalAt(L.Callback):
    """Sends this process `signum` as the training step `step` (0-based) starts."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_signalled(step: int, max_steps: int = 3) -> tuple[StopOnSignal, L.Trainer, BaseException | None]:
    stop = StopOnSignal(None)
    trainer = L.Trainer(max_steps=max_steps, callbacks=[stop, SignalAt(step)], limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 2)), batch_size=2)
    try:
        trainer.fit(Regression(), train_dataloaders=data)
    except Interrupted as raised:
        return stop, trainer, raised
    return stop, trainer, None


def test_stop_on_signal_reports_a_signal_it_could_not_act_on():
    """A signal in a fit's last step ends the fit with the step done and nothing raised: it stays pending for the
    caller (the next budget branch must not start); one in an earlier step stops the fit, and nothing is pending."""
    stop, trainer, raised = fit_signalled(step=2)
    assert raised is None and trainer.global_step == 3 and stop.pending == signal.SIGTERM
    stop, trainer, raised = fit_signalled(step=0)
    assert raised is not None and raised.step == 1 and trainer.global_step == 1 and stop.pending is None
    stop, trainer, raised = fit_signalled(step=5)  # never sent: nothing pending
    assert raised is None and trainer.global_step == 3 and stop.pending is None
