"""Pruned tuning by successive halving (src/core/train/runs/halving.py, hydra/sweeper=halving): which values survive
a rung, and a sweep through the real sweeper and Hydra's launcher of a stand-in app with a planted loss
(tests/halving_app.py): it keeps each cell's known best rate, launches only the survivors, and re-run after a kill it
does not redo a rung a job has finished."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import scripts

from archsweep.core.train.runs.halving import Job, jobs_of, keep, reached, rung_score, survivors

ROOT = Path(__file__).resolve().parents[1]
APP = Path(__file__).with_name("halving_app.py")


def grid(cells=("a", "b"), lrs=("1e-4", "1e-3", "1e-2", "1e-1"), seeds=(0, 1)) -> list[Job]:
    return jobs_of([[f"cell={c}", f"optim.lr={lr}", f"seed={s}"] for c in cells for lr in lrs for s in seeds],
                   "optim.lr")


def test_jobs_fall_into_cells_by_everything_but_the_tuned_key_and_the_seed():
    jobs = grid()
    assert len(jobs) == 16 and [j.id for j in jobs] == list(range(16))
    assert {j.cell for j in jobs} == {("cell=a",), ("cell=b",)}
    assert (jobs[3].value, jobs[3].seed) == ("1e-3", "1")
    with pytest.raises(ValueError, match="must vary it over at least 2 values"):
        jobs_of([["cell=a", "optim.lr=1e-3", "seed=0"]], "optim.lr")


def test_each_cell_keeps_its_best_values_by_the_mean_over_seeds():
    jobs = grid()
    # cell a: 1e-3 best on average though seed 1 of 1e-2 beats it; cell b: 1e-1 best; lower is better
    a = {"1e-4": (3.0, 3.0), "1e-3": (1.0, 1.2), "1e-2": (1.5, 0.9), "1e-1": (2.0, 2.0)}
    b = {"1e-4": (4.0, 4.0), "1e-3": (3.0, 3.0), "1e-2": (2.0, 2.0), "1e-1": (1.0, 1.0)}
    table = {"cell=a": a, "cell=b": b}
    scores = {j.id: table[j.cell[0]][j.value][int(j.seed)] for j in jobs}
    kept = survivors(jobs, scores, eta=2)
    assert sorted({(j.cell[0], j.value) for j in kept}) == [("cell=a", "1e-2"), ("cell=a", "1e-3"),
                                                           ("cell=b", "1e-1"), ("cell=b", "1e-2")]
    assert {(j.cell[0], j.value) for j in survivors(jobs, scores, eta=4)} == {("cell=a", "1e-3"), ("cell=b", "1e-1")}
    # higher is better: the order turns over
    assert {(j.cell[0], j.value) for j in survivors(jobs, scores, eta=4, lower_better=False)} == {
        ("cell=a", "1e-4"), ("cell=b", "1e-4")}
    # a value with a seed that has no score (failed, diverged) ranks last, even where its other seed is best
    scores[next(j.id for j in jobs if j.cell == ("cell=b",) and j.value == "1e-1" and j.seed == "0")] = None
    assert {j.value for j in survivors(jobs, scores, eta=4) if j.cell == ("cell=b",)} == {"1e-2"}
    assert [keep(n, 3) for n in (1, 2, 3, 4, 9, 10)] == [1, 1, 1, 2, 3, 4]


def test_a_rung_is_scored_on_its_branch_and_reached_by_a_pause_at_or_beyond_it():
    results = {"status": "paused", "paused": {"at": 0.5, "step": 45},
               "budgets": [{"fraction": 0.25, "val/loss": 2.0}, {"fraction": 0.5, "val/loss": 1.5}]}
    assert rung_score(results, 0.5, "val/loss") == 1.5 and rung_score(results, 0.25, "val/loss") == 2.0
    assert rung_score(results, 1.0, "val/loss") is None and rung_score(None, 0.5, "val/loss") is None
    assert rung_score({"budgets": [{"fraction": 0.5, "val/loss": math.nan}]}, 0.5, "val/loss") is None
    assert reached(results, 0.25) and reached(results, 0.5) and not reached(results, 0.75)
    assert not reached(results, None)  # the end is not reached by a pause
    assert reached({"status": "diverged"}, 0.25) and reached({"status": "completed"}, None)
    assert not reached({"status": "interrupted"}, 0.25) and not reached(None, 0.25)


def sweep(sweep_dir: Path, env: dict | None = None, launcher: tuple[str, ...] = ()):
    return scripts.run([sys.executable, str(APP), "-m", "hydra/sweeper=halving", "hydra.sweeper.rungs=[0.25,0.5]",
                        "hydra.sweeper.eta=2", "cell=a,b", "optim.lr=1e-4,1e-3,1e-2,1e-1", "seed=0,1",
                        f"hydra.sweep.dir={sweep_dir}", *launcher], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, **(env or {})})


def launches(sweep_dir: Path) -> list[tuple[str, float | None]]:
    return [(r["job"], r["pause_at"]) for r in map(json.loads, (sweep_dir / "launches.jsonl").read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [(), ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2"),
                                      ("hydra/launcher=submitit_local",)], ids=["basic", "joblib", "submitit"])
def test_a_halving_sweep_keeps_each_cells_best_rate_and_trains_only_survivors(tmp_path, launcher):
    out = sweep(tmp_path / "sweep", launcher=launcher)
    assert out.returncode == 0, out.stderr
    state = json.loads((tmp_path / "sweep" / "halving.json").read_text())
    final = {json.loads((tmp_path / "sweep" / str(i) / "results.json").read_text())["status"] for i in state["final"]}
    assert final == {"completed"}
    jobs = grid(lrs=("1e-4", "1e-3", "1e-2", "1e-1"))
    assert sorted({(jobs[i].cell[0], jobs[i].value) for i in state["final"]}) == [("cell=a", "1e-3"),
                                                                                  ("cell=b", "1e-2")]
    # 16 jobs to 0.25, the best half (8) to 0.5, the best of each cell (4 jobs) to the end; each in its own folder
    assert [len([x for x in launches(tmp_path / "sweep") if x[1] == p]) for p in (0.25, 0.5, None)] == [16, 8, 4]
    assert sorted(int(p.name) for p in (tmp_path / "sweep").iterdir() if p.name.isdigit()) == list(range(16))
    assert [len(r["kept"]) for r in state["rungs"]] == [8, 4]
    assert "halving: rung 0.25 kept 4 of 8 optim.lr values (8 jobs) by val/loss" in out.stderr + out.stdout


@pytest.mark.slow
def test_a_halving_sweep_killed_mid_rung_and_re_run_redoes_no_finished_rung(tmp_path):
    s = tmp_path / "sweep"
    killed = sweep(s, {"ARCHSWEEP_TEST_KILL": "12:0.5"})  # a survivor of cell b, in the second rung
    assert killed.returncode == -9  # SIGKILL
    first = launches(s)
    assert first[-1] == ("12", 0.5) and ("12", None) not in first
    again = sweep(s, {"ARCHSWEEP_TEST_KILL": "12:0.5"})  # the marker makes the kill happen once
    assert again.returncode == 0, again.stderr
    second = launches(s)[len(first):]
    finished = set(first[:-1])  # every launch before the killed one completed
    assert not finished & set(second), finished & set(second)
    assert ("12", 0.5) in second and len([x for x in second if x[1] == 0.25]) == 0
    state = json.loads((s / "halving.json").read_text())
    assert len(state["final"]) == 4 and len(state["rungs"]) == 2


def test_compare_reports_the_flops_spent_and_each_budgets_rank_agreement_with_the_end(tmp_path):
    """A tuned sweep whose runs recorded a budget branch at 0.5: pre-norm's rates rank at 0.5 as at the end (tau
    +1), post-norm's the other way round (tau -1), so the mean is 0; every run spent 100 FLOPs and its branch 10."""
    from test_compare import done, write_run

    from archsweep.core.report import compare, terminal

    s = tmp_path / "sweep"
    final = {"pre": (1.0, 1.1, 1.2), "post": (1.3, 1.4, 1.5)}
    early = {"pre": (2.0, 2.1, 2.2), "post": (2.5, 2.4, 2.3)}
    for norm in ("pre", "post"):
        for i, lr in enumerate(("1e-3", "3e-3", "1e-2")):
            for seed in (0, 1):
                results = {**done(final[norm][i] + 0.01 * seed, 0.5, 0.5, seed=seed), "total_flops": 100.0,
                           "budgets": [{"fraction": 0.5, "steps": 5, "val/loss": early[norm][i] + 0.01 * seed,
                                        "branch_train_flops": 10.0},
                                       {"fraction": 1.0, "steps": 10, "val/loss": final[norm][i] + 0.01 * seed,
                                        "branch_train_flops": None}]}
                write_run(s / f"{norm}{i}{seed}", [f"norm={norm}", f"optim.lr={lr}", f"seed={seed}"], results)
    report = compare([s], tune=["optim.lr"], sort="test/loss")
    p = report.pruning
    assert (p.spent, p.full, p.share) == (1320.0, 1200.0, 1.1)
    (a,) = p.agreement
    assert (a.fraction, a.tau, a.cells, a.values) == (0.5, 0.0, 2, 6)
    text = terminal(report)
    assert ("Training FLOPs spent: 1.32e+03 (pruned runs and cool-down branches included), 110% of the full "
            "grid's 1.2e+03") in text
    assert "Kendall's tau of each cell's optim.lr values" in text and "0.5: +0.00 (2 cells, 6 values)" in text


