"""compare.py on fabricated sweep directories, so every number in the table is known."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import scripts

from archsweep.core.report import CompareError, compare, terminal, write
from archsweep.core.report.plots import mean_band
from archsweep.core.report.runs import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CHOICES = {"model": "encoder_decoder", "norm": "pre", "pos": "sinusoidal", "task": "reverse", "logger": "csv"}
HEADER = "epoch,step,train/loss,val/loss,val/exact_match,test/exact_match\n"


def write_run(d: Path, overrides: list[str], results: dict | None, val_em: list[float] = (),
              extra_csv: str = "") -> Path:
    """A run directory: .hydra/overrides.yaml, metrics.csv with validations at steps 9, 19, 29, ... (csv
    step, counted from 0), and results.json unless None (a run still going)."""
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    rows = "".join(f"0,{10 * i + 9},,{2.0 - 0.1 * i},{em},\n" for i, em in enumerate(val_em))
    (d / "metrics.csv").write_text(HEADER + rows + extra_csv)
    if results is not None:
        choices = {**CHOICES, **{o.split("=")[0]: o.split("=")[1] for o in overrides if o.split("=")[0] in CHOICES}}
        (d / "results.json").write_text(json.dumps({"choices": choices, "overrides": overrides, **results}))
    return d


def done(loss: float, em: float, test_em: float, **more) -> dict:
    return {"status": "completed", "error": None, "seed": 0, "params": 1000, "steps": 30, "tokens_per_s": 500.0,
            "val": {"loss": loss, "exact_match": em}, "test": {"loss": loss, "exact_match": test_em}, **more}


def by_length(test: dict[int, float], long: dict[int, float]) -> dict:
    return {"by_length": {"test": {str(k): {"n": 10, "exact_match": v} for k, v in test.items()},
                          "test_long": {str(k): {"n": 10, "exact_match": v} for k, v in long.items()}}}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """norm=pre,post x seed=0,1,2: pre has two completed runs and one diverged; post one completed, one failed,
    one still running; plus a job whose results.json is corrupt."""
    s = tmp_path / "sweep"
    s.mkdir()
    (s / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - norm=pre,post\n    - seed=0,1,2\n"
                                     "    - output_root=/tmp/x\n")
    common = ["logger=csv", "output_root=/tmp/x"]
    write_run(s / "0", ["norm=pre", "seed=0", *common], done(1.0, 0.9, 0.8, **by_length({1: 1.0, 2: 0.8}, {3: 0.2})),
              val_em=[0.5, 0.95, 0.97])
    write_run(s / "1", ["norm=pre", "seed=1", *common], done(2.0, 0.7, 0.6, **by_length({1: 0.8, 2: 0.6}, {3: 0.0})),
              val_em=[0.92, 0.5, 0.99])
    write_run(s / "2", ["norm=pre", "seed=2", *common], {**done(float("nan"), 0.0, 0.0), "status": "diverged",
              "diverged": {"step": 300, "reason": "loss is nan"}}, val_em=[0.1])
    write_run(s / "3", ["norm=post", "seed=0", *common], done(0.5, 0.2, 0.1, tokens_per_s=800.0, params=900),
              val_em=[0.1, 0.2, 0.3])
    failed = {"status": "failed", "error": "ValueError: bad shape\n  line 2"}
    write_run(s / "4", ["norm=post", "seed=1", *common], failed)
    write_run(s / "5", ["norm=post", "seed=2", *common], None, val_em=[0.1] * 5)
    write_run(s / "6", ["norm=pre", "seed=3", *common], None)
    (s / "6" / "results.json").write_text('{"status": "compl')
    return s


def cells(report) -> dict:
    return {c.label: c for c in report.cells}


def test_table_has_one_row_per_cell_with_mean_and_std_over_seeds(sweep):
    report = compare([sweep])
    assert report.keys == ["norm"]
    got = cells(report)
    assert sorted(got) == ["norm=post", "norm=pre"]
    pre, post = got["norm=pre"], got["norm=post"]
    assert pre.seeds == 2 and post.seeds == 1
    assert pre.stats["val/loss"].mean == pytest.approx(1.5)
    assert pre.stats["val/loss"].std == pytest.approx(math.sqrt(0.5))  # sample std of 1.0 and 2.0
    assert pre.stats["test/exact_match"].mean == pytest.approx(0.7)
    assert post.stats["val/loss"].mean == pytest.approx(0.5) and post.stats["val/loss"].std is None
    assert post.stats["tokens_per_s"].mean == 800.0 and post.stats["params"].mean == 900
    assert (len(pre.of("diverged")), len(pre.of("failed"))) == (1, 0)
    assert (len(post.of("diverged")), len(post.of("failed"))) == (0, 1)


def test_steps_to_target_first_logged_step_mean_over_runs(sweep):
    got = cells(compare([sweep]))  # default target val/exact_match>=0.9; csv step 19 is the 20th step
    assert got["norm=pre"].target_steps == [20, 10]
    assert got["norm=post"].target_steps == [None]
    text = terminal(compare([sweep]))
    assert "15 +- 7" in text and "never" in text
    partial = cells(compare([sweep], target="val/exact_match>0.96"))["norm=pre"]
    assert partial.target_steps == [30, 30]
    half = cells(compare([sweep], target="val/exact_match>=0.95"))["norm=pre"]
    assert half.target_steps == [20, 30]
    assert compare([sweep], target="none").target is None


def test_partly_reached_target_shows_how_many(tmp_path):
    s = tmp_path / "s"
    write_run(s / "0", ["seed=0"], done(1.0, 0.9, 0.9), val_em=[0.95])
    write_run(s / "1", ["seed=1"], done(1.0, 0.9, 0.9), val_em=[0.5])
    report = compare([s])
    assert [c.label for c in report.cells] == ["all runs"]
    assert "10 (1/2)" in terminal(report)


def test_sorted_best_first_direction_from_the_name(sweep):
    by_loss = compare([sweep])
    assert [c.label for c in by_loss.cells] == ["norm=post", "norm=pre"]
    assert by_loss.cells[0].best and not by_loss.cells[1].best
    by_em = compare([sweep], sort="val/exact_match")
    assert [c.label for c in by_em.cells] == ["norm=pre", "norm=post"] and by_em.cells[0].best
    assert [c.label for c in compare([sweep], sort="val/exact_match:min").cells] == ["norm=post", "norm=pre"]
    assert [c.label for c in compare([sweep], sort="tokens_per_s").cells] == ["norm=post", "norm=pre"]
    assert [c.label for c in compare([sweep], sort="target").cells] == ["norm=pre", "norm=post"]
    rows = [line for line in terminal(by_loss).splitlines() if "norm=" not in line and line.startswith(("*", " "))]
    assert rows[0].startswith("*") and "post" in rows[0] and "pre" in rows[1]


def test_failed_diverged_running_and_corrupt_runs_are_listed(sweep):
    report = compare([sweep])
    reasons = {s.run_dir.name: s.reason for s in report.skipped}
    assert reasons["5"] == "running or interrupted: no results.json, last logged step 50"
    assert reasons["6"].startswith("unreadable results.json")
    assert set(reasons) == {"5", "6"}
    text = terminal(report)
    assert "4 (norm=post seed=1): ValueError: bad shape" in text and "line 2" not in text
    assert "2 (norm=pre seed=2): at step 300: loss is nan" in text
    assert "5 (norm=post seed=2): running or interrupted: no results.json, last logged step 50" in text
    assert "7 runs: 3 completed, 1 failed, 1 diverged, 2 skipped" in text


@pytest.mark.parametrize("content, reason", [
    ("[1, 2]", "expected a JSON object"),
    ('{"status": "done"}', "status='done'"),
    ('{"status": "completed", "val": 3}', "'val' is a int"),
    ("", "Expecting value"),
])
def test_unusable_results_json_is_skipped_with_the_reason(tmp_path, content, reason):
    write_run(tmp_path / "s" / "0", ["seed=0"], done(1.0, 0.5, 0.5))
    write_run(tmp_path / "s" / "1", ["seed=1"], None)
    (tmp_path / "s" / "1" / "results.json").write_text(content)
    report = compare([tmp_path / "s"])
    assert len(report.cells[0].runs) == 1
    assert reason in report.skipped[0].reason


def test_sweep_just_started_or_all_failed_still_reports(tmp_path):
    s = tmp_path / "s"
    write_run(s / "0", ["norm=pre", "seed=0"], None)
    write_run(s / "1", ["norm=post", "seed=0"], None, val_em=[0.5, 0.6])
    (s / "1" / "metrics.csv").write_text(HEADER + "0,9,,2.0,0.5,\n0,19,,1.9\n0,")  # a line being written
    report = compare([s])
    assert report.cells == [] and [x.reason for x in report.skipped] == [
        "running or interrupted: no results.json, nothing logged yet",
        "running or interrupted: no results.json, last logged step 20"]
    assert not any(p.suffix == ".png" for p in write(report))
    write_run(s / "2", ["norm=pre", "seed=1"], {"status": "failed", "error": "RuntimeError: out of memory"})
    report = compare([s])
    assert [(c.label, c.seeds, len(c.of("failed"))) for c in report.cells] == [("all runs", 0, 1)]
    assert "RuntimeError: out of memory" in terminal(report)


def test_unreadable_metrics_csv_keeps_the_run_without_curves(tmp_path):
    s = tmp_path / "s"
    write_run(s / "0", ["seed=0"], done(1.0, 0.5, 0.5))
    (s / "0" / "metrics.csv").write_text("no,header,here\n1,2,3\n")
    report = compare([s])
    assert report.cells[0].seeds == 1 and report.cells[0].target_steps == []
    assert any("metrics.csv left out: no 'step' column" in n for n in report.notes)


def test_metrics_csv_drops_the_final_evaluation_and_half_written_lines(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text(HEADER + "0,9,3.0,2.0,0.1,\n0,19,,1.5,0.2,\n1,20,,1.4,0.3,\n1,20,,,,0.25\n0,2")
    series = read_metrics(path)
    assert series["val/loss"] == [(10, 2.0), (20, 1.5)]  # the validation at the final step is the best checkpoint's
    assert series["test/exact_match"] == [(21, 0.25)]
    assert series["train/loss"] == [(10, 3.0)]


def test_mean_band_aligns_runs_logged_at_different_steps():
    x, mean, std = mean_band([{1.0: 1.0, 3.0: 3.0}, {2.0: 4.0, 4.0: 6.0}])
    assert x.tolist() == [1, 2, 3, 4]
    assert mean.tolist() == pytest.approx([1.0, 3.0, 4.0, 6.0])  # step 2: (2 + 4) / 2, the first interpolated
    assert std.tolist() == pytest.approx([0.0, math.sqrt(2), math.sqrt(2), 0.0])


def test_writes_pngs_markdown_csv_and_json(sweep, tmp_path):
    import matplotlib.pyplot as plt

    report = compare([sweep], out=tmp_path / "report")
    written = write(report)
    names = sorted(p.name for p in written)
    assert names == ["comparison.csv", "comparison.json", "comparison.md", "comparison_by_length.png",
                     "comparison_val_loss.png"]
    for png in ("comparison_val_loss.png", "comparison_by_length.png"):
        image = plt.imread(tmp_path / "report" / png)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0
    md = (tmp_path / "report" / "comparison.md").read_text()
    assert "| best | norm | seeds | val/loss | val/exact_match | test/exact_match |" in md
    assert "| * | post | 1 | 0.5000 |" in md
    assert "| pre | 2 | 1.5000 +- 0.7071 | 0.8000 +- 0.1414 |" in md
    assert "![validation loss](comparison_val_loss.png)" in md
    assert "![exact_match by sequence length](comparison_by_length.png)" in md
    assert "## Failed runs" in md and "ValueError: bad shape" in md and "## Skipped runs" in md
    rows = (tmp_path / "report" / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("best,norm,seeds,val/loss_mean,val/loss_std")
    assert rows[1].startswith("1,post,1,0.5,") and rows[2].startswith("0,pre,2,1.5,0.707")
    data = json.loads((tmp_path / "report" / "comparison.json").read_text())
    assert data["cells"][1]["target_steps"] == [20, 10] and data["failed"][0]["error"].startswith("ValueError")


def test_tied_best_cells_are_all_marked(sweep):
    report = compare([sweep], sort="params")  # post 900, pre 1000
    assert [c.best for c in report.cells] == [True, False]
    report = compare([sweep], sort="steps:min")  # 30 steps in both
    assert [c.best for c in report.cells] == [True, True] and "(a tie)" in terminal(report)


def test_by_length_plot_needs_by_length_data(tmp_path):
    write_run(tmp_path / "s" / "0", ["seed=0"], done(1.0, 0.5, 0.5), val_em=[0.1, 0.2])
    written = write(compare([tmp_path / "s"]))
    assert "comparison_val_loss.png" in [p.name for p in written]
    assert "comparison_by_length.png" not in [p.name for p in written]


def test_sweeps_combined_cells_by_what_differs(tmp_path):
    """Two sweeps without multirun.yaml: pos differs between them (a group choice), model.n_layers is set in one
    and left default in the other (its value then comes from the run's config.yaml)."""
    for i, pos in enumerate(("rotary", "alibi")):
        d = write_run(tmp_path / pos / "0", [f"pos={pos}", "seed=0"] + (["model.n_layers=4"] if i else []),
                      done(1.0 + i, 0.5, 0.5))
        (d / "config.yaml").write_text("model:\n  n_layers: 2\n" if i == 0 else "model:\n  n_layers: 4\n")
    report = compare([tmp_path / "rotary", tmp_path / "alibi"], out=tmp_path / "out")
    assert report.keys == ["pos", "model.n_layers"]
    assert [c.label for c in report.cells] == ["pos=rotary model.n_layers=2", "pos=alibi model.n_layers=4"]


def test_the_same_directory_twice_counts_each_run_once(sweep):
    assert cells(compare([sweep, sweep / "0", sweep]))["norm=pre"].seeds == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"target": "val/exact_match=0.9"}, r"--target 'val/exact_match=0.9' is not METRIC OP VALUE.*--target none"),
    ({"target": "val/acc>=0.9"}, r"no run logs 'val/acc'; metrics.csv columns: .*val/exact_match"),
    ({"sort": "val/nope"}, r"--sort 'val/nope': no such column; choose one of .*val/loss"),
    ({"sort": "steps"}, r"cannot tell whether lower or higher is better; write steps:min or steps:max"),
    ({"sort": "val/loss:down"}, r"must be min or max"),
    ({"sort": "target", "target": "none"}, r"needs a target"),
    ({"metrics": ["val/bleu"]}, r"--metrics val/bleu: not in the results; choose from .*val/loss"),
])
def test_bad_expressions_are_refused_naming_the_value(sweep, kwargs, match):
    with pytest.raises(CompareError, match=match):
        compare([sweep], **kwargs)


