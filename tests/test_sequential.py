"""The sequential seeds design (src/core/report/sequential.py): its evidence against a reference computed another
way, its error rates over thousands of simulated comparisons, and its cost against the fixed design."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import integrate, stats

from archsweep.core.report.sequential import (
    EQUIVALENT,
    HIGHER,
    LOWER,
    MAXIMUM,
    OPEN,
    SCALES,
    Design,
    critical_t,
    decide_many,
    e_value,
    log_e_value,
    sequence,
    simulate,
)
from archsweep.core.report.significance import seeds_needed


def reference_factor(t: float, n: int, g: float) -> float:
    """The Bayes factor by integrating the noncentral t density of t over the prior N(0, g) of the standardised
    difference, divided by the central t density: no closed form involved."""
    nu = n - 1
    dens = lambda delta: stats.nct.pdf(t, nu, delta * math.sqrt(n)) * stats.norm.pdf(delta, 0, math.sqrt(g))
    sd = math.sqrt(g)
    value, _ = integrate.quad(dens, -12 * sd, 12 * sd, points=[0.0, t / math.sqrt(n)], limit=400)
    return value / stats.t.pdf(t, nu)


@pytest.mark.parametrize("n,t", [(2, 0.5), (3, 2.0), (4, -3.1), (6, 1.0), (10, 4.2)])
def test_each_scales_factor_equals_the_integral_over_its_prior(n, t):
    for g in (1.0, 4.0, 16.0):
        closed = float(np.exp(log_e_value(t, n, [g])))
        assert closed == pytest.approx(reference_factor(t, n, g), rel=1e-6)


def test_the_mixture_is_the_mean_of_its_scales_and_grows_with_the_evidence():
    t, n = 2.5, 5
    single = [float(np.exp(log_e_value(t, n, [g]))) for g in SCALES]
    assert float(np.exp(log_e_value(t, n))) == pytest.approx(sum(single) / len(single), rel=1e-12)
    values = [float(log_e_value(x, n)) for x in (0.0, 1.0, 2.0, 4.0, 8.0)]
    assert values == sorted(values) and values[0] < 0 < values[-1]  # no evidence at t=0: below 1


def test_the_critical_t_gives_the_factor_one_over_the_level():
    for n, level in ((3, 0.05), (6, 0.01), (10, 0.05 / 9)):
        crit = critical_t(n, level)
        assert float(np.exp(log_e_value(crit, n))) == pytest.approx(1 / level, rel=1e-8)
    assert math.isinf(critical_t(2, 0.001))  # 2 seeds cannot give a factor of 1000 with these scales


def test_the_factor_of_a_sample_is_its_t_statistics():
    diffs = [0.3, 0.5, 0.1, 0.45]
    t = np.mean(diffs) / (np.std(diffs, ddof=1) / 2)
    assert e_value(diffs) == pytest.approx(float(np.exp(log_e_value(t, 4))), rel=1e-12)
    assert e_value([d + 1.0 for d in diffs], null=1.0) == pytest.approx(e_value(diffs), rel=1e-12)
    assert e_value([0.2]) == 1.0  # one seed: no evidence


def test_a_sequence_stops_at_the_first_decision_with_a_running_interval():
    design = Design(alpha=0.05, detect=0.5, max_seeds=10)
    clear = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98, 1.01, 0.99]
    out = sequence(clear, design)
    assert out.decision == HIGHER and out.seeds < 10 and out.looks[-1].low > 0
    assert out.p <= 0.05 and out.p == pytest.approx(1 / max(look.e for look in out.looks))
    assert sequence([-x for x in clear], design).decision == LOWER
    near_zero = [0.01, -0.02, 0.015, -0.01, 0.0, 0.005, -0.005, 0.01, -0.01, 0.0]
    same = sequence(near_zero, design)
    assert same.decision == EQUIVALENT and -0.5 < same.looks[-1].low and same.looks[-1].high < 0.5
    lows = [look.low for look in same.looks]
    assert lows == sorted(lows)  # the running intersection only narrows
    assert sequence(near_zero[:3], design).decision == OPEN and sequence(near_zero[:3], design).next_seeds == 4
    noisy = list(np.random.default_rng(3).normal(0.0, 5.0, 10))
    assert sequence(noisy, Design(detect=0.5)).decision == MAXIMUM


def test_the_vectorised_decisions_equal_the_sequence_one_comparison_at_a_time():
    design = Design(alpha=0.05, detect=1.0, max_seeds=12, comparisons=3)
    rng = np.random.default_rng(7)
    data = rng.normal(rng.choice([0.0, 0.8, 2.5], size=(300, 1)), 1.0, size=(300, 12))
    decided, seeds = decide_many(data, design)
    for row, decision, used in zip(data, decided, seeds, strict=True):
        one = sequence(list(row), design)
        assert (one.decision, one.seeds) == (decision, used)


def test_with_no_true_difference_the_false_positive_rate_is_within_the_level():
    """5,000 simulated comparisons per design, each looked at after every batch: the share declared different is
    at most alpha (it is about a quarter of it: Ville's bound is not tight)."""
    for design in (Design(alpha=0.05, detect=1.0, max_seeds=10), Design(alpha=0.05, max_seeds=20, batch=1),
                   Design(alpha=0.10, detect=0.5, max_seeds=16, comparisons=2)):
        out = simulate(0.0, 1.0, design, trials=5000, seed=11)
        false = out.decisions.get(HIGHER, 0.0) + out.decisions.get(LOWER, 0.0)
        assert false <= design.level, (design, out)
    # the simulation can see the failure it guards against: a plain t-test at each of the same looks, stopping at
    # the first p < alpha, declares a difference far more often than alpha
    design = Design(alpha=0.05, max_seeds=20, batch=1)
    data = np.random.default_rng(11).normal(0.0, 1.0, size=(5000, 20))
    naive = np.zeros(5000, dtype=bool)
    for n in design.looks():
        naive |= stats.ttest_1samp(data[:, :n], 0.0, axis=1).pvalue < 0.05
    assert naive.mean() > 2 * 0.05
    # the same at a true difference equal to the detectable one, for the claim "no difference as large as X"
    design = Design(alpha=0.05, detect=1.0, max_seeds=16)
    assert simulate(1.0, 1.0, design, trials=5000, seed=12).decisions.get(EQUIVALENT, 0.0) <= 0.05


def test_a_difference_twice_the_detectable_one_stops_with_fewer_seeds_than_the_fixed_design():
    """The fixed design that detects X with 80% power needs seeds_needed(X) seeds; at a true 2X the sequential
    design decides, almost always rightly, with fewer on average."""
    alpha, sd = 0.05, 1.0
    for detect in (1.2, 0.9):
        fixed = seeds_needed(detect, sd, alpha, is_paired=True)
        design = Design(alpha=alpha, detect=detect, max_seeds=2 * fixed)
        out = simulate(2 * detect, sd, design, trials=3000, seed=5)
        assert out.mean_seeds < fixed, (detect, fixed, out)
        assert out.decisions.get(HIGHER, 0.0) >= 0.95
        assert out.decisions.get(LOWER, 0.0) == 0.0


def test_bad_designs_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="alpha=1.5"):
        Design(alpha=1.5)
    with pytest.raises(ValueError, match="detect=-1"):
        Design(detect=-1.0)
    with pytest.raises(ValueError, match="first look needs >= 2 seeds"):
        Design(start=1)
    assert Design(start=2, batch=3, max_seeds=10).looks() == [2, 5, 8, 10]
    assert Design(comparisons=9, batch=1).first_possible() == 3  # 2 seeds cannot reach 9 / 0.05
    assert Design(comparisons=9).first_possible() == 4  # looks at 2, 4, ...