@pytest.mark.slow
def test_with_sequential_seeds_the_sweep_adds_seeds_until_the_comparison_is_decided(tmp_path):
    """After the rungs, cell b (0.1 worse at its best rate, seed noise 0.01) against the baseline cell a is open
    at 2 seeds; the sweeper adds seeds 2 and 3 to both, at each cell's chosen rate, and stops once it is decided."""
    from archsweep.core.report import compare

    s = tmp_path / "sweep"
    block = "+compare={tune:[optim.lr],baseline:'cell=a',metric:'test/loss',sequential:true,max_seeds:6,seed_batch:2}"
    out = scripts.run([sys.executable, str(APP), "-m", "hydra/sweeper=halving", "hydra.sweeper.rungs=[0.25,0.5]",
                       "hydra.sweeper.eta=2", "hydra.sweeper.sequential=true", "cell=a,b",
                       "optim.lr=1e-4,1e-3,1e-2,1e-1", "seed=0,1", block, f"hydra.sweep.dir={s}"],
                      cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    added = [x for x in launches(s) if int(x[0]) >= 16]
    assert sorted(added) == [(str(i), None) for i in range(16, 20)]  # seeds 2, 3 of both cells, to the end
    state = json.loads((s / "halving.json").read_text())
    assert sorted(state["seeds"]) == ["12:2", "12:3", "2:2", "2:3"]  # each cell's chosen-rate job, re-seeded
    report = compare([s])
    b = next(c for c in report.cells if c.values["cell"] == "b")
    assert (b.test.verdict, b.test.seeds_used, b.tuning.chosen.values) == ("worse", 4, {"optim.lr": "0.01"})
    assert report.runs("paused") and len(report.runs("completed")) == 8


TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=24",
        "trainer.val_check_interval=12", "trainer.log_every_n_steps=6", "logger=csv", "schedule=wsd",
        "schedule.warmup_steps=1", "eval.decode_samples=0", "diagnostics.attention_maps=false", "threads=1"]


