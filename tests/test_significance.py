"""compare.py's tuned comparisons and significance against a baseline (docs/training.md, Tuned comparisons): the
statistics against hand computations on fixed samples, the choice of a tuned value on validation only, the grid-edge
warning, one seed per cell, the baseline spec, the runs' compare block (train.yaml) and its refusals."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import scripts
from hydra import compose, initialize_config_dir
from test_compare import done, write_run

from archsweep.core.report import CompareError, compare, terminal, write
from archsweep.core.report.cells import SortKey, parse_sort
from archsweep.core.report.significance import holm, min_detectable, paired, power, seeds_needed, welch
from archsweep.core.train.config.schemas import check_schemas

ROOT = Path(__file__).resolve().parents[1]
A = [1.02, 1.10, 0.95, 1.07, 0.99]
B = [1.21, 1.15, 1.30, 1.18]


def t_density(x: float, df: float) -> float:
    """Student's t density: Gamma((df + 1) / 2) / (sqrt(df pi) Gamma(df / 2)) (1 + x^2 / df)^(-(df + 1) / 2)."""
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                    - (df + 1) / 2 * math.log1p(x * x / df))


def t_two_sided_p(t: float, df: float, steps: int = 2000) -> float:
    """P(|T| >= |t|) = 1 - 2 * integral from 0 to |t| of the density, by Simpson's rule (math only, no scipy)."""
    h = abs(t) / steps
    inner = sum((4 if i % 2 else 2) * t_density(i * h, df) for i in range(1, steps))
    return 1 - 2 * h / 3 * (t_density(0.0, df) + inner + t_density(abs(t), df))


def t_quantile(confidence: float, df: float) -> float:
    """The q with P(|T| <= q) = confidence (t_{(1 + confidence) / 2, df}), by bisection on `t_two_sided_p`."""
    low, high = 0.0, 1000.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided_p(mid, df) > 1 - confidence else (low, mid)
    return (low + high) / 2


