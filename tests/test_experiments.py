"""Experiment presets, parameter matching, launcher configs and the shape trace (no training here; the sweeps
themselves run in test_sweeps.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import scripts
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType

from archsweep.core.data.tasks.synthetic import ReverseTask
from archsweep.core.eval.trace import trace_rows
from archsweep.core.model.build import ModelConfig, build_model, count_parameters, match_d_ff, parameter_count
from archsweep.core.train.config.setup import ConfigError
from archsweep.core.train.lifecycle.checks import build_task, model_config
from archsweep.core.train.lifecycle.job import cpu_threads
from archsweep.variants.pos import POS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ABLATIONS = ["norm_placement", "positional", "ffn_activation", "architecture", "vit_positions", "stability",
             "optimizers", "doc_masking", "attention_gates"]


def compose_train(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=hydra)


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def sweep_values(params) -> dict[str, list[str]]:
    """A preset's sweep, with glob(*) over a group expanded to that group's options, as Hydra's sweeper does (a
    single value, which pins a key an inherited preset sweeps, as a one-value list)."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.key_or_group: o.value().filter(options(o.key_or_group)) if o.value_type == ValueType.GLOB_CHOICE_SWEEP
            else [str(o.value())] if o.value_type == ValueType.ELEMENT
            else [str(x) for x in o.sweep_string_iterator()] for o in parsed}


@pytest.mark.parametrize("name", ABLATIONS)
def test_ablation_preset_is_a_whole_grid_with_seeds(name):
    cfg = compose_train(f"experiment={name}", hydra=True)
    grid = sweep_values(cfg.hydra.sweeper.params)
    assert len(grid["seed"]) >= 2  # several seeds, for error bars
    assert len(grid) >= 2 and all(len(v) >= 2 for v in grid.values())
    assert cfg.experiment_name == name
    assert cfg.hydra.sweep.dir == f"outputs/sweeps/{name}"  # fixed: re-running it skips finished cells


def test_doc_masking_grid_is_samplings_by_masks_at_a_tuned_rate_against_random_windows_unmasked():
    cfg = compose_train("experiment=doc_masking", hydra=True)
    grid = sweep_values(cfg.hydra.sweeper.params)
    assert grid["task.sampling"] == ["random", "bos_aligned"] and grid["task.doc_mask"] == ["False", "True"]
    assert len(grid["optim.lr"]) >= 3 and list(cfg.compare.tune) == ["optim.lr"]
    assert cfg.compare.baseline == "task.sampling=random task.doc_mask=false" and cfg.task.name == "tokens"
    assert cfg.model.kind == "decoder_only" and cfg.task.block_size == cfg.model.max_seq_len == 256


def test_norm_placement_grid_is_placements_by_warmup_by_a_tuned_learning_rate():
    cfg = compose_train("experiment=norm_placement", hydra=True)
    grid = sweep_values(cfg.hydra.sweeper.params)
    assert grid["norm"] == options("norm")  # glob(*): a new placement joins the grid
    assert grid["schedule.warmup_steps"] == ["0", "100"] and len(grid["optim.lr"]) == 4 and cfg.model.n_layers == 6
    assert list(cfg.compare.tune) == ["optim.lr"] and cfg.compare.baseline == "norm=pre"


def test_stability_preset_is_qk_norm_by_logit_softcap_tuned_up_to_the_unstable_rates():
    cfg = compose_train("experiment=stability", hydra=True)
    grid = sweep_values(cfg.hydra.sweeper.params)
    assert grid["qk_norm"] == ["none", "layernorm"] and grid["logit_softcap"] == ["none", "gemma2"]
    assert compose_train("logit_softcap=gemma2").model.plugins.logit_softcap.cap == 30.0  # Gemma 2's cap
    assert cfg.model.norm._target_.endswith("PreNorm") and cfg.model.kind == "decoder_only"
    assert max(map(float, grid["optim.lr"])) >= 0.08 and list(cfg.compare.tune) == ["optim.lr"]  # reaches the unstable
    assert cfg.diagnostics.spike_factor < 2.0  # spikes counted at a character LM's scale