def test_bad_directories_are_refused(tmp_path):
    with pytest.raises(CompareError, match=r"nowhere does not exist; give a sweep directory"):
        compare([tmp_path / "nowhere"])
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(CompareError, match=r"empty holds no runs \(no results.json or .hydra/overrides.yaml"):
        compare([tmp_path / "empty"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(CompareError, match="is not a directory"):
        compare([tmp_path / "file"])
    write_run(tmp_path / "s" / "0", ["seed=0"], done(1.0, 0.5, 0.5))
    with pytest.raises(CompareError, match="--length-metric 'bleu': choose one of exact_match, acc"):
        write(compare([tmp_path / "s"]), length_metric="bleu")


def test_cli_prints_the_table_writes_files_and_exits_2_on_bad_input(sweep, tmp_path):
    run = lambda *args: scripts.run([sys.executable, "compare.py", *map(str, args)], cwd=ROOT,
                                       capture_output=True, text=True, timeout=120)
    ok = run(sweep, "--no-plots", "--sort", "val/exact_match")
    assert ok.returncode == 0, ok.stderr
    assert "*     pre       2" in ok.stdout and "running or interrupted" in ok.stdout
    assert (sweep / "comparison.md").is_file() and not (sweep / "comparison_val_loss.png").exists()
    bad = run(tmp_path / "nowhere")
    assert bad.returncode == 2 and "error:" in bad.stderr and "nowhere does not exist" in bad.stderr
    assert run(sweep, "--target", "x=>1").returncode == 2


def test_nan_metric_sorts_last_and_json_stays_strict(tmp_path):
    s = tmp_path / "s"
    write_run(s / "0", ["norm=pre", "seed=0"], done(float("nan"), 0.5, 0.5))
    write_run(s / "1", ["norm=post", "seed=0"], done(3.0, 0.5, 0.5))
    report = compare([s])
    assert [c.label for c in report.cells] == ["norm=post", "norm=pre"] and report.cells[0].best
    assert "  nan  " in terminal(report)
    write(report, plots=False)
    data = json.loads((s / "comparison.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in json"))
    assert data["cells"][1]["stats"]["val/loss"]["mean"] is None


def by_context(ppl: dict[int, float], train_length: int = 64) -> dict:
    rows = [{"length": n, "mode": "non_overlapping", "ppl": p, "applicable": True} for n, p in ppl.items()]
    rows.append({"length": 4 * max(ppl), "applicable": False, "reason": "a learned table"})
    return {"by_context": {"split": "test", "train_length": train_length, "rows": rows,
                           "ppl_ratio": ppl[max(ppl)] / ppl[train_length]}}


def test_by_context_plot_and_the_perplexity_ratio_column(tmp_path):
    import matplotlib.pyplot as plt

    s = tmp_path / "s"
    write_run(s / "0", ["pos=rotary", "seed=0"], done(1.0, 0.0, 0.0, **by_context({64: 5.0, 128: 10.0})))
    write_run(s / "1", ["pos=rotary", "seed=1"], done(1.0, 0.0, 0.0, **by_context({64: 5.0, 128: 20.0})))
    write_run(s / "2", ["pos=alibi", "seed=0"], done(1.2, 0.0, 0.0, **by_context({64: 6.0, 128: 6.0})))
    report = compare([s], out=tmp_path / "report")
    by_cell = {c.label.split("=")[-1]: c for c in report.cells}
    assert "by_context/ppl_ratio" in report.columns, report.columns
    assert by_cell["rotary"].stats["by_context/ppl_ratio"].mean == pytest.approx(3.0)  # (2 + 4) / 2
    assert by_cell["alibi"].stats["by_context/ppl_ratio"].mean == pytest.approx(1.0)
    written = [p.name for p in write(report)]
    assert "comparison_by_context.png" in written
    image = plt.imread(tmp_path / "report" / "comparison_by_context.png")
    assert image.shape[0] > 100 and image.std() > 0


def test_runs_of_different_tasks_are_ranked_only_within_each_task(tmp_path):
    for task, loss in (("reverse", 0.5), ("shakespeare_char", 1.5), ("reverse", 0.2), ("shakespeare_char", 1.2)):
        n = len(list(tmp_path.glob("*/*")))
        write_run(tmp_path / task / str(n), [f"task={task}", f"model.n_layers={n}", "seed=0"], done(loss, 0.5, 0.5))
    sources = [tmp_path / "reverse", tmp_path / "shakespeare_char"]
    with pytest.raises(CompareError, match=r"2 tasks \(reverse, shakespeare_char\).*add --group-by task"):
        compare(sources, out=tmp_path / "out")
    report = compare(sources, out=tmp_path / "out", group_by="task")
    assert report.keys[0] == "task"
    assert [(c.values["task"], c.stats["val/loss"].mean, c.best) for c in report.cells] == [
        ("reverse", 0.2, True), ("reverse", 0.5, False), ("shakespeare_char", 1.2, True),
        ("shakespeare_char", 1.5, False)]
    out = scripts.run([sys.executable, "compare.py", *map(str, sources), "--out", str(tmp_path / "o2")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--group-by task" in out.stderr


def scaling_sweep(tmp_path: Path, exponents: dict[str, float]) -> Path:
    """norm x width x budget: the best width of each budget follows loss = 10 C^-b exactly; the other width is
    worse by 5%. Seeds 0 and 1 of each cell differ by +-1% (their mean is on the law)."""
    s = tmp_path / "scaling"
    s.mkdir()
    i = 0
    for norm, b in exponents.items():
        for budget in (1e11, 2e11, 4e11, 8e11):
            for width, worse in ((32, 1.0), (64, 1.05)):
                for seed, jitter in ((0, 1.01), (1, 0.99)):
                    loss = 10 * budget ** -b * worse * jitter
                    flops = budget * (1 + 0.004 * (width == 64))  # a budget is met to within rounding
                    write_run(s / str(i), [f"norm={norm}", f"model.d_model={width}", f"budget.flops={budget:g}",
                                           f"seed={seed}"], done(loss, 0.0, 0.0, total_flops=flops,
                                                                  flops_per_token=1e5 * width))
                    i += 1
    return s


def test_scaling_fits_the_power_law_of_the_compute_frontier_per_variant(tmp_path):
    report = compare([scaling_sweep(tmp_path, {"pre": 0.05, "post": 0.08})], scaling="norm")
    fits = {f.variant: f for f in report.scaling}
    assert set(fits) == {"pre", "post"}
    for variant, b in (("pre", 0.05), ("post", 0.08)):
        fit = fits[variant]
        assert len(fit.frontier) == 4 and all("model.d_model=32" in label for _, _, label in fit.frontier)
        assert fit.exponent == pytest.approx(b, abs=1e-3) and fit.exponent_se < 1e-2
        assert fit.coefficient == pytest.approx(10, rel=0.05)
    text = terminal(report)
    assert "norm=pre: loss = " in text and "over 4 budgets" in text
    written = write(report)
    assert (report.out_dir / "comparison_scaling.png") in written
    data = json.loads((report.out_dir / "comparison.json").read_text())
    assert data["scaling"]["key"] == "norm" and len(data["scaling"]["fits"]) == 2
    assert "## Scaling" in (report.out_dir / "comparison.md").read_text()


def test_scaling_exponent_error_grows_with_scatter(tmp_path):
    from archsweep.core.report.scaling import power_law

    exact = [(c, 10 * c ** -0.1, "") for c in (1e10, 1e11, 1e12, 1e13)]
    noisy = [(c, v * f, "") for (c, v, _), f in zip(exact, (1.1, 0.9, 1.1, 0.9), strict=True)]
    b, se, a = power_law(exact)
    assert b == pytest.approx(0.1) and se == pytest.approx(0, abs=1e-9) and a == pytest.approx(10)
    assert power_law(noisy)[1] > 0.01
    assert power_law(exact[:2])[1] is None and power_law(exact[:1]) == (None, None, None)


def test_scaling_refuses_a_key_that_does_not_vary_or_runs_without_flops(tmp_path, sweep):
    s = scaling_sweep(tmp_path, {"pre": 0.05})
    with pytest.raises(CompareError, match="not a key that varies"):
        compare([s], scaling="norm")
    with pytest.raises(CompareError, match="no completed run has total_flops"):
        compare([sweep], scaling="norm")


def test_compare_table_shows_params_and_flops_side_by_side(tmp_path):
    report = compare([scaling_sweep(tmp_path, {"pre": 0.05})])
    assert {"params", "flops_per_token", "total_flops"} <= set(report.columns)
    header = terminal(report).splitlines()[3]
    assert header.index("params") < header.index("FLOPs/token") < header.index("total FLOPs")


def test_loss_against_flops_plot_reads_the_logged_running_total(tmp_path):
    from archsweep.core.report.plots import flops_curves

    s = tmp_path / "s"
    s.mkdir()
    d = write_run(s / "0", ["norm=pre"], done(1.0, 0.0, 0.0, total_flops=3e9))
    (d / "metrics.csv").write_text("epoch,step,train/loss,val/loss,train/flops\n0,9,1.5,,1e9\n0,9,,2.0,\n"
                                   "0,19,,1.9,\n0,29,1.2,,3e9\n0,29,,1.8,\n")
    (curve,) = flops_curves(compare([s]).cells[0])
    assert sorted(curve.items()) == [(1e9, 2.0), (2e9, 1.9), (3e9, 1.8)]  # val steps placed at the FLOPs spent


def test_language_model_runs_default_to_loss_and_perplexity_without_an_exact_match_target(tmp_path):
    """results.json's task_family lm: no val/exact_match column (0 over any window of text) and no default target;
    runs that do not say (older results) keep the general defaults."""
    lm = {"task_family": "lm", "val": {"loss": 1.5, "ppl": 4.48, "exact_match": 0.0},
          "test": {"loss": 1.6, "ppl": 4.95, "exact_match": 0.0}}
    for n, seed in enumerate((0, 1)):
        write_run(tmp_path / "lm" / str(n), ["task=shakespeare_char", f"seed={seed}"], {**done(1.5, 0.0, 0.0), **lm},
                  val_em=[0.0, 0.0])
    write_run(tmp_path / "lm" / "2", ["task=shakespeare_char", "seed=2"], {"status": "failed", "error": "OOM"})
    report = compare([tmp_path / "lm"], out=tmp_path / "out")
    assert report.columns[:4] == ["val/loss", "val/ppl", "test/loss", "test/ppl"]
    assert not any("exact_match" in c for c in report.columns)
    assert report.target is None
    write_run(tmp_path / "old" / "0", ["seed=0"], done(1.0, 0.5, 0.4), val_em=[0.5, 0.95])
    old = compare([tmp_path / "old"], out=tmp_path / "out2")
    assert "val/exact_match" in old.columns and old.target is not None


def test_active_params_show_only_where_a_run_leaves_parameters_unused(tmp_path):
    s = tmp_path / "s"
    s.mkdir()
    write_run(s / "0", ["norm=pre", "seed=0", "logger=csv"], done(1.0, 0.9, 0.8, active_params=1000))
    assert "active_params" not in compare([s]).columns  # dense runs: active equals total, no column
    write_run(s / "1", ["norm=post", "seed=0", "logger=csv"], done(1.1, 0.9, 0.8, params=4000, active_params=1500))
    report = compare([s])
    header = terminal(report).splitlines()[3]
    assert header.index("tokens/s") < header.index(" params ") < header.index("active params")
    assert {c.label: c.stats["active_params"].mean for c in report.cells} == {"norm=pre": 1000, "norm=post": 1500}


def test_mfu_against_a_probed_peak_is_labelled_an_estimate_with_its_source(tmp_path):
    probed = {"mfu": 0.25, "mfu_estimate": True, "peak_source": "CPU probe, 2 h old, load 0.3 on 2 cores"}
    sheet = {"mfu": 0.4, "mfu_estimate": False, "peak_source": "Lightning's table for NVIDIA H100"}
    write_run(tmp_path / "cpu" / "0", ["norm=pre"], done(1.0, 0.5, 0.5, **probed))
    write_run(tmp_path / "cpu" / "1", ["norm=post"], done(1.1, 0.5, 0.5, **probed))
    write_run(tmp_path / "gpu" / "0", ["norm=pre"], done(1.0, 0.5, 0.5, **sheet))
    write_run(tmp_path / "gpu" / "1", ["norm=post"], done(1.1, 0.5, 0.5, **sheet))
    cpu, gpu = terminal(compare([tmp_path / "cpu"])), terminal(compare([tmp_path / "gpu"]))
    assert "MFU (est.)" in cpu and "25.0%" in cpu
    assert "MFU (est.) of 2 runs is an estimate, against a probed peak (CPU probe, 2 h old, load 0.3 on 2 cores)" in cpu
    assert "  MFU  " in gpu and "40.0%" in gpu and "MFU (est.)" not in gpu and "probed peak" not in gpu