def spent(results: dict) -> float:
    """A run's training FLOPs, read here from its results.json: its own and its branches' decays."""
    return results["total_flops"] + sum(b["branch_train_flops"] or 0.0 for b in results.get("budgets") or [])


@pytest.mark.slow
def test_a_real_halving_sweep_continues_survivors_and_reports_the_flops_its_runs_spent(tmp_path):
    from archsweep.core.report import compare

    s = tmp_path / "sweep"
    out = scripts.run([sys.executable, "train.py", "-m", *TINY, "hparams_search=halving",
                       "hydra.sweeper.rungs=[0.25,0.5]", "norm=pre,post", "optim.lr=1e-4,3e-3,3e-1", "seed=0,1",
                       "compare.baseline='norm=pre'", "compare.max_seeds=2", f"hydra.sweep.dir={s}",
                       f"output_root={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                      env={**os.environ, "WANDB_MODE": "disabled"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    state = json.loads((s / "halving.json").read_text())
    assert [len(r["jobs"]) for r in state["rungs"]] == [12, 4] and len(state["final"]) == 4
    runs = {int(p.name): json.loads((p / "results.json").read_text()) for p in s.iterdir() if p.name.isdigit()}
    assert len(runs) == 12
    for job, res in runs.items():
        if job in state["final"]:  # trained on from its pause, not again from step 0
            assert res["status"] == "completed" and res["steps"] == 24 and res["resumed_from"]
            assert [b["fraction"] for b in res["budgets"]] == [0.25, 0.5, 1.0]
        else:
            at = 0.5 if job in state["rungs"][1]["jobs"] else 0.25
            assert res["status"] == "paused" and res["paused"]["at"] == at and res["steps"] < 24
    report = compare([s])
    assert report.pruning.spent == pytest.approx(sum(spent(r) for r in runs.values()), rel=1e-12)
    assert report.pruning.share < 0.75  # 12 runs to a quarter, 4 to a half, 4 to the end: about 0.6 of 12 full runs


def test_the_replay_of_a_full_grid_prunes_on_its_budgets_and_stops_seeds_at_the_decision(tmp_path):
    """A full grid (2 cells x 3 rates x 4 seeds) whose runs recorded a budget at 0.5: every run spent 100 FLOPs, and
    its 0.5 budget 55 (45 to the decay start, 10 of decay). Replayed at rung 0.5 with eta 3 on seeds 0, 1: each cell
    pauses its two worse rates there (4 runs x 55) and keeps its best, and post-norm, 0.5 worse on every seed,
    is decided at the first look, so each cell runs 2 seeds of its best rate (2 x 110): 440 of the grid's 1200."""
    from test_compare import done, write_run

    from archsweep.core.report import compare
    from archsweep.core.report.pruning import paused_cost, replay
    from archsweep.core.report.sequential import Design

    s = tmp_path / "grid"
    best = {"pre": "3e-3", "post": "1e-2"}
    for norm in ("pre", "post"):
        for lr in ("1e-3", "3e-3", "1e-2"):
            for seed in range(4):
                gap = 0.0 if lr == best[norm] else 0.3
                worse = 0.5 + 1e-4 * seed if norm == "post" else 0.0
                end = 1.0 + worse + gap + 0.01 * seed
                budgets = [{"fraction": 0.5, "steps": 5, "flops": 55.0, "branch_train_flops": 10.0,
                            "val/loss": end + 1.0},
                           {"fraction": 1.0, "steps": 10, "flops": 100.0, "branch_train_flops": None, "val/loss": end}]
                results = {**done(end, 0.5, 0.5, seed=seed), "test": {"loss": end}, "total_flops": 100.0,
                           "budgets": budgets, "compare": {"tune": ["optim.lr"], "baseline": "norm=pre"}}
                write_run(s / f"{norm}{lr}{seed}", [f"norm={norm}", f"optim.lr={lr}", f"seed={seed}"], results)
    report = compare([s])
    cells = {c.values["norm"]: c for c in report.cells}
    assert paused_cost(cells["pre"].runs[0], 0.5) == 55.0 and paused_cost(cells["pre"].runs[0], 0.25) is None
    design = Design(0.05, None, 2, 2, 4, 1)
    out = {r.label: r for r in replay(report.cells, "optim.lr", "val/loss", True, [0.5], 3, 2, design,
                                      report.significance.baseline_of, "test/loss", True)}
    post, pre = out["norm=post"], out["norm=pre"]
    assert (post.chosen, post.rungs, post.seeds, post.verdict) == ("0.01", [3, 1], 2, "worse")
    assert (pre.chosen, pre.rungs, pre.seeds, pre.verdict) == ("0.003", [3, 1], 2, None)
    assert post.flops == pre.flops == 4 * 55.0 + 2 * 110.0
