"""A run written before the package was renamed (`src` -> `archsweep`, flat model fields -> variant options)
still loads, evaluates to the numbers it gave then, and resumes (tests/fixtures/pre_rename/README.md)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import scripts
import torch
from omegaconf import OmegaConf
from parity import assert_parity

from archsweep.core.model.checkpoint import load_model, read_checkpoint
from archsweep.core.model.legacy import upgrade_model_fields

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "pre_rename"


def test_the_fixture_is_from_before_the_rename():
    raw = torch.load(FIXTURE / "last.ckpt", map_location="cpu", weights_only=True)["archsweep"]
    assert raw["config"]["task"]["_target_"].startswith("src.core.tasks.")
    assert raw["model_config"]["pos"] == "relative" and "rel_num_buckets" in raw["model_config"]


def test_old_checkpoint_loads_as_todays_model():
    meta = read_checkpoint(FIXTURE / "last.ckpt")["archsweep"]
    assert meta["config"]["task"]["_target_"] == "archsweep.core.data.tasks.synthetic.ReverseTask"
    model = load_model(FIXTURE / "last.ckpt")
    cfg = model.config
    assert cfg.pos == {"name": "relative", "num_buckets": 32, "max_distance": 128}
    assert cfg.ffn == {"name": "swiglu", "gated_d_ff": None} and cfg.norm == {"name": "pre"}
    assert type(model.encoder.pos).__name__ == "RelativeBias" and model.encoder.pos.bidirectional
    src = torch.randint(4, 20, (2, 5))
    assert model(src, src).shape == (2, 5, 20)


def test_flat_fields_go_to_the_chosen_variant_only():
    fields = {"pos": "rotary", "rope_base": 500.0, "rel_num_buckets": 32, "rel_max_distance": 128,
              "ffn": "gelu", "gelu_approximate": "tanh", "gated_d_ff": None, "norm": "post", "d_model": 8}
    assert upgrade_model_fields(fields) == {"pos": {"name": "rotary", "base": 500.0},
                                            "ffn": {"name": "gelu", "approximate": "tanh"},
                                            "norm": {"name": "post"}, "d_model": 8}
    current = {"pos": {"name": "rotary", "base": 500.0}, "d_model": 8}
    assert upgrade_model_fields(current) == current


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return scripts.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_old_checkpoint_evaluates_to_the_numbers_it_gave_then(tmp_path):
    out = run(str(ROOT / "evaluate.py"), f"ckpt={FIXTURE / 'last.ckpt'}", f"output={tmp_path / 'eval.json'}",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    now = json.loads((tmp_path / "eval.json").read_text())["splits"]
    then = json.loads((FIXTURE / "last.ckpt.eval.json").read_text())["splits"]
    trained = json.loads((FIXTURE / "results.json").read_text())
    assert set(now) == set(then) == {"test", "test_long"}
    for split in now:
        for key in ("n", "loss", "ppl", "acc", "exact_match"):
            assert now[split][key] == pytest.approx(then[split][key], rel=1e-6), (split, key)
        for key in ("loss", "acc", "exact_match"):  # what training recorded for the same checkpoint
            assert now[split][key] == pytest.approx(trained[split][key], rel=1e-5), (split, key)


def recorded_run_dir() -> Path:
    """The run directory the fixture's checkpoint callback recorded: where the fixture was made, elsewhere."""
    state = read_checkpoint(FIXTURE / "last.ckpt")["callbacks"]
    return Path(next(v["dirpath"] for k, v in state.items() if k.startswith("ModelCheckpoint"))).parent


def test_the_fixture_records_a_run_directory_outside_the_repository():
    # what made the resume below fail on any machine but the one that made the fixture (issue 32)
    assert recorded_run_dir().is_absolute() and not recorded_run_dir().is_relative_to(ROOT)