def test_optimizers_preset_gives_both_optimisers_one_learning_rate_grid():
    cfg = compose_train("experiment=optimizers", hydra=True)
    grid = sweep_values(cfg.hydra.sweeper.params)
    assert grid["optim"] == ["adamw", "muon"] and len(grid["optim.lr"]) >= 4
    assert compose_train("experiment=optimizers", "optim=muon").optim.name == "muon"


def test_positional_preset_covers_every_encoding_and_a_longer_split():
    cfg = compose_train("experiment=positional", hydra=True)
    token_encodings = [p for p in options("pos") if not getattr(POS.get(p), "image_only", False)]
    assert sorted(sweep_values(cfg.hydra.sweeper.params)["pos"]) == token_encodings  # all a decoder can take
    assert "test_long" in build_task(cfg).test_splits


def built_params(*overrides: str) -> int:
    cfg = compose_train(*overrides)
    return count_parameters(build_model(model_config(cfg, build_task(cfg))))


@pytest.mark.slow  # builds every model of two presets, matched and not
@pytest.mark.parametrize("preset,axis", [("ffn_activation", "ffn"), ("architecture", "model")])
def test_presets_match_parameter_counts(preset, axis):
    grid = sweep_values(compose_train(f"experiment={preset}", hydra=True).hydra.sweeper.params)
    counts = {option: built_params(f"experiment={preset}", f"{axis}={option}") for option in grid[axis]}
    assert max(counts.values()) / min(counts.values()) < 1.002, counts
    # the unmatched models really differ, so the matching is doing the work
    plain = {option: built_params(f"experiment={preset}", f"{axis}={option}", "match_params=null")
             for option in grid[axis]}
    assert max(plain.values()) / min(plain.values()) > 1.002 or axis == "ffn", plain


def tiny(**changes) -> ModelConfig:
    base = dict(kind="decoder_only", vocab_size=20, d_model=32, n_heads=2, n_layers=2, d_ff=64)
    return ModelConfig(**{**base, **changes})


@pytest.mark.parametrize("ffn", ["relu", "swiglu"])
def test_match_d_ff_picks_the_closest_count(ffn):
    cfg = tiny(ffn=ffn)
    target = 31_337
    matched, count = match_d_ff(cfg, target)
    assert count == count_parameters(build_model(matched)) == parameter_count(matched)
    others = {d: parameter_count(dataclasses.replace(cfg, d_ff=d)) for d in range(1, 400)}
    assert abs(count - target) == min(abs(n - target) for n in others.values())


def test_match_params_reference_model_from_the_command_line():
    cfg = compose_train("task=reverse", "model=decoder_only", "ffn=geglu", "match_params={ffn: relu}")
    reference = compose_train("task=reverse", "model=decoder_only", "ffn=relu")
    matched = model_config(cfg, build_task(cfg))
    assert cfg.model.d_ff == matched.d_ff != 256  # the resolved config records the solved size
    assert abs(parameter_count(matched) - built_params("task=reverse", "model=decoder_only", "ffn=relu")) < 200
    assert reference.model.d_ff == 256


@pytest.mark.parametrize("value,match", [
    ("10", "below the .* parameters this model has with d_ff=1"),
    ("{ffn: relux}", "ffn='relux' is not a known option.*did you mean 'relu'"),
    ("{colour: red}", "unknown model config field"),
    ("-5", "must be a positive parameter count"),
])
def test_match_params_errors(value, match):
    cfg = compose_train("task=reverse", f"match_params={value}")
    with pytest.raises(ConfigError, match=match):
        model_config(cfg, build_task(cfg))


def test_match_params_refuses_a_fixed_gated_size():
    with pytest.raises(ValueError, match="set those model.ffn options to null"):
        match_d_ff(tiny(ffn={"name": "swiglu", "gated_d_ff": 40}), 30_000)


