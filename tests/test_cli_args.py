"""Command-line arguments Hydra would misread or reject without naming them: a misspelt setting (`+nrom=pre`
trained post-norm), a sweep with a stray space (`-m norm=pre, post`), a digit-only prompt (Hydra reads it as a
number), a missing mandatory `ckpt`. Each answers with one line naming the argument and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import scripts

from archsweep.cli import CONF, check_overrides, missing_values, override_args
from archsweep.composition import composition_error

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_CKPT = ROOT / "tests" / "fixtures" / "pre_rename" / "last.ckpt"


@pytest.mark.parametrize("argv, expected", [
    (["+nrom=pre"], "'nrom' is not a setting of train.py (did you mean norm?)"),
    (["nrom=pre"], "'nrom' is not a setting of train.py (did you mean norm?)"),
    (["++sed=3"], "'sed' is not a setting of train.py (did you mean seed?)"),
    (["-m", "norm=pre,", "post"], "'norm=pre,': a sweep's values are one argument without spaces"),
    (["seed"], "'seed' (missing EQUAL at '<EOF>'); an override is key=value"),
])
def test_a_bad_argument_is_named_with_the_fix(argv, expected):
    assert expected in check_overrides(argv, "train")


@pytest.mark.parametrize("argv", [
    ["--cfg", "job", "norm=pre"],
    ["-m", "norm=pre,post", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    ["experiment=positional", "experiment_name=mine", "optim.lr=1e-3", "+trainer.detect_anomaly=true"],
    ["hparams_search=optuna", "hydra.sweeper.params.optim.lr=tag(log, interval(1e-4, 1e-2))"],
    ["~seed", "--info", "defaults", "trainer.max_steps=1"],
])
def test_good_arguments_pass(argv):
    assert check_overrides(argv, "train") is None


def test_evaluate_and_generate_know_their_own_settings():
    assert check_overrides(["ckpt=x", "task.test_batches=2", "decode_limit=4"], "evaluate") is None
    assert check_overrides(["ckpt=x", "prompt=31415", "decoding=beam"], "generate") is None
    assert "(did you mean prompt?)" in check_overrides(["ckpt=x", "promt=3"], "generate")


@pytest.mark.parametrize("argv, expected", [
    (["norm=prex"], "norm=prex: norm has no option 'prex' (did you mean pre?); the options of norm: deepnorm, "
                    "parallel, post, pre, sandwich"),
    (["-m", "seed=0,1", "norm=pre,pst"], "norm=pre,pst: norm has no option 'pst' (did you mean post?); the options"),
    (["model.d_modle=3"], "model.d_modle=3: model has no setting 'd_modle' (did you mean d_model?); the settings of "
                          "model: activation_checkpointing,"),
    (["-m", "optim.lr=1e-3,abc"], "optim.lr=1e-3,abc: Value 'abc' of type 'str' could not be converted to Float"),
])
def test_a_composition_hydra_refuses_is_one_line_naming_the_argument(argv, expected):
    problem = composition_error(override_args(argv), CONF, "train")
    assert problem.startswith(expected) and "\n" not in problem


def test_a_presets_mandatory_value_left_unset_is_named_with_an_example():
    # the preset's `init_from: ???` merges over train.yaml's null, which Hydra keeps: without this check the run
    # trained from scratch
    expected = "set init_from, e.g. init_from=outputs/runs/<run>, the run whose weights to start from"
    assert composition_error(["experiment=rope_scaling"], CONF, "train", missing_values) == expected
    assert composition_error(["experiment=rope_scaling", "init_from=x"], CONF, "train", missing_values) is None
    assert composition_error(["prompt=3 1 4"], CONF, "generate", missing_values).startswith("set ckpt, e.g. ckpt=")


def test_arguments_that_compose_pass_the_composition_check():
    argv = ["-m", "experiment=positional", "pos=rotary,alibi", "hydra/launcher=joblib", "+trainer.detect_anomaly=true"]
    assert composition_error(override_args(argv), CONF, "train") is None
    assert composition_error(["ckpt=x", "decoding=beam", "prompt=7"], CONF, "generate") is None


def run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    return scripts.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_misspelt_setting_stops_train_py_in_one_line_and_leaves_no_run(tmp_path):
    out = run("train.py", "+nrom=pre", f"output_root={tmp_path / 'outputs'}", cwd=tmp_path)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "error: +nrom=pre: 'nrom' is not a setting of train.py (did you mean norm?); `python train.py --help` lists "
        "the groups and settings"]
    assert not (tmp_path / "outputs").exists()


def test_a_sweep_hydra_cannot_compose_stops_in_one_line_before_its_sweep_directory(tmp_path):
    out = run("train.py", "-m", "norm=pre,pst", f"output_root={tmp_path / 'outputs'}", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: norm=pre,pst: norm has no option 'pst' (did you mean post?); the options of norm: deepnorm, parallel, "
        "post, pre, sandwich"]
    assert not (tmp_path / "outputs").exists()


def test_generate_without_ckpt_says_so_in_one_line(tmp_path):
    out = run("generate.py", "prompt=3 1 4", cwd=tmp_path)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "error: set ckpt, e.g. ckpt=outputs/runs/<run>/checkpoints/best.ckpt, or the run directory"]


@pytest.mark.slow
def test_digit_only_prompts_are_read_as_the_text_typed(tmp_path):
    # the fixture's task writes symbols separated by spaces: "31415" is one unknown symbol, "3" and "14" are known
    out = run("generate.py", f"ckpt={FIXTURE_CKPT}", "prompt=31415", cwd=tmp_path)
    assert out.returncode != 0 and "AttributeError" not in out.stderr
    assert "prompt has symbols this task does not know: 31415;" in out.stderr
    out = run("generate.py", f"ckpt={FIXTURE_CKPT}", "prompts=[3,14]", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "> 3\n" in out.stdout and "> 14\n" in out.stdout