@pytest.mark.slow
def test_old_checkpoint_resumes(tmp_path):
    # the callback's state keeps the fixture's best and last paths, outside this test's folder: the run must finish
    # with checkpoints of its own (without a validation after the resume, no best one: the final weights evaluated)
    ckpt = tmp_path / "old.ckpt"
    shutil.copy(FIXTURE / "last.ckpt", ckpt)
    overrides = [o for o in OmegaConf.load(FIXTURE / "overrides.yaml") if not o.startswith("trainer.max_steps")]
    out = run(str(ROOT / "train.py"), *overrides, "trainer.max_steps=14", f"ckpt_path={ckpt}",
              f"hydra.run.dir={tmp_path / 'resumed'}", f"output_root={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 14
    assert results["resumed_from"] == str(ckpt)
    assert results["best_checkpoint"] in (None, str(tmp_path / "resumed" / "checkpoints" / "best.ckpt"))
    assert results["last_checkpoint"] == str(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert not any(str(recorded_run_dir()) in line for line in out.stdout.splitlines() + out.stderr.splitlines())
    with open(tmp_path / "resumed" / "metrics.csv") as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert steps and min(steps) >= 10  # it continued from step 10, not from scratch


PLUGINS = ROOT / "tests" / "fixtures" / "pre_plugins"  # runs from before the model options became plug-ins
EXPECTED = json.loads((PLUGINS / "expected.json").read_text()) if PLUGINS.is_dir() else {}


@pytest.mark.parametrize("name", ["a", "b"])
def test_a_checkpoint_from_before_the_plugins_computes_what_it_did(name):
    raw = torch.load(PLUGINS / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert "plugins" not in raw["archsweep"]["model_config"] and "attn_gate" in raw["archsweep"]["model_config"]
    model = load_model(PLUGINS / name / "checkpoints" / "last.ckpt")
    with torch.no_grad():
        logits = model(torch.tensor(EXPECTED[name]["tokens"]))[0]
    then = torch.tensor(EXPECTED[name]["logits"])
    # the same computation: within float32 rounding of another thread count (a weight read into the wrong place
    # moves the logits by far more than 1e-6 of their scale)
    assert_parity(logits, then, rtol=1e-6)
    plugins = model.config.plugins
    if name == "a":
        assert plugins == {"attn_gate": {"per": "head"}, "attn_sink": {"learned": True},
                           "logit_softcap": {"cap": 30.0}, "qk_norm": {"type": "rmsnorm"},
                           "value_residual": {"learnable": True, "weight": 0.5}, "z_loss": {"weight": 1e-3}}
        attn = model.decoder.blocks[1].self_attn
        assert attn.plugins["value_residual"].lambdas.requires_grad  # learned lambdas came back as parameters
    else:
        assert plugins == {"attn_gate": {"per": "channel"}, "attn_sink": {"learned": False},
                           "attn_softcap": {"cap": 20.0}, "mtp": {"depths": 1, "weight": 0.2}}
        assert model.config.norm_type == {"name": "dyt", "alpha": 0.5}
        assert len(model.plugins["mtp"].depths) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["a", "b"])
def test_a_run_from_before_the_plugins_resumes_as_it_did_then(name, tmp_path):
    """`resume=` with the run's old command line (`model.attn_gate=headwise`, read as `attn_gate=headwise`) continues
    with the same weights and optimiser state: the losses of the steps after the checkpoint equal the old code's."""
    run_dir = tmp_path / name
    shutil.copytree(PLUGINS / name, run_dir)
    out = run(str(ROOT / "train.py"), f"resume={run_dir}", "trainer.max_steps=14", "trainer.log_every_n_steps=1",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "note: model.attn_gate=" in out.stderr  # the old spelling, read as today's and said so
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 14
    with open(run_dir / "metrics.csv") as f:
        now = {row["step"]: float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")}
    then = EXPECTED[name]["resumed_train_loss"]
    # weights and Adam moments in their places: the old code's losses, within float32 rounding of another thread
    # count (a moment in the wrong place moves a loss by far more)
    assert {step: now[step] for step in then} == pytest.approx(then, rel=1e-6)
