"""The `callbacks` config group: every option composes, checks and builds Lightning callbacks; EarlyStopping from
the command line stops a run early; a target that is not a Lightning callback is refused before training. And
train.py's own Progress callback: an ETA from the recent pace, validation excluded, restarted at a resume."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import scripts
from hydra import compose, initialize_config_dir

from archsweep.core.train.config.setup import ConfigError
from archsweep.core.train.lifecycle.checks import check_training
from archsweep.core.train.monitoring.callback_group import check_callbacks, make_callbacks
from archsweep.core.train.monitoring.callbacks import Progress

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
    return scripts.run([sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}",
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
    code = ("import sys; from archsweep.core.train.monitoring.callback_group import check_callbacks as c\n"
            "c({}); c(None)\n"
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


class Clock:
    """A fake clock for Progress: seconds advance only when a test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Module:
    def log(self, *args: object, **kwargs: object) -> None:
        pass


def fake_trainer(step: int = 0, max_steps: int = 1000) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=max_steps, log_every_n_steps=10, accumulate_grad_batches=1,
                           callback_metrics={"train/loss": 1.0}, optimizers=[], sanity_checking=False,
                           state=SimpleNamespace(fn="fit"))


def run_steps(progress: Progress, trainer: SimpleNamespace, clock: Clock, steps: int, seconds: float) -> None:
    for _ in range(steps):
        progress.on_train_batch_start(trainer, Module(), {"n_tokens": 100}, 0)
        clock.now += seconds
        trainer.global_step += 1
        progress.on_train_batch_end(trainer, Module(), None, {"n_tokens": 100}, 0)


def last_eta(caplog: pytest.LogCaptureFixture) -> float:
    line = [r.getMessage() for r in caplog.records if " | eta " in r.getMessage()][-1]
    return float(line.rsplit("eta ", 1)[1].removesuffix("s"))


def test_eta_follows_the_recent_pace_without_validation(caplog):
    clock, trainer = Clock(), fake_trainer()
    progress = Progress(0.0, clock=clock)
    progress.on_train_start(trainer, Module())
    with caplog.at_level(logging.INFO, logger="train"):
        run_steps(progress, trainer, clock, 100, 0.5)
        assert last_eta(caplog) == pytest.approx(900 * 0.5)
        progress.on_validation_start(trainer, Module())
        clock.now += 120.0  # a long validation: not training pace
        progress.on_validation_end(trainer, Module())
        run_steps(progress, trainer, clock, 10, 0.5)
        assert last_eta(caplog) == pytest.approx(890 * 0.5)
        run_steps(progress, trainer, clock, 200, 1.5)  # the machine got busy: 300 s at the new pace
        assert last_eta(caplog) == pytest.approx(690 * 1.5, rel=0.01)
    assert progress.tokens == 310 * 100


def test_eta_drops_the_start_up_window_once_the_next_is_timed(caplog):
    clock, trainer = Clock(), fake_trainer()
    progress = Progress(0.0, clock=clock)
    progress.on_train_start(trainer, Module())
    with caplog.at_level(logging.INFO, logger="train"):
        run_steps(progress, trainer, clock, 10, 5.0)  # workers starting, first allocations
        assert last_eta(caplog) == 990 * 5.0  # the only pace known so far
        run_steps(progress, trainer, clock, 10, 0.5)
        assert last_eta(caplog) == 980 * 0.5
        run_steps(progress, trainer, clock, 10, 1.0)  # 15 s over 20 steps, the newer (slower) window counting more
        assert 970 * 0.75 < last_eta(caplog) < 970 * 1.0


def test_eta_after_a_resume_uses_only_the_resumed_steps(caplog):
    clock, trainer = Clock(), fake_trainer()
    progress = Progress(0.0, clock=clock)
    progress.on_train_start(trainer, Module())
    run_steps(progress, trainer, clock, 50, 0.1)  # a fast first fit
    trainer.global_step = 900  # resumed from a checkpoint at step 900, on a slower machine
    progress.on_train_start(trainer, Module())
    with caplog.at_level(logging.INFO, logger="train"):
        run_steps(progress, trainer, clock, 10, 1.0)
    assert last_eta(caplog) == 90.0  # 90 steps at 1 s; elapsed / global step would say 1 s
    progress.on_train_end(trainer, Module())
    assert progress.train_s == pytest.approx(10.0)


def test_no_eta_without_max_steps(caplog):
    clock, trainer = Clock(), fake_trainer(max_steps=-1)
    progress = Progress(0.0, clock=clock)
    progress.on_train_start(trainer, Module())
    with caplog.at_level(logging.INFO, logger="train"):
        run_steps(progress, trainer, clock, 10, 1.0)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 10/")]
    assert "eta" not in line and line.endswith("100 tok/s")