def test_launcher_configs_compose_and_split_threads():
    slurm = compose_train("hydra/launcher=slurm", hydra=True)
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher")
    assert slurm.hydra.launcher.gpus_per_node == 1
    joblib = compose_train("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", hydra=True)
    local = compose_train("hydra/launcher=submitit_local", hydra=True)
    own = compose_train("hydra/launcher=joblib", "threads=3", hydra=True)
    try:
        HydraConfig.instance().set_config(slurm)
        assert cpu_threads(slurm) == slurm.hydra.launcher.cpus_per_task == 8
        HydraConfig.instance().set_config(joblib)
        assert cpu_threads(joblib) == max(1, (__import__("os").cpu_count() or 1) // 2)
        HydraConfig.instance().set_config(local)
        assert cpu_threads(local) == 1
        HydraConfig.instance().set_config(own)
        assert cpu_threads(own) == 3
        HydraConfig.instance().set_config(compose_train(hydra=True))
        assert cpu_threads(compose_train(hydra=True)) is None  # basic launcher: torch's default
    finally:
        HydraConfig.instance().cfg = None


def test_optuna_search_composes():
    cfg = compose_train("hparams_search=optuna", hydra=True)
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper")
    assert set(cfg.hydra.sweeper.params) == {"optim.lr", "schedule.warmup_steps", "model.dropout"}
    assert cfg.objective == "val/loss" and cfg.hydra.sweeper.max_failure_rate == 1.0


def test_trace_rows_follow_the_tensor_flow():
    task = ReverseTask(n_symbols=8, min_len=3, max_len=6, batch_size=5, val_batches=1, test_batches=1,
                       long_max_len=None, eval_seed=0)
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=task.vocab_size, d_model=24, n_heads=3, n_layers=2,
                      n_decoder_layers=1, d_ff=40, n_kv_heads=1)
    model = build_model(cfg)
    batch = next(iter(task.dataloader("train", "encoder_decoder", seed=0)))
    rows = trace_rows(model, batch, task.forward_fn("encoder_decoder"))
    (b, s), t = batch["src"].shape, batch["tgt_in"].shape[1]
    shapes = {}
    for _, stage, shape, names in rows:
        shapes.setdefault((stage.split("  ")[0], names), []).append(shape)
    assert shapes[("scores = Q K^T / sqrt(Dh), masked", "B H S S")] == [(b, 3, s, s)] * 2  # 2 encoder layers
    assert shapes[("scores = Q K^T / sqrt(Dh), masked", "B H T T")] == [(b, 3, t, t)]
    assert shapes[("scores = Q K^T / sqrt(Dh), masked", "B H T S")] == [(b, 3, t, s)]  # cross-attention
    assert shapes[("Q", "B H T Dh")] == [(b, 3, t, 8)] * 2
    assert shapes[("FFN up_proj, then relu", "B S F")] == [(b, s, 40)] * 2
    assert shapes[("logits (output projection, tied to the embedding)", "B T V")] == [(b, t, task.vocab_size)]
    assert any("1 key/value heads, each shared by 3" in stage for _, stage, _, _ in rows)
    assert model.training  # restored


@pytest.mark.slow  # a train.py subprocess
def test_trace_shapes_from_the_command_line():
    out = scripts.run([sys.executable, "train.py", "trace_shapes=true", "logger=none", "model=decoder_only",
                          "pos=rotary", "task.batch_size=4", f"hydra.run.dir={ROOT}/outputs/.trace_test"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("shape trace: decoder_only, norm=post, pos=rotary")
    q_rows = [line for line in lines if "Q  (split into heads; Q and K rotated)" in line]
    assert len(q_rows) == 4 and all("(4, 4, " in line for line in q_rows)  # 4 layers, B=4, H=4
    assert "logits" in lines[-1] and "B T V" in lines[-1]
    assert not (ROOT / "outputs/.trace_test/checkpoints").exists()  # nothing was trained


def test_vit_positions_grid_is_encodings_by_pooling_on_digits():
    cfg = compose_train("experiment=vit_positions", hydra=True)
    grid = sweep_values(cfg.hydra.sweeper.params)
    assert grid == {"pos": ["learned", "sincos2d", "none"], "model.pooling": ["cls", "mean"], "seed": ["0", "1", "2"]}
    assert cfg.model.kind == "vit" and cfg.task._target_.endswith("DigitsTask")
    assert cfg.model.norm._target_.endswith("PreNorm") and cfg.model.ffn._target_.endswith("GELUFFN")  # the paper's
