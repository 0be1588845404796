"""compare.py --wandb: the comparison as one W&B run, read back from the offline files W&B wrote (the run record
with tests/wandb_reader.py, the table and the images from the run's files/media); --wandb off starts none; a mode
that cannot work is refused with the comparison's files kept."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import scripts
from test_compare import done, write_run
from wandb_reader import read_run

from archsweep.cli import compare_main
from archsweep.core.report import compare

ROOT = Path(__file__).resolve().parents[1]
LRS = ("0.001", "0.003", "0.01")
# validation loss by norm and lr (pre is best at 0.003, post at 0.01); test loss is validation + 0.02
VAL = {"pre": {"0.001": 1.30, "0.003": 1.00, "0.01": 1.10}, "post": {"0.001": 1.50, "0.003": 1.40, "0.01": 1.20}}
NOISE = {0: 0.0, 1: 0.03, 2: 0.01}  # per seed, added to both losses
SPREAD = {0: 0.0, 1: 0.01, 2: -0.01}  # per seed, added to post-norm's test loss: paired differences 0.2 +- 0.01
ARGS = ["--tune", "optim.lr", "--baseline", "norm=pre", "--sort", "test/loss", "--target", "none"]


def flops_of(job: int) -> float:
    return 1e9 * (job + 1)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """norm=pre,post x optim.lr x seed=0,1,2 (18 completed runs) and one diverged post-norm run at its best lr, each
    recording its W&B group, its training FLOPs, and a config.yaml whose logger names the project."""
    s = tmp_path / "sweep"
    job = 0
    for norm, by_lr in VAL.items():
        for lr, loss in by_lr.items():
            for seed, noise in NOISE.items():
                test_loss = loss + noise + 0.02 + (SPREAD[seed] if norm == "post" else 0.0)
                results = {**done(loss + noise, 0.5, 0.5, seed=seed), "test": {"loss": test_loss},
                           "group": "demo-group", "total_flops": flops_of(job)}
                d = write_run(s / str(job), [f"norm={norm}", f"optim.lr={lr}", f"seed={seed}"], results,
                              val_em=[0.1, 0.2])
                (d / "config.yaml").write_text("logger:\n  project: demo-project\n  entity: null\n  mode: auto\n")
                job += 1
    diverged = {**done(float("nan"), 0.0, 0.0, seed=3), "status": "diverged", "group": "demo-group",
                "diverged": {"step": 20, "reason": "loss is nan"}, "total_flops": flops_of(job)}
    write_run(s / str(job), ["norm=post", "optim.lr=0.01", "seed=3"], diverged)
    return s


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline, with no credentials, its caches and staging inside tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT",
                "WANDB_ENTITY", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(var, raising=False)
    for var, folder in (("WANDB_CACHE_DIR", "wandb-cache"), ("WANDB_CONFIG_DIR", "wandb-config"),
                        ("WANDB_DATA_DIR", "wandb-data")):
        monkeypatch.setenv(var, str(tmp_path / folder))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc entry


def test_offline_comparison_run_holds_the_table_and_the_plots(sweep, tmp_path, offline):
    out = tmp_path / "report"
    done_ = scripts.run([sys.executable, str(ROOT / "compare.py"), "sweep", "--out", "report", *ARGS, "--wandb",
                         "offline"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done_.returncode == 0, done_.stderr
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    assert f"W&B comparison run: {Path('report') / 'wandb' / run_dir.name}" in done_.stdout
    (record,) = run_dir.glob("run-*.wandb")
    run = read_run(record)
    assert (run["name"], run["job_type"], run["group"], run["project"]) == ("comparison", "comparison",
                                                                            "demo-group", "demo-project")
    config = {k: v for k, v in run["config"].items() if not k.startswith("_")}
    assert config == {"metric": "test/loss", "lower_better": True, "baseline": "norm=pre", "alpha": 0.05,
                      "sequential": False, "biased": False, "keys": ["norm"], "tuned": ["optim.lr"],
                      "selection": "val/loss", "sources": ["sweep"], "run_groups": ["demo-group"]}

    (table_file,) = (run_dir / "files" / "media" / "table").glob("comparison_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["cell", "norm", "optim.lr", "best", "seeds", "runs", "test/loss_mean",
                                "test/loss_std", "diff", "ci_low", "ci_high", "p", "p_holm", "verdict",
                                "flops_spent"]
    rows = {row[0]: dict(zip(table["columns"], row, strict=True)) for row in table["data"]}
    assert list(rows) == ["norm=pre", "norm=post"]  # best first
    pre, post = rows["norm=pre"], rows["norm=post"]
    pre_test = [1.00 + n + 0.02 for n in NOISE.values()]
    post_test = [1.20 + NOISE[s] + 0.02 + SPREAD[s] for s in NOISE]
    assert (pre["optim.lr"], pre["best"], pre["seeds"], pre["runs"]) == ("0.003", True, 3, 9)
    assert (post["optim.lr"], post["best"], post["seeds"], post["runs"]) == ("0.01", False, 3, 10)
    assert pre["test/loss_mean"] == statistics.fmean(pre_test)
    assert pre["test/loss_std"] == statistics.stdev(pre_test)
    assert post["test/loss_mean"] == statistics.fmean(post_test)
    assert pre["verdict"] == "baseline" and pre["diff"] is None and pre["p"] is None
    # the same seeds in both cells: the paired t-test on the differences 0.2, 0.21, 0.19 (2 degrees of freedom,
    # where the two-sided p is 1 - t / sqrt(2 + t^2) and the 95% quantile sqrt(1.805 / 0.0975))
    t, half = 0.2 / (0.01 / math.sqrt(3)), math.sqrt(1.805 / 0.0975) * 0.01 / math.sqrt(3)
    assert post["diff"] == pytest.approx(0.2, abs=1e-12) and post["verdict"] == "worse"
    assert [post["ci_low"], post["ci_high"]] == pytest.approx([0.2 - half, 0.2 + half], abs=1e-9)
    assert post["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-6)
    assert post["p_holm"] == post["p"]  # one comparison: Holm leaves p as it is
    assert pre["flops_spent"] == sum(flops_of(j) for j in range(9))
    assert post["flops_spent"] == sum(flops_of(j) for j in range(9, 19))  # the un-chosen lrs and the diverged run

    # the numbers are the report's own
    report = compare([sweep], tune=["optim.lr"], baseline="norm=pre", sort="test/loss", target="none")
    test = next(c.test for c in report.cells if c.label == "norm=post")
    assert [post[k] for k in ("diff", "ci_low", "ci_high", "p", "p_holm", "verdict")] == [
        test.diff, test.low, test.high, test.p, test.p_holm, test.verdict]

    images = {k.rsplit("/", 1)[0]: v for k, v in run["history"][0].items() if k.endswith("/path")
              and run["history"][0][k.replace("/path", "/_type")] == "image-file"}
    pngs = sorted(out.glob("*.png"))
    assert sorted(images) == [p.stem for p in pngs] and "comparison_val_loss" in images
    for png in pngs:
        assert (run_dir / "files" / images[png.stem]).read_bytes() == png.read_bytes()
    assert run["summary"]["best"] == ["norm=pre"] and run["summary"]["verdicts"] == {"worse": 1}
    assert run["summary"]["flops_spent"] == sum(flops_of(j) for j in range(19))


def test_off_by_default_starts_no_wandb_run(sweep, tmp_path, offline, capsys):
    assert compare_main([str(sweep), "--out", str(tmp_path / "report"), *ARGS]) == 0
    assert compare_main([str(sweep), "--out", str(tmp_path / "off"), *ARGS, "--wandb", "off"]) == 0
    for out in ("report", "off"):
        assert (tmp_path / out / "comparison.md").is_file() and not (tmp_path / out / "wandb").exists()
    assert "W&B" not in capsys.readouterr().out


def test_a_mode_that_cannot_work_is_refused_and_the_files_are_kept(sweep, tmp_path, offline, capsys, monkeypatch):
    out = tmp_path / "online"
    assert compare_main([str(sweep), "--out", str(out), *ARGS, "--wandb", "online"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --wandb online: no W&B credentials") and err.count("\n") == 1
    assert (out / "comparison.md").is_file() and not (out / "wandb").exists()

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    out = tmp_path / "missing"
    assert compare_main([str(sweep), "--out", str(out), *ARGS, "--wandb", "offline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --wandb offline: W&B cannot be imported") and "pip install wandb" in err
    assert err.count("\n") == 1 and (out / "comparison.csv").is_file() and not (out / "wandb").exists()
