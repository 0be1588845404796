"""Training diagnostics: per-block gradient norms against a per-block reference, residual-stream norms over real
tokens only, attention entropy against hand-made distributions, the attention-map grid (layers x heads), the
divergence and spike rules, accuracy by source length, the settings' checks, and train.py end to end (metrics.csv,
PNGs, W&B's offline run file, results.json, a run that really diverges)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scripts
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.data.tasks.addition import AdditionTask
from archsweep.core.data.tasks.is_sorted import IsSortedTask
from archsweep.core.data.tasks.synthetic import ReverseTask
from archsweep.core.eval.attention_maps import (
    GAP,
    attention_figure,
    grid_shapes,
    mean_entropy,
    parse_name,
    save_figure,
    tile,
)
from archsweep.core.eval.metrics import LengthTable, by_length, row_stats
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.config.diagnostics import DiagnosticsConfig, check_diagnostics, diagnostics_config
from archsweep.core.train.monitoring.diagnostic_callbacks import (
    DivergenceMonitor,
    grad_group,
    group_grad_norms,
    residual_hooks,
    token_norm,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=20",
        "trainer.val_check_interval=10", "trainer.log_every_n_steps=2", "schedule.warmup_steps=5"]


def tiny(kind: str, **overrides) -> torch.nn.Module:
    cfg = {"kind": kind, "vocab_size": 20, "d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "dropout": 0.0,
           **overrides}
    return build_model(ModelConfig(**cfg))


def train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_API_KEY", None)
    out = scripts.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


# --- gradient and residual-stream norms ---------------------------------------------------------------------

def test_grad_groups_are_blocks_embeddings_and_head():
    model = tiny("encoder_decoder", tie_embeddings=False, norm="pre")
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    norms = group_grad_norms(model)
    assert list(norms) == ["encoder.embed", "encoder.0", "encoder.1", "encoder.final_norm", "decoder.embed",
                           "decoder.0", "decoder.1", "decoder.final_norm", "head"]
    # every parameter in exactly one group: the squared norms of all-ones gradients add up to the parameter count
    assert sum(float(n) ** 2 for n in norms.values()) == pytest.approx(sum(p.numel() for p in model.parameters()))
    assert grad_group("decoder.blocks.11.cross_attn.q_proj.weight") == "decoder.11"
    assert grad_group("classifier.weight") == "classifier"


def test_group_grad_norms_equal_each_blocks_own_norm():
    model = tiny("encoder_decoder", tie_embeddings=False)
    src, tgt = torch.randint(4, 20, (3, 7)), torch.randint(4, 20, (3, 5))
    logits = model(src, tgt)
    F.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    got = {group: float(norm) for group, norm in group_grad_norms(model).items()}
    for stack in ("encoder", "decoder"):
        for i, block in enumerate(getattr(model, stack).blocks):
            grads = torch.cat([p.grad.flatten() for p in block.parameters()])
            assert got[f"{stack}.{i}"] == pytest.approx(float(grads.norm()), rel=1e-5)
    total = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert math.sqrt(sum(v * v for v in got.values())) == pytest.approx(float(total), rel=1e-5)


def test_token_norm_averages_real_tokens_only():
    x = torch.tensor([[[3.0, 4.0], [0.0, 1.0], [100.0, 0.0]]])  # (1, 3, 2): norms 5, 1, 100
    assert float(token_norm(x, None)) == pytest.approx(106 / 3)
    assert float(token_norm(x, torch.tensor([[True, True, False]]))) == pytest.approx(3.0)


@pytest.mark.parametrize("kind", ["encoder_only", "encoder_decoder"])
def test_residual_norms_ignore_padding(kind):
    """A padded row records the norms its unpadded self records: pad positions are left out of the mean."""
    model = tiny(kind).eval()
    x = torch.randint(4, 20, (1, 5))
    padded = torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.arange(8)[None, :] < 5

    def run(tokens, pad_mask):
        with torch.no_grad():
            if kind == "encoder_only":
                model(tokens, pad_mask)
            else:
                model(tokens, torch.randint(4, 20, (1, 4), generator=torch.Generator().manual_seed(0)), pad_mask)

    def record(tokens, pad_mask):
        out = {}
        handles = residual_hooks(model, out)
        run(tokens, pad_mask)
        for h in handles:
            h.remove()
        recorded = {k: float(v) for k, v in out.items()}
        out.clear()
        run(tokens, pad_mask)
        assert out == {}  # handles removed: a later forward records nothing
        return recorded

    plain, with_pad = record(x, None), record(padded, mask)
    stacks = ["encoder"] if kind == "encoder_only" else ["encoder", "decoder"]
    assert set(plain) == {f"{s}.{p}" for s in stacks for p in ("embed", "0", "1")}
    assert with_pad == pytest.approx(plain, rel=1e-5)


# --- attention entropy and maps -----------------------------------------------------------------------------

def test_mean_entropy_over_real_queries_in_nats():
    probs = torch.zeros(1, 2, 3, 4)  # (B, H, Tq, Tk)
    probs[0, 0, 0, :2] = 0.5  # uniform over two keys: ln 2
    probs[0, 1, 0, 3] = 1.0  # one-hot: 0
    probs[0, :, 1, :] = 0.25  # uniform over four keys: ln 4
    probs[0, :, 2, :] = 0.25  # a padded query: left out
    mask = torch.tensor([[True, True, False]])
    assert float(mean_entropy(probs, mask)) == pytest.approx((math.log(2) + 0 + 2 * math.log(4)) / 4)
    assert float(mean_entropy(probs, None)) == pytest.approx((math.log(2) + 4 * math.log(4)) / 6)


def test_tile_lays_out_layers_as_rows_and_heads_as_columns():
    layers = [torch.rand(2, 3, 4) for _ in range(3)]  # 3 layers of (H=2, Tq=3, Tk=4)
    image = tile(layers)
    assert image.shape == (3 * (3 + GAP) - GAP, 2 * (4 + GAP) - GAP)
    for r, probs in enumerate(layers):
        for h in range(2):
            top, left = r * (3 + GAP), h * (4 + GAP)
            assert torch.equal(image[top:top + 3, left:left + 4], probs[h])
    assert image[3].isnan().all() and image[:, 4].isnan().all()  # the gaps


def test_attention_figure_has_a_panel_per_kind_and_saves_a_png(tmp_path):
    maps = {"encoder.self_attn": [torch.rand(4, 5, 5).softmax(-1) for _ in range(3)],
            "decoder.cross_attn": [torch.rand(4, 6, 5).softmax(-1) for _ in range(3)]}
    labels = {"encoder.self_attn": (list("abcde"), list("vwxyz"))}
    assert grid_shapes(maps) == {"encoder.self_attn": (3, 4), "decoder.cross_attn": (3, 4)}
    fig = attention_figure(maps, labels, "test")
    assert len(fig.axes) == 3  # two panels and the colour bar
    for ax, layers in zip(fig.axes, maps.values(), strict=False):
        assert ax.images[0].get_array().shape == tuple(tile(layers).shape)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list("abcde")  # beside layer 0
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list("vwxyz") * 4  # under every head
    assert "query: source token" in fig.axes[0].get_ylabel() and "key: source token" in fig.axes[0].get_xlabel()
    assert fig.axes[-1].get_ylabel().startswith("attention probability")  # the colour bar
    assert fig.axes[1].get_yticklabels() == []  # no labels given
    path = save_figure(fig, tmp_path / "attention" / "step_7.png")
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(path).shape
    w_in, h_in = fig.get_size_inches()
    assert (width, height) == (round(w_in * fig.dpi), round(h_in * fig.dpi))
    assert height > width  # six rows of maps over four columns


def test_parse_name():
    assert parse_name("decoder.blocks.3.cross_attn") == ("decoder", "decoder.cross_attn", 3)
    with pytest.raises(ValueError, match="is not <stack>.blocks.<i>.<attn>"):
        parse_name("head")


# --- divergence and spikes ----------------------------------------------------------------------------------

def test_divergence_rules():
    ln_v = math.log(20)
    normal = DivergenceMonitor(factor=2.0, patience=3, spike_factor=2.0, stop=True)
    for step, loss in enumerate([ln_v * 1.1, 2.5, 1.5, 0.8, 0.3, 0.1, 0.05, 0.04]):
        assert normal.check(loss, step, 20) is None
    assert normal.spikes == 0

    nan = DivergenceMonitor(2.0, 3, 2.0, True)
    assert nan.check(float("nan"), 5, 20) == {"step": 5, "reason": "training loss is nan (not finite)"}

    slow = DivergenceMonitor(2.0, 3, 2.0, True)
    high = 2.0 * ln_v + 1
    assert [slow.check(loss, s, 20) for s, loss in enumerate([high, high, 1.0, high, high])] == [None] * 5
    found = slow.check(high, 9, 20)
    assert found["step"] == 9 and "3 consecutive checks" in found["reason"] and "ln(20)" in found["reason"]

    spiky = DivergenceMonitor(2.0, 3, 2.0, True)
    for s, loss in enumerate([1.0, 1.0, 2.5, 1.0, 1.9]):
        spiky.check(loss, s, 20)
    assert spiky.spikes == 1


# --- accuracy by source length ------------------------------------------------------------------------------

def test_length_metrics_count_rows_and_tokens_by_length():
    labels = torch.tensor([[5, 6, IGNORE_INDEX], [5, 6, 7], [7, 7, 7]])
    predicted = torch.tensor([[5, 6, 0], [5, 0, 7], [7, 7, 7]])
    logits = F.one_hot(predicted, 10).float()  # (B, T, V)
    metrics = LengthTable(max_len=5)
    metrics.update(row_stats(logits, labels), torch.tensor([2, 3, 3]))
    metrics.update(row_stats(logits[:1], labels[:1]), torch.tensor([2]))
    assert by_length(metrics.compute()) == {"2": {"n": 2, "exact_match": 1.0, "acc": 1.0},
                                            "3": {"n": 2, "exact_match": 0.5, "acc": 5 / 6}}


@pytest.mark.parametrize("task,kind", [
    (ReverseTask(16, 3, 9, 32, 1, 1, 0), "encoder_decoder"), (ReverseTask(16, 3, 9, 32, 1, 1, 0), "decoder_only"),
    (ReverseTask(16, 3, 9, 32, 1, 1, 0), "encoder_only"), (AdditionTask(10, 1, 4, 32, 1, 1, 0), "encoder_decoder"),
    (IsSortedTask(8, 2, 9, 32, 1, 1, 0), "encoder_only")])
def test_batches_carry_their_source_length(task, kind):
    batch = task.make_batch(7, kind, "test_long")
    if kind == "encoder_decoder":
        real = (batch["src"] != task.pad_id).sum(1)
    elif kind == "decoder_only":
        real = (batch["labels"] != IGNORE_INDEX).float().argmax(1).long()  # the separator's position
    else:
        real = (batch["tokens"] != task.pad_id).sum(1) - (1 if isinstance(task, IsSortedTask) else 0)  # no BOS
    assert torch.equal(batch["src_len"], real)
    assert int(batch["src_len"].min()) > task.max_len  # test_long is longer than training


# --- settings -----------------------------------------------------------------------------------------------

def test_train_yaml_defaults_are_the_documented_defaults():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train")
    assert check_diagnostics(cfg) == DiagnosticsConfig()
    assert diagnostics_config(None) == DiagnosticsConfig()


@pytest.mark.parametrize("block,match", [
    ({"every_n_steps": -1}, r"diagnostics.every_n_steps=-1 must be a number of training steps >= 0"),
    ({"every_n_steps": "ten"}, r"diagnostics.every_n_steps: Value 'ten' of type 'str' could not be converted to "
                               r"Integer"),
    ({"attention_maps": "maybe"}, r"diagnostics.attention_maps: Value 'maybe' is not a valid bool"),
    ({"spike_factor": 1.0}, r"diagnostics.spike_factor=1.0 must be a number > 1"),
    ({"divergence": {"factor": 0.5}}, r"diagnostics.divergence.factor=0.5 must be a number > 1"),
    ({"divergence": {"patience": 0}}, r"diagnostics.divergence.patience=0 must be a positive number"),
    ({"divergence": {"enabled": "sometimes"}}, r"diagnostics.divergence.enabled: Value 'sometimes' is not a valid "
                                               r"bool"),
    ({"every_n_step": 5}, r"diagnostics.every_n_step: Key 'every_n_step' not in 'DiagnosticsConfig'"),
    ({"divergence": {"limit": 5}}, r"diagnostics.divergence.limit: Key 'limit' not in 'DivergenceConfig'"),
])
def test_bad_settings_are_refused(block, match):
    with pytest.raises(ValueError, match=match):
        diagnostics_config(block)


def test_settings_check_imports_nothing_heavy():
    """job.py can check the block before Lightning is imported."""
    code = ("import sys; import archsweep.core.train.config.diagnostics as d\n"
            "d.diagnostics_config({'every_n_steps': 5}); "
            "print(sorted(m for m in ('torch', 'lightning', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_train_refuses_bad_settings_naming_the_field(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = scripts.run([sys.executable, "train.py", "diagnostics.divergence.patience=0", "logger=csv",
                          f"hydra.run.dir={tmp_path / 'run'}", f"output_root={tmp_path}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "diagnostics.divergence.patience=0 must be a positive number of log steps" in out.stderr


# --- end to end ---------------------------------------------------------------------------------------------

def test_train_logs_norms_entropy_maps_and_accuracy_by_length(tmp_path):
    from test_train_e2e import wandb_runs

    run_dir = tmp_path / "run"
    train(*TINY, "diagnostics.every_n_steps=5", f"hydra.run.dir={run_dir}", f"output_root={tmp_path}")
    res = json.loads((run_dir / "results.json").read_text())
    assert res["status"] == "completed" and res["diverged"] is None

    rows = metric_rows(run_dir)
    grad_steps = sorted(int(r["step"]) for r in rows if r.get("diag/grad_norm/encoder.0"))
    assert grad_steps == [4, 9, 14, 19]  # every 5th step, counted from 0 as metrics.csv does, log step or not
    assert {int(r["step"]) for r in rows if r.get("train/loss")} >= {9, 19}  # same numbering as Lightning's rows
    keys = set(rows[0])
    for stack in ("encoder", "decoder"):
        assert {f"diag/grad_norm/{stack}.0", f"diag/grad_norm/{stack}.embed", f"diag/resid_norm/{stack}.0",
                f"diag/resid_norm/{stack}.embed"} <= keys
    for row in (r for r in rows if r.get("diag/resid_norm/encoder.0")):  # post-norm: a LayerNorm's output
        assert float(row["diag/resid_norm/encoder.0"]) == pytest.approx(math.sqrt(32), rel=0.05)
    entropy = {k.removeprefix("diag/attn_entropy/"): [float(r[k]) for r in rows if r.get(k)]
               for k in keys if k.startswith("diag/attn_entropy/")}
    assert set(entropy) == {"encoder.blocks.0.self_attn", "decoder.blocks.0.self_attn", "decoder.blocks.0.cross_attn"}
    for values in entropy.values():
        assert len(values) == 2 and all(0 < v < math.log(9) for v in values)  # two validations; <= 9 keys
    assert any(r.get("diag/loss_spikes") for r in rows)

    pngs = sorted(p.name for p in (run_dir / "attention").iterdir())
    assert pngs == ["step_10.png", "step_20.png"]
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(run_dir / "attention" / "step_20.png").shape
    [(_, run)] = wandb_runs(run_dir)  # the reader flattens the image record's fields to diag/attention/<field>
    images = [h for h in run["history"] if h.get("diag/attention/_type", "").startswith("images")]
    assert len(images) == 2 and images[-1]["diag/attention/count"] == 1
    assert (images[-1]["diag/attention/width"], images[-1]["diag/attention/height"]) == (width, height)
    [media] = images[-1]["diag/attention/filenames"]
    assert len(list(run_dir.glob(f"wandb/offline-run-*/files/{media}"))) == 1

    by_length = res["by_length"]
    assert set(by_length) == {"test", "test_long"}
    assert {int(n) for n in by_length["test"]} <= set(range(4, 9))
    assert {int(n) for n in by_length["test_long"]} <= set(range(9, 17))
    for split in ("test", "test_long"):
        cells = by_length[split].values()
        assert sum(c["n"] for c in cells) == 32  # 2 test batches of 16
        exact = sum(c["n"] * c["exact_match"] for c in cells) / 32
        assert exact == pytest.approx(res[split]["exact_match"], abs=1e-6)


@pytest.mark.parametrize("lr", [100.0, 1e30])
def test_diverging_run_is_stopped_and_marked(tmp_path, lr):
    """lr=100: the loss explodes but stays finite (patience rule); lr=1e30: NaN at the first check."""
    run_dir = tmp_path / "run"
    train(*TINY, "trainer.max_steps=40", "schedule=constant", "schedule.warmup_steps=0", f"optim.lr={lr}",
          "trainer.gradient_clip_val=null", "logger=csv", f"hydra.run.dir={run_dir}", f"output_root={tmp_path}")
    res = json.loads((run_dir / "results.json").read_text())
    assert res["status"] == "diverged" and res["steps"] < 40
    assert res["diverged"]["step"] == res["steps"]
    assert "loss" in res["val"] and set(res["test"]) == {"loss", "ppl", "acc", "exact_match"}
    if lr == 1e30:
        assert "not finite" in res["diverged"]["reason"] and res["steps"] == 2
        assert math.isnan(res["val"]["loss"]) and res["best_checkpoint"] is None
    else:
        assert "consecutive checks" in res["diverged"]["reason"] and res["steps"] == 6  # checks at 2, 4, 6
        assert math.isfinite(res["val"]["loss"]) and res["val"]["loss"] > 2 * math.log(20)


def test_attention_figure_grows_with_the_sequence_and_thins_its_labels():
    from archsweep.core.eval.attention_maps import SHOWN

    short = attention_figure({"decoder.self_attn": [torch.rand(2, 8, 8).softmax(-1)]}, {}, "short")
    names = [chr(97 + i % 26) if i % 7 else " " for i in range(64)]
    long = attention_figure({"decoder.self_attn": [torch.rand(2, 64, 64).softmax(-1)]},
                            {"decoder.self_attn": (names, names)}, "long")
    assert long.get_size_inches()[0] > short.get_size_inches()[0] + 2
    shown = [t.get_text() for t in long.axes[0].get_yticklabels()]
    assert 8 <= len(shown) < 64 and SHOWN[" "] in shown  # every k-th, spaces made visible
    assert all(t.get_rotation() == 0 for t in long.axes[0].get_xticklabels())  # one character: upright