def paired_by_hand(a: list[float], b: list[float]) -> tuple[float, int]:
    """t = mean(d) / (sd(d) / sqrt(n)) of the per-seed differences d, and its n - 1 degrees of freedom."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    return statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(len(d))), len(d) - 1


def p_two_df(t: float) -> float:
    """The two-sided p-value at 2 degrees of freedom in closed form: the t CDF there is 1/2 + t / (2 sqrt(2 + t^2))."""
    return 1 - abs(t) / math.sqrt(2 + t * t)


def test_the_t_distribution_written_here_agrees_with_closed_forms_and_the_printed_table():
    for t in (0.3, 1.0, 2.5, 6.0, 40.0):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_two_sided_p(t, 2) == pytest.approx(p_two_df(t), abs=1e-12)
    # a printed t table (two-sided 95%, i.e. t_0.975): 12.706 (1 df), 2.776 (4), 2.447 (6), 2.365 (7), 2.228 (10),
    # 2.042 (30); two-sided 90% at 10 df: 1.812
    for df, table in ((1, 12.706), (4, 2.776), (6, 2.447), (7, 2.365), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.95, df) == pytest.approx(table, abs=5e-4)
    assert t_quantile(0.90, 10) == pytest.approx(1.812, abs=5e-4)


def test_welch_matches_the_hand_computation():
    # by hand: means 1.026 and 1.21, sample variances 0.00363 and 0.0042; se^2 = 0.00363 / 5 + 0.0042 / 4 = 0.001776
    va, vb = statistics.variance(A) / len(A), statistics.variance(B) / len(B)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(A) - 1) + vb**2 / (len(B) - 1))  # Welch-Satterthwaite
    diff = statistics.fmean(A) - statistics.fmean(B)
    t = diff / se
    # 0.001776^2 / (0.000726^2 / 4 + 0.00105^2 / 3) = 6.3176 df; t = -0.184 / 0.042143 = -4.3661
    assert (diff, se, df, t) == pytest.approx((-0.184, 0.0421426, 6.31759, -4.36613), rel=1e-5)
    half = t_quantile(0.95, df) * se  # t_0.975 at 6.32 df: 2.4174, between the table's 2.447 (6) and 2.365 (7)
    got = welch(A, B)
    assert got.diff == pytest.approx(diff)
    assert got.p == pytest.approx(t_two_sided_p(t, df), rel=1e-6)  # 0.0041958
    assert got.p == pytest.approx(0.0041958, rel=1e-4)
    assert (got.low, got.high) == (pytest.approx(diff - half, rel=1e-6), pytest.approx(diff + half, rel=1e-6))
    assert welch(A, B, 0.9).high - welch(A, B, 0.9).low < got.high - got.low  # a narrower interval at 90%


def test_paired_matches_the_hand_computation():
    b = [1.05, 1.16, 0.97, 1.12, 1.00]  # the same seeds as A: each a little worse
    d = [x - y for x, y in zip(A, b, strict=True)]  # -0.03, -0.06, -0.02, -0.05, -0.01: mean -0.034
    se = statistics.stdev(d) / math.sqrt(len(d))  # sqrt(0.00172 / 4) / sqrt(5) = 0.0092736
    t = statistics.fmean(d) / se  # -3.6663 at 4 df
    assert (se, t) == pytest.approx((0.00927362, -3.66631), rel=1e-5)
    half = 2.776445 * se  # t_0.975 at 4 df (the table's 2.776; this test's t_quantile gives 2.776445)
    got = paired(A, b)
    assert got.diff == pytest.approx(statistics.fmean(d))
    assert got.p == pytest.approx(t_two_sided_p(t, 4), rel=1e-6)  # 0.021461: between 0.02 (t=3.747) and 0.05
    assert 0.02 < got.p < 0.05  # the table's t_0.99 = 3.747 and t_0.975 = 2.776 at 4 df bracket |t| = 3.666
    assert (got.low, got.high) == (pytest.approx(statistics.fmean(d) - half, rel=1e-6),
                                   pytest.approx(statistics.fmean(d) + half, rel=1e-6))
    assert got.p < welch(A, b).p  # pairing removes the seed-to-seed spread


def test_holm_by_hand():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> raised to 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == pytest.approx([0.02])


def test_power_minimum_detectable_effect_and_seeds_needed():
    # the textbook figures of the two-sample t-test at alpha 0.05, 80% power: 17 per group for an effect of one
    # standard deviation, 64 for half of one
    assert seeds_needed(1.0, 1.0, 0.05, False) == 17 and seeds_needed(0.5, 1.0, 0.05, False) == 64
    assert power(1.0, math.sqrt(2 / 16), 30, 0.05) < 0.8 <= power(1.0, math.sqrt(2 / 17), 32, 0.05)
    mde = min_detectable(0.3, 5, 5, 0.05, False)
    assert power(mde, 0.3 * math.sqrt(2 / 5), 8, 0.05) == pytest.approx(0.8, abs=1e-6)
    # many seeds: the normal approximation (z_0.975 + z_0.8) * se, from the normal table: 1.95996 + 0.84162
    se = 0.3 * math.sqrt(2 / 400)
    assert min_detectable(0.3, 400, 400, 0.05, False) == pytest.approx((1.95996 + 0.84162) * se, rel=0.01)
    assert min_detectable(0.3, 3, 3, 0.05, True) > 0 and seeds_needed(0.1, 0.0, 0.05, False) == 2


LRS = ("0.001", "0.003", "0.01")


def tuned_sweep(tmp_path: Path, val: dict[str, dict[str, float]], test: dict[str, dict[str, float]] | None = None,
                seeds=(0, 1), compare_block: dict | None = None, extra: list[str] = ()) -> Path:
    """norm x optim.lr x seed; val[norm][lr] the validation loss (seed 1 is +0.01), test[norm][lr] the test loss
    (default: equal to validation)."""
    s = tmp_path / "sweep"
    i = 0
    for norm, by_lr in val.items():
        for lr, loss in by_lr.items():
            for seed in seeds:
                tl = (test or val)[norm][lr] + 0.01 * seed
                results = {**done(loss + 0.01 * seed, 0.5, 0.5, seed=seed), "test": {"loss": tl, "exact_match": 0.5}}
                if compare_block is not None:
                    results["compare"] = compare_block
                write_run(s / str(i), [f"norm={norm}", f"optim.lr={lr}", f"seed={seed}", *extra], results)
                i += 1
    return s


def by_label(report) -> dict:
    return {c.label: c for c in report.cells}


def row_of(text: str, value: str) -> str:
    """The table row whose first cell key has this value (after the best column's * if any)."""
    return next(line for line in text.splitlines() if value in line.split()[:2])


def test_the_tuned_value_is_chosen_on_validation_never_test(tmp_path):
    val = {"pre": {"0.001": 1.3, "0.003": 1.0, "0.01": 1.2}, "post": {"0.001": 1.1, "0.003": 1.4, "0.01": 1.5}}
    test = {"pre": {"0.001": 0.5, "0.003": 2.0, "0.01": 0.6}, "post": {"0.001": 2.0, "0.003": 0.4, "0.01": 0.3}}
    s = tuned_sweep(tmp_path, val, test)
    report = compare([s], sort="test/loss", tune=["optim.lr"])
    assert report.keys == ["norm"] and report.tuned == ["optim.lr"] and report.selection.key == "val/loss"
    cells = by_label(report)
    assert cells["norm=pre"].tuning.chosen.values == {"optim.lr": "0.003"}  # val's best; test's best is 0.001
    assert cells["norm=post"].tuning.chosen.values == {"optim.lr": "0.001"}  # test's best is 0.01
    pre = cells["norm=pre"]
    assert pre.seeds == 2 and pre.stats["test/loss"].mean == pytest.approx(2.005)  # the chosen value's runs
    assert {r.values["optim.lr"] for r in pre.runs} == {"0.003"} and len(pre.others) == 4
    assert "validation split of the sort metric test/loss" in terminal(report)


def test_the_selection_metric_is_the_sort_metric_on_validation(tmp_path):
    s = tuned_sweep(tmp_path, {"pre": dict.fromkeys(LRS, 1.0)})
    report = compare([s], sort="test/exact_match", tune=["optim.lr"])
    assert report.selection.key == "val/exact_match" and not report.selection.sort.lower_better
    assert compare([s], sort="tokens_per_s", tune=["optim.lr"]).selection.key == "val/loss"


@pytest.mark.parametrize("losses, mark, line", [
    ((1.0, 1.2, 1.4), "<", "best optim.lr 0.001 is the smallest tried; extend the grid downward"),
    ((1.4, 1.2, 1.0), ">", "best optim.lr 0.01 is the largest tried; extend the grid upward"),
    ((1.2, 1.0, 1.4), "", None),
])
def test_the_edge_warning_fires_exactly_at_the_grid_edges(tmp_path, losses, mark, line):
    s = tuned_sweep(tmp_path, {"pre": dict(zip(LRS, losses, strict=True)),
                               "post": {"0.001": 1.5, "0.003": 1.3, "0.01": 1.6}})
    report = compare([s], tune=["optim.lr"], out=tmp_path / "out")
    pre, post = by_label(report)["norm=pre"], by_label(report)["norm=post"]
    assert pre.tuning.mark("optim.lr") == mark and post.tuning.mark("optim.lr") == ""
    text = terminal(report)
    assert "norm=post" not in text.split("Tuning grids:")[-1] if line else "Tuning grids:" not in text
    words = row_of(text, "pre").split()
    after = words[words.index("pre") + 1:][:2]  # the optim.lr column: the value, then its mark if any
    assert after == [pre.tuning.chosen.values["optim.lr"], mark or "2"]  # no mark: the seeds column follows
    write(report, plots=False)
    md = (tmp_path / "out" / "comparison.md").read_text()
    if line:
        assert f"cell norm=pre: {line}" in text and f"- cell norm=pre: {line}" in md
    else:
        assert "## Tuning grids" not in md


def test_an_interior_best_of_four_values_and_a_grid_of_two(tmp_path):
    s = tuned_sweep(tmp_path, {"pre": {"0.001": 1.3, "0.003": 1.0, "0.01": 1.1, "0.03": 1.2},
                               "post": {"0.001": 1.3, "0.003": 1.0}})
    report = compare([s], tune=["optim.lr"])
    assert by_label(report)["norm=pre"].tuning.edges == {}
    assert by_label(report)["norm=post"].tuning.mark("optim.lr") == "?"
    assert "cell norm=post: optim.lr tried at 2 values only (0.001, 0.003): too few to tell" in terminal(report)


def test_no_tune_keeps_a_row_per_cell_and_value_and_the_runs_block_is_the_default(tmp_path):
    block = {"tune": ["optim.lr"], "baseline": "norm=pre", "metric": None}
    s = tuned_sweep(tmp_path, {"pre": dict(zip(LRS, (1.0, 1.1, 1.2), strict=True)),
                               "post": dict(zip(LRS, (1.3, 1.1, 1.2), strict=True))}, compare_block=block)
    report = compare([s])
    assert report.tuned == ["optim.lr"] and len(report.cells) == 2 and report.significance is not None
    untuned = compare([s], tune=[], baseline="none")
    assert untuned.keys == ["norm", "optim.lr"] and len(untuned.cells) == 6 and untuned.significance is None
    with pytest.raises(CompareError, match=r"--tune model.d_model: not a key that varies .*norm, optim.lr"):
        compare([s], tune=["model.d_model"])


def test_runs_that_disagree_on_their_compare_block_get_a_note_and_the_first_is_used(tmp_path):
    s = tuned_sweep(tmp_path, {"pre": dict.fromkeys(LRS, 1.0)}, compare_block={"tune": ["optim.lr"]})
    results = json.loads((s / "5" / "results.json").read_text())
    (s / "5" / "results.json").write_text(json.dumps({**results, "compare": {"tune": []}}))
    report = compare([s])
    assert report.tuned == ["optim.lr"]
    assert any("disagree on their compare block" in n and "using the first" in n for n in report.notes)


def two_cells(tmp_path: Path, pre: list[float], post: list[float], post_seeds=None, **block) -> Path:
    s = tmp_path / "two"
    for i, (norm, losses, seeds) in enumerate((("pre", pre, range(len(pre))),
                                               ("post", post, post_seeds or range(len(post))))):
        for seed, loss in zip(seeds, losses, strict=True):
            results = {**done(loss, 0.5, 0.5, seed=seed), **({"compare": block} if block else {})}
            write_run(s / f"{i}{seed}", [f"norm={norm}", f"seed={seed}"], results)
    return s


def test_significance_against_the_baseline_welch_or_paired_with_holm_and_a_verdict(tmp_path):
    pre, post = [1.00, 1.02, 0.98], [1.20, 1.23, 1.19]
    s = two_cells(tmp_path, pre, post, post_seeds=[5, 6, 7])  # other seeds: Welch
    report = compare([s], baseline="norm=pre", detect=0.05)
    test = by_label(report)["norm=post"].test
    # by hand: variances 4.333e-4 (post) and 4e-4 (pre), se = sqrt((4.333e-4 + 4e-4) / 3) = 0.016667, t = 0.20667 /
    # 0.016667 = 12.4 at (2.7778e-4)^2 / ((1.4444e-4)^2 / 2 + (1.3333e-4)^2 / 2) = 3.9936 df: p = 0.00024542
    assert t_two_sided_p(12.4, 3.9936102) == pytest.approx(0.00024542, rel=1e-4)
    assert not test.paired and test.p == pytest.approx(t_two_sided_p(12.4, 3.9936102), rel=1e-5)
    assert test.p_holm == test.p  # one comparison: Holm multiplies by 1
    assert test.diff == pytest.approx(statistics.fmean(post) - statistics.fmean(pre))
    assert test.verdict == "worse" and test.seeds_needed >= 2 and test.mde > 0
    paired_report = compare([two_cells(tmp_path / "p", pre, post)], baseline="norm=pre")
    test = by_label(paired_report)["norm=post"].test
    t, df = paired_by_hand(post, pre)  # differences 0.20, 0.21, 0.21: t = 0.20667 / (0.0057735 / sqrt(3)) = 62
    assert (t, df) == (pytest.approx(62.0), 2)
    assert test.paired and test.p == pytest.approx(p_two_df(62.0), rel=1e-9)  # 1 - 62 / sqrt(3846) = 2.6004e-4
    higher = compare([s], baseline="norm=post", sort="val/loss")  # pre has the lower loss: better
    assert by_label(higher)["norm=pre"].test.verdict == "better"
    close = compare([two_cells(tmp_path / "c", pre, [1.01, 0.99, 1.03])], baseline="norm=pre")
    assert by_label(close)["norm=post"].test.verdict == "no detectable difference at alpha=0.05"


def test_holm_runs_across_the_cells_of_the_table(tmp_path):
    s = tmp_path / "three"
    losses = {"pre": [1.0, 1.02, 0.98], "post": [1.05, 1.09, 1.02], "sandwich": [1.03, 1.0, 1.08]}
    for norm, values in losses.items():
        for seed, loss in enumerate(values):
            write_run(s / f"{norm}{seed}", [f"norm={norm}", f"seed={seed}"], done(loss, 0.5, 0.5, seed=seed))
    report = compare([s], baseline="norm=pre")
    tests = [by_label(report)[f"norm={n}"].test for n in ("post", "sandwich")]
    # paired by hand, 2 df: post - pre = 0.05, 0.07, 0.04, t = 6.0474, p = 1 - t / sqrt(2 + t^2) = 0.026271;
    # sandwich - pre = 0.03, -0.02, 0.10, t = 1.0536, p = 0.40256
    assert [paired_by_hand(losses[n], losses["pre"])[0] for n in ("post", "sandwich")] == pytest.approx(
        [6.047432, 1.053609], rel=1e-6)
    assert [t.p for t in tests] == pytest.approx([0.0262710, 0.4025620], rel=1e-5)
    # Holm with m = 2: the smaller 0.026271 x 2 = 0.052542; the larger 0.40256 x 1 = 0.40256 (above 0.052542)
    assert [t.p_holm for t in tests] == pytest.approx([0.0525420, 0.4025620], rel=1e-5)
    assert "Holm-adjusted across 2 comparisons" in terminal(report)


def test_one_seed_per_cell_is_reported_as_such_without_numbers(tmp_path):
    s = two_cells(tmp_path, [1.0], [1.2, 1.25])
    report = compare([s], baseline="norm=pre", detect=0.1, out=tmp_path / "out")
    post = by_label(report)["norm=post"]
    assert post.test.short == "1 seed" and post.test.p is None and post.test.mde is None
    text = terminal(report)
    assert row_of(text, "post").count("1 seed") == 7  # diff, test, p, p Holm, verdict, MDE, seeds for 0.1
    assert "Significance needs >= 2 seeds per cell" in text
    write(report, plots=False)
    data = json.loads((tmp_path / "out" / "comparison.json").read_text())
    cell = next(c for c in data["cells"] if c["cell"] == {"norm": "post"})
    assert cell["significance"]["short"] == "1 seed" and cell["significance"]["p"] is None
    rows = (tmp_path / "out" / "comparison.csv").read_text().splitlines()
    assert ",1 seed," in next(r for r in rows if ",post," in r)


def test_the_outputs_carry_the_tuned_values_and_the_tests(tmp_path):
    s = tuned_sweep(tmp_path, {"pre": dict(zip(LRS, (1.2, 1.0, 1.1), strict=True)),
                               "post": dict(zip(LRS, (1.5, 1.4, 1.3), strict=True))})
    report = compare([s], tune=["optim.lr"], baseline="norm=pre", out=tmp_path / "out")
    names = [p.name for p in write(report)]
    assert "comparison_sensitivity.png" in names
    import matplotlib.pyplot as plt

    image = plt.imread(tmp_path / "out" / "comparison_sensitivity.png")
    assert image.shape[0] > 100 and image.std() > 0
    data = json.loads((tmp_path / "out" / "comparison.json").read_text())
    # tuned on val/loss, so by default sorted and tested on the test split, not on the number that chose the rate
    assert data["sort"]["key"] == "test/loss" and data["significance"]["biased"] is False
    assert data["tuning"] == {"keys": ["optim.lr"], "metric": "val/loss",
                              "why": "the validation split of the sort metric test/loss"}
    assert any(n.startswith("sorted and tested on test/loss, not val/loss") for n in data["notes"])
    post = next(c for c in data["cells"] if c["cell"] == {"norm": "post"})
    assert post["tuned"]["chosen"] == {"optim.lr": "0.01"} and post["tuned"]["edges"] == {"optim.lr": "high"}
    assert [p["selection"]["mean"] for p in post["tuned"]["grid"]] == pytest.approx([1.505, 1.405, 1.305])
    assert post["significance"]["verdict"] == "worse" and post["significance"]["paired"] is True
    rows = (tmp_path / "out" / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("best,norm,optim.lr,optim.lr_edge,seeds,") and ",p,p_holm,verdict,mde," in rows[0]
    assert rows[2].startswith("0,post,0.01,high,2,") and ",paired," in rows[2] and ",worse," in rows[2]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| 0.01 > |" in md and "| baseline |" in md


def test_a_verdict_on_the_metric_that_chose_the_rate_is_marked_biased(tmp_path):
    s = tuned_sweep(tmp_path, {"pre": dict(zip(LRS, (1.2, 1.0, 1.1), strict=True)),
                               "post": dict(zip(LRS, (1.5, 1.4, 1.3), strict=True))})
    report = compare([s], tune=["optim.lr"], baseline="norm=pre", sort="val/loss")
    assert report.sort.key == "val/loss" and report.significance.biased
    text = terminal(report)
    assert "verdict (biased)" in text and "Biased: the verdicts are on val/loss, the metric that chose" in text
    assert not compare([s], tune=["optim.lr"], baseline="norm=pre", sort="test/loss").significance.biased
    assert not compare([s], baseline="norm=pre", sort="val/loss", tune=[]).significance.biased  # nothing tuned


def test_the_runs_metric_sorts_and_stars_unless_sort_is_given(tmp_path):
    s = tmp_path / "pos"
    for i, (pos, val_loss, long_em) in enumerate((("rotary", 1.0, 0.2), ("alibi", 1.1, 0.7))):
        results = {**done(val_loss, 0.9, 0.9), "test_long": {"exact_match": long_em},
                   "compare": {"tune": [], "baseline": None, "metric": "test_long/exact_match"}}
        write_run(s / str(i), [f"pos={pos}", "seed=0"], results)
    report = compare([s])
    assert report.sort.key == "test_long/exact_match" and report.cells[0].values["pos"] == "alibi"
    assert report.cells[0].best
    assert "sorted by test_long/exact_match (the preset's question; higher is better)" in terminal(report)
    told = compare([s], sort="val/loss")
    assert told.cells[0].values["pos"] == "rotary" and "preset's question" not in terminal(told)
    from archsweep.cli import compare_args

    flags = compare_args([str(s), "--metric", "val/loss", "--metrics", "val/loss,test/loss"])  # --metric: --sort
    assert flags.sort == "val/loss" and flags.metrics == "val/loss,test/loss"


@pytest.mark.parametrize("spec, match", [
    ("norm=deep", r"--baseline 'norm=deep' matches none of the cells: .*norm=pre model.n_layers=2"),
    ("ffn=relu", r"ffn is not a key the cells differ by; choose from norm, model.n_layers"),
    ("pre", r"give the baseline cell as key=value pairs"),
])
def test_a_baseline_that_matches_no_cell_is_refused(tmp_path, spec, match):
    with pytest.raises(CompareError, match=match):
        compare([grid(tmp_path)], baseline=spec)


@pytest.mark.parametrize("spec, reason", [
    ("norm=deep", "matches none of the cells"),
    ("ffn=relu", "ffn is not a key the cells differ by"),
])
def test_a_baseline_the_runs_name_that_does_not_fit_them_is_a_note_and_no_test(tmp_path, spec, reason):
    """A part of a preset's grid re-run on its own (post-norm alone at lower rates) still records the preset's
    baseline: the table is shown with a note instead of an error; the same spec given as --baseline is refused."""
    s = two_cells(tmp_path, [1.0, 1.1], [1.2, 1.3], baseline=spec)
    report = compare([s])
    assert report.significance is None and all(c.test is None for c in report.cells)
    assert [n for n in report.notes if reason in n and "No significance test" in n], report.notes
    assert "No significance test" in terminal(report)
    with pytest.raises(CompareError, match=reason):
        compare([s], baseline=spec)
    with pytest.raises(CompareError, match=reason):  # --detect asks for a test: the runs' baseline must fit
        compare([s], detect=0.1)
    assert compare([s], baseline="norm=pre").significance is not None


def grid(tmp_path: Path) -> Path:
    s = tmp_path / "grid"
    for i, (norm, layers) in enumerate((("pre", 2), ("pre", 4), ("post", 2))):
        write_run(s / str(i), [f"norm={norm}", f"model.n_layers={layers}", "seed=0"], done(1.0 + i, 0.5, 0.5))
    return s


def test_a_baseline_that_leaves_keys_open_is_matched_on_them(tmp_path):
    """norm=pre in a sweep over norm and depth: each cell is tested against pre-norm at its own depth; a cell whose
    depth has no pre-norm cell says so instead of borrowing another depth's."""
    s = tmp_path / "matched"
    losses = {("pre", 2): [1.00, 1.02, 0.98], ("post", 2): [1.01, 1.04, 0.985],
              ("pre", 6): [1.50, 1.52, 1.49], ("post", 6): [2.50, 2.60, 2.55], ("post", 12): [3.0, 3.1, 3.2]}
    for (norm, layers), values in losses.items():
        for seed, loss in enumerate(values):
            write_run(s / f"{norm}{layers}_{seed}", [f"norm={norm}", f"model.n_layers={layers}", f"seed={seed}"],
                      done(loss, 0.5, 0.5, seed=seed))
    report = compare([s], baseline="norm=pre")
    cells = by_label(report)
    assert report.significance.label == "norm=pre at each cell's own model.n_layers"
    shallow, deep = cells["norm=post model.n_layers=2"].test, cells["norm=post model.n_layers=6"].test
    # paired by hand, 2 df: differences 0.01, 0.02, 0.005 give t = sqrt(7), p = 1 - sqrt(7) / 3 = 0.118083;
    # differences 1.0, 1.08, 1.06 give t = 43.544, p = 5.2699e-4: each against pre-norm at its own depth
    assert shallow.p == pytest.approx(1 - math.sqrt(7) / 3, rel=1e-6)
    assert deep.p == pytest.approx(p_two_df(43.543965), rel=1e-6) and deep.p == pytest.approx(5.2699e-4, rel=1e-4)
    assert deep.diff == pytest.approx(statistics.fmean(losses["post", 6]) - statistics.fmean(losses["pre", 6]))
    assert cells["norm=post model.n_layers=12"].test.short == "no baseline"
    assert cells["norm=pre model.n_layers=2"].test is None and cells["norm=pre model.n_layers=6"].test is None
    text = terminal(report)
    assert "Against the baseline norm=pre at each cell's own model.n_layers" in text
    assert [line.split()[:2] for line in text.splitlines() if "no baseline" in line] == [["post", "12"]]


def test_compare_py_exits_2_on_a_baseline_matching_no_cell(tmp_path):
    out = scripts.run([sys.executable, "compare.py", str(grid(tmp_path)), "--no-plots", "--baseline", "norm=deep"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "error: --baseline 'norm=deep' matches none of the cells" in out.stderr and "Traceback" not in out.stderr


def test_bad_flags_are_refused(tmp_path):
    s = two_cells(tmp_path, [1.0, 1.1], [1.2, 1.3])
    with pytest.raises(CompareError, match=r"--detect 0.01 needs a baseline"):
        compare([s], detect=0.01)
    with pytest.raises(CompareError, match=r"--alpha 1.5: give a significance level between 0 and 1"):
        compare([s], baseline="norm=pre", alpha=1.5)
    with pytest.raises(CompareError, match=r"--baseline tests a final metric"):
        compare([s], baseline="norm=pre", sort="target", target="val/exact_match>=0.5")


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("override, message", [
    ("compare.metric=acc", r"compare.metric='acc' must name a results.json metric as split/name, e.g. test_long/acc"),
    ("compare.tune=[optim..lr]", r"compare.tune=\['optim..lr'\] names 'optim..lr', which is not a config key"),
    ("compare.tune=[seed]", r"names 'seed', which is not a config key to tune"),
    ("compare.baseline=pre", r"compare.baseline='pre' must be a cell as key=value pairs"),
])
def test_train_refuses_a_bad_compare_block(override, message):
    with pytest.raises(ValueError, match=message):
        check_schemas(composed(override))


def test_train_refuses_a_tuned_key_the_config_lacks():
    from archsweep.core.train.config import rules
    from archsweep.core.train.lifecycle.checks import build_task

    cfg = composed("compare.tune=[optim.lrr]")
    with pytest.raises(ValueError, match=r"compare.tune names optim.lrr, which this config does not have"):
        rules.check_rules(cfg, build_task(cfg))
    cfg = composed("compare.tune=[optim.lr,norm,model.plugins.qk_norm]")  # a value, a group, a key set to null
    rules.check_rules(cfg, build_task(cfg))


def test_the_compare_block_is_typed_and_a_setting():
    from archsweep.core.train.runs.runinfo import compare_block, is_setting

    cfg = composed("compare.tune=[optim.lr]", "compare.baseline='norm=pre model.n_layers=6'",
                   "compare.metric=test_long/acc")
    assert check_schemas(cfg).groups["compare"].tune == ["optim.lr"]
    assert compare_block(cfg) == {"tune": ["optim.lr"], "baseline": "norm=pre model.n_layers=6",
                                  "metric": "test_long/acc", "detect": None, "sequential": False, "max_seeds": 10,
                                  "seed_batch": 2, "transfer": None}
    assert is_setting("compare.tune") and not is_setting("optim.lr")


PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_a_presets_compare_block_names_keys_and_a_cell_of_its_own_sweep(name):
    """A preset's compare block is valid, tunes keys it sweeps, and its baseline names compared keys of its sweep
    with values the sweep runs (the keys it leaves out are matched per cell)."""
    from test_experiments import sweep_values

    from archsweep.core.report.runs import canon

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={name}"], return_hydra_config=True)
    block = check_schemas(cfg).groups["compare"]
    grid = sweep_values(cfg.hydra.sweeper.params or {})
    assert set(block.tune) <= set(grid), f"{name}: compare.tune={block.tune} but the sweep varies {sorted(grid)}"
    if block.baseline is not None:
        spec = dict(p.split("=", 1) for p in block.baseline.split())
        assert spec and set(spec) <= set(grid) - {"seed", *block.tune}, f"{name}: compare.baseline={block.baseline!r}"
        for key, value in spec.items():
            assert canon(value) in {canon(v) for v in grid[key]}, f"{name}: {key}={value} is not in its sweep"


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_names_a_metric_its_runs_record_and_compare_can_rank(name):
    """The metric that answers a preset's question is one its runs write (a split its task evaluates, by_context
    where it evaluates other contexts) and one whose better direction compare.py knows, so it sorts and stars by it."""
    from hydra.utils import get_object

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={name}"])
    metric = check_schemas(cfg).groups["compare"].metric
    assert metric is not None, f"{name}: no compare.metric"
    key = metric.partition(":")[0]
    splits = {"train", "val", *get_object(cfg.task._target_).test_splits}
    splits |= {"by_context"} if cfg.eval.get("context_lengths") is not None else set()
    assert key.split("/")[0] in splits, f"{name}: compare.metric={metric} but its runs record {sorted(splits)}"
    assert parse_sort(metric, [key]).key == key


def test_a_metric_with_its_direction_sorts_and_stars_by_it(tmp_path):
    s = tmp_path / "ext"
    for i, (pos, val_loss, ratio) in enumerate((("rotary", 1.0, 9.0), ("alibi", 1.1, 1.2))):
        results = {**done(val_loss, 0.9, 0.9), "by_context": {"ppl_ratio": ratio},
                   "compare": {"tune": [], "baseline": None, "metric": "by_context/ppl_ratio:min"}}
        write_run(s / str(i), [f"pos={pos}", "seed=0"], results)
    report = compare([s])
    assert report.sort == SortKey("by_context/ppl_ratio", True) and report.cells[0].values["pos"] == "alibi"
    assert report.cells[0].best and "the preset's question; lower is better" in terminal(report)
    assert composed("compare.metric=by_context/ppl_ratio:max").compare.metric == "by_context/ppl_ratio:max"
    with pytest.raises(ValueError, match=r"compare.metric='test/loss:low' must name .*\(with :min or :max"):
        check_schemas(composed("compare.metric=test/loss:low"))


def test_compare_main_reads_the_flags(tmp_path, capsys):
    from archsweep.cli import compare_main

    s = tuned_sweep(tmp_path, {"pre": dict(zip(LRS, (1.2, 1.0, 1.1), strict=True)),
                               "post": dict(zip(LRS, (1.5, 1.4, 1.3), strict=True))})
    assert compare_main([str(s), "--no-plots", "--tune", "optim.lr", "--baseline", "norm=pre", "--detect", "0.05",
                         "--alpha", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "Tuned per cell: optim.lr." in out and "seeds for 0.05" in out and "verdict at alpha=0.01" in out
    assert compare_main([str(s), "--no-plots", "--no-tune"]) == 0
    assert "optim.lr" in capsys.readouterr().out.split("Cells by: ")[1].splitlines()[0]  # a cell key again
    assert compare_main([str(s), "--no-plots", "--baseline", "norm=none"]) == 2
    assert "matches none of the cells" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        compare_main([str(s), "--tune", "optim.lr", "--no-tune"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_two_tuned_keys_are_chosen_together_and_each_gets_its_edge_and_plot(tmp_path):
    s = tmp_path / "two"
    i = 0
    for norm in ("pre", "post"):
        for lr in LRS:
            for warmup in ("0", "50", "100"):
                loss = 1.0 + abs(LRS.index(lr) - 1) * 0.1 + int(warmup) / 1000 + (norm == "post") * 0.2
                write_run(s / str(i), [f"norm={norm}", f"optim.lr={lr}", f"schedule.warmup_steps={warmup}",
                                       "seed=0"], done(loss, 0.5, 0.5))
                i += 1
    report = compare([s], tune=["optim.lr", "schedule.warmup_steps"], out=tmp_path / "out")
    pre = by_label(report)["norm=pre"]
    assert report.keys == ["norm"] and pre.tuning.chosen.values == {"optim.lr": "0.003", "schedule.warmup_steps": "0"}
    assert pre.tuning.edges == {"schedule.warmup_steps": "low"} and len(pre.tuning.points) == 9
    assert "best schedule.warmup_steps 0 is the smallest tried; extend the grid downward" in terminal(report)
    import matplotlib.pyplot as plt

    write(report)
    image = plt.imread(tmp_path / "out" / "comparison_sensitivity.png")
    assert image.shape[1] > 1.5 * image.shape[0]  # one panel per tuned key, side by side