def sequential_sweep(tmp_path, compare_block: dict | None = None):
    """norm=pre (the baseline) and post, sandwich, deepnorm against it: post is 0.5 worse with little noise,
    sandwich the same within 0.003, deepnorm noisy with 4 seeds only."""
    from test_compare import done, write_run

    rng = np.random.default_rng(0)
    base = 1.0 + rng.normal(0, 0.05, 6)
    cells = {"pre": base, "post": base + 0.5 + rng.normal(0, 0.01, 6),
             "sandwich": base + rng.normal(0, 0.002, 6), "deepnorm": base[:4] + 0.05 + rng.normal(0, 0.3, 4)}
    s = tmp_path / "sweep"
    for norm, losses in cells.items():
        for seed, loss in enumerate(losses):
            results = {**done(float(loss), 0.5, 0.5, seed=seed), "test": {"loss": float(loss), "exact_match": 0.5}}
            if compare_block is not None:
                results["compare"] = compare_block
            write_run(s / f"{norm}_{seed}", [f"norm={norm}", f"seed={seed}"], results)
    return s, cells


def test_compare_decides_each_cell_sequentially_and_says_what_the_open_ones_need(tmp_path):
    from archsweep.core.report import compare, terminal

    s, cells = sequential_sweep(tmp_path)
    report = compare([s], sort="test/loss", baseline="norm=pre", detect=0.05, sequential=True)
    design = report.significance.design
    assert design.comparisons == 3 and design.level == pytest.approx(0.05 / 3)
    tests = {c.values["norm"]: c.test for c in report.cells if c.test is not None}
    post = tests["post"]
    assert (post.verdict, post.seeds_used, post.looks) == ("worse", 4, 2)  # 6 seeds ran; 4 decided it
    diffs = list(cells["post"][:4] - cells["pre"][:4])
    expected = sequence(diffs, design)
    assert (post.low, post.high, post.p) == (expected.looks[-1].low, expected.looks[-1].high, expected.p)
    assert post.p_bonferroni == pytest.approx(min(1.0, 3 * expected.p)) and post.p_bonferroni < 0.05
    assert tests["sandwich"].verdict == "no difference as large as 0.05" and tests["sandwich"].seeds_used == 4
    noisy = tests["deepnorm"]
    assert noisy.verdict == "open: look again at 6 seeds" and noisy.next_seeds == 6 and noisy.seeds_used == 4
    text = terminal(report)
    assert "norm=deepnorm: seed=4,5" in text and "(baseline)" not in text  # pre already ran seeds 0-5
    assert "at level alpha/3 per comparison" in text


