"""The `callbacks` config group: every option composes, checks and builds Lightning callbacks; EarlyStopping from
the command line stops a run early; a target that is not a Lightning callback is refused before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from archsweep.core.train.callback_group import check_callbacks, make_callbacks
from archsweep.core.train.job import ConfigError, check_training

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.val_check_interval=10",
        "trainer.log_every_n_steps=5", "eval.decode_samples=0", "diagnostics.attention_maps=false", "logger=csv"]


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def train(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}",
                           f"output_root={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "callbacks").glob("*.yaml")))
def test_every_option_builds_lightning_callbacks(option):
    import lightning as L

    checked = check_training(compose_train(f"callbacks={option}")).callbacks
    made = make_callbacks(checked)
    assert len(made) == len(checked) and all(isinstance(c, L.Callback) for c in made)
    if option in ("default", "none"):
        assert made == []


def test_command_line_adds_any_lightning_callback():
    cfg = compose_train("+callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor",
                        "+callbacks.lr.logging_interval=step", "callbacks=early_stopping")
    made = make_callbacks(check_training(cfg).callbacks)
    assert [type(c).__name__ for c in made] == ["EarlyStopping", "LearningRateMonitor"]
    assert check_training(compose_train("callbacks=early_stopping", "callbacks.early_stopping=null")).callbacks == {}


REFUSED = [
    (["+callbacks.x._target_=collections.OrderedDict"],
     r"callbacks.x._target_=collections.OrderedDict is not a Lightning callback \(a subclass of "
     r"lightning.pytorch.Callback\); name one, e.g. lightning.pytorch.callbacks.EarlyStopping, or remove the "
     r"entry with ~callbacks.x"),
    (["+callbacks.x._target_=lightning.pytorch.callbacks.EarlyStop"],
     r"callbacks.x._target_=lightning.pytorch.callbacks.EarlyStop cannot be imported \(Error loading "
     r"'lightning.pytorch.callbacks.EarlyStop': .* Are you sure that 'EarlyStop' is importable from module "
     r"'lightning.pytorch.callbacks'\?\); give the full import path"),
    (["+callbacks.x._target_=no_such_package.Callback"],
     r"cannot be imported \(Error loading 'no_such_package.Callback': ModuleNotFoundError\(\"No module named "
     r"'no_such_package'\"\) Are you sure that module 'no_such_package' is installed\?\)"),
    (["+callbacks.x.monitor=val/loss"], r"callbacks.x has no _target_; give the class of a Lightning callback"),
    (["callbacks=early_stopping", "+callbacks.early_stopping.patiance=2"],
     r"callbacks.early_stopping: lightning.pytorch.callbacks.EarlyStopping got an unexpected keyword argument "
     r"'patiance'; its arguments: monitor, min_delta, patience"),
]


@pytest.mark.parametrize("overrides, match", REFUSED)
def test_bad_entries_are_refused_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_training(compose_train(*overrides))


def test_default_check_imports_nothing_heavy():
    """With no callbacks (the default) and with a target that is not Lightning's, the check imports no Lightning."""
    code = ("import sys; from archsweep.core.train.callback_group import check_callbacks as c; c({}); c(None)\n"
            "try: c({'x': {'_target_': 'collections.OrderedDict'}})\nexcept ValueError: pass\n"
            "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    assert check_callbacks(None) == {} == check_callbacks({"off": None})


def test_help_lists_the_group(tmp_path):
    out = train("--help", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    options = sorted(p.stem for p in (CONF / "callbacks").glob("*.yaml"))
    assert f"callbacks: {', '.join(options)}" in out.stdout
    assert "early_stopping" in options and "none" in options


def test_train_refuses_a_bad_target_before_training(tmp_path):
    out = train("+callbacks.x._target_=collections.OrderedDict", tmp_path=tmp_path)
    assert out.returncode != 0
    assert "error: callbacks.x._target_=collections.OrderedDict is not a Lightning callback" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()  # refused before training: no run directory is left


@pytest.mark.slow
def test_early_stopping_from_the_command_line_stops_a_run_early(tmp_path):
    # min_delta 100: no later validation improves on the first, so patience 1 stops at the second (step 20 of 60)
    out = train(*TINY, "trainer.max_steps=60", "callbacks=early_stopping", "callbacks.early_stopping.patience=1",
                "callbacks.early_stopping.min_delta=100", tmp_path=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["status"] == "completed" and res["steps"] == 20
    assert res["choices"]["callbacks"] == "early_stopping"
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
