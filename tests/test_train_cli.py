"""train.py's command line before training: --help, and configurations refused with a message naming the
problem, without importing Lightning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import scripts

ROOT = Path(__file__).resolve().parents[1]
GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra")  # every group


def train(*args: str, tmp_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(extra_env or {})}
    return scripts.run([sys.executable, "train.py", *args, f"output_root={tmp_path}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_help_lists_every_group_and_option(tmp_path):
    out = train("--help", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    for group in GROUPS:
        options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
        assert f"{group}: {', '.join(options)}" in out.stdout


REFUSED = [
    (["model.n_heads=3"], r"n_heads=3 must divide d_model=64"),
    (["pos=learned", "model.max_seq_len=8"], r"model.max_seq_len=8 is shorter .* set model.max_seq_len>=33"),
    (["pos=rotary", "model.d_model=60", "model.n_heads=4"], r"pos=rotary needs an even head dimension"),
    (["model.vocab_size=5"], r"model.vocab_size=5 is smaller than task=reverse's vocabulary \(20\)"),
    (["+model.n_head=2"], r"unknown model config field\(s\): 'n_head' \(did you mean 'n_heads'\?\)"),
    (["task.max_len=2"], r"task.max_len=2 must be >= task.min_len=4"),
    (["optim.lr=-1"], r"optim.lr=-1.0 must be a positive learning rate"),
    (["schedule=cosine", "trainer.max_steps=100", "schedule.warmup_steps=100"],
     r"schedule.total_steps=100 must exceed schedule.warmup_steps=100"),
    (["label_smoothing=1.5"], r"label_smoothing=1.5 must be in \[0, 1\)"),
    (["logger.mode=sometimes"], r"logger.mode='sometimes' is not a known option; valid options: auto, online"),
    (["trainer.precision=8-mixed"],
     r"trainer.precision='8-mixed' is not a precision Lightning knows; choose one of .*bf16-mixed"),
    (["trainer.max_steps=0"], r"trainer.max_steps=0 must be a positive number of optimiser steps"),
    (["ckpt_path=/nonexistent/x.ckpt"], r"ckpt_path=/nonexistent/x.ckpt: no checkpoint file there"),
    (["ckpt_path=last"], r"ckpt_path=last: no run under .* launched with overrides"),
    (["norm=prenorm"], r"^error: norm=prenorm: norm has no option 'prenorm' \(did you mean pre\?\); the options of "
                       r"norm: deepnorm, parallel, post, pre, sandwich$"),  # Hydra's list of the options kept
    (["model.d_modle=3"], r"^error: model.d_modle=3: model has no setting 'd_modle' \(did you mean d_model\?\); "
                          r"the settings of model: activation_checkpointing, .*$"),
]


@pytest.mark.parametrize("args,message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_config_is_refused_with_a_message(tmp_path, args, message):
    out = train(*args, tmp_path=tmp_path)
    assert out.returncode != 0
    assert re.search(message, out.stderr, re.MULTILINE), out.stderr[-2000:]
    assert not list(tmp_path.iterdir()), "a refused config leaves no run directory under output_root"


def test_refusal_happens_before_lightning_is_imported(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPROFILEIMPORTTIME": "1"}
    out = subprocess.run([sys.executable, "train.py", "model.n_heads=3", f"output_root={tmp_path}"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "n_heads=3 must divide" in out.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time")}
    assert "hydra" in imported
    # the model kind's class is asked for its data form (the registry reads classes, so torch loads); the training
    # machinery is not (bench/refusals.py times the refusals)
    assert not {"lightning", "torchmetrics", "wandb"} & imported