def test_the_runs_compare_block_turns_it_on_and_bad_designs_are_refused(tmp_path):
    from archsweep.core.report import CompareError, compare

    block = {"tune": [], "baseline": "norm=pre", "metric": "test/loss", "detect": 0.05, "sequential": True,
             "max_seeds": 4, "seed_batch": 2}
    s, _ = sequential_sweep(tmp_path, block)
    report = compare([s])
    tests = {c.values["norm"]: c.test for c in report.cells if c.test is not None}
    assert report.significance.design.looks() == [2, 4]
    assert tests["deepnorm"].verdict == "undecided at 4 seeds (the most)"  # max_seeds=4 from the runs
    assert compare([s], sequential=False).significance.design is None  # the flag wins
    with pytest.raises(CompareError, match="sequential seeds: start=2, batch=0"):
        compare([s], seed_batch=0)
    with pytest.raises(CompareError, match="sequential seeds decide comparisons against a baseline"):
        compare([s], baseline="none", sequential=True)


def test_compare_py_flags_and_the_wandb_table_carry_the_sequential_columns(tmp_path, capsys):
    from archsweep.cli import compare_main
    from archsweep.core.report import compare
    from archsweep.core.report.wandb_log import table_rows

    s, _ = sequential_sweep(tmp_path)
    code = compare_main([str(s), "--sort", "test/loss", "--baseline", "norm=pre", "--detect", "0.05",
                         "--sequential", "--max-seeds", "6", "--seed-batch", "2", "--no-plots",
                         "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0 and "looked at after 2, 4, 6 seeds" in out and "norm=deepnorm: seed=4,5" in out
    rows = (tmp_path / "out" / "comparison.csv").read_text().splitlines()
    assert ",cs_low,cs_high,test,p,p_bonferroni,verdict,seeds_used,looks," in rows[0]
    post = next(r for r in rows if ",post," in r).split(",")
    assert post[rows[0].split(",").index("verdict")] == "worse" and post[rows[0].split(",").index("seeds_used")] == "4"
    data = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert data["significance"]["sequential"]["looks"] == [2, 4, 6]
    report = compare([s], sort="test/loss", baseline="norm=pre", detect=0.05, sequential=True)
    columns, table = table_rows(report)
    row = dict(zip(columns, table[[c.values["norm"] for c in report.cells].index("post")], strict=True))
    assert (row["verdict"], row["seeds_used"], row["looks"]) == ("worse", 4, 2) and row["p_bonferroni"] < 0.05


def test_seeds_added_at_the_chosen_rate_do_not_change_the_choice(tmp_path):
    """The rate is chosen on the seeds every rate ran: two more seeds at the chosen rate, worse on validation than
    the first two, leave the choice where the first two put it (over all its seeds, 0.003 would lose to 0.01)."""
    from test_compare import done, write_run

    from archsweep.core.report import compare

    s = tmp_path / "sweep"
    val = {("pre", "0.003"): [1.0, 1.0, 1.5, 1.5], ("pre", "0.01"): [1.1, 1.1],
           ("post", "0.003"): [1.3, 1.3], ("post", "0.01"): [1.2, 1.2]}
    for (norm, lr), losses in val.items():
        for seed, loss in enumerate(losses):
            write_run(s / f"{norm}_{lr}_{seed}", [f"norm={norm}", f"optim.lr={lr}", f"seed={seed}"],
                      {**done(loss, 0.5, 0.5, seed=seed), "test": {"loss": loss}})
    report = compare([s], tune=["optim.lr"], baseline="norm=pre")
    pre = next(c for c in report.cells if c.values["norm"] == "pre")
    assert pre.tuning.chosen.values == {"optim.lr": "0.003"} and pre.seeds == 4
    assert pre.tuning.chosen.stat.mean == pytest.approx(1.0)  # over seeds 0 and 1, which both rates ran
