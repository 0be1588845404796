"""`ffn=moe` (variants/ffn/moe.py, experts.py): the same weights in Hugging Face's Mixtral and DeepSeek-V3 MoE blocks
give the same outputs; one expert top-1 is the dense SwiGLU FFN exactly; the grouped matmul equals the per-expert
loop; the losses, load figures and bias update against direct formulas; FLOPs, parameters, refusals; the model
kinds, cached decoding, activation checkpointing, torch.compile and train.py."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
import scripts
import torch
import torch.nn.functional as F
from torch.utils import flop_counter

from archsweep.core.model.build import ModelConfig, build_model, count_parameters, flops_per_token, match_field
from archsweep.variants.ffn.experts import groupable, grouped_linear
from archsweep.variants.ffn.moe import MoE
from archsweep.variants.ffn.swiglu import SwiGLU
from archsweep.variants.flops import Shape
from archsweep.variants.hooks import collect_diagnostics, step_updates
from tests.cache_check import assert_cached_decoding_equals_full_forward
from tests.parity import assert_parity

ROOT = Path(__file__).resolve().parents[1]
TOL = dict(rtol=1e-5, atol=1e-6)  # float32, compiled against eager (docs/options.md)


def moe(**options) -> MoE:
    fields = dict(d_model=32, d_ff=48, dropout=0.0, bias=False, n_experts=4, top_k=2)
    torch.manual_seed(0)
    return MoE(**{**fields, **options})


def tokens(n: int = 40, d: int = 32) -> torch.Tensor:
    return torch.randn(2, n // 2, d, generator=torch.Generator().manual_seed(3))


def order_one(layer: MoE) -> MoE:
    """The experts redrawn at std fan_in^-1/2: at the init's std 0.02 the routed outputs are ~1e-3, and a parity
    check beside them means little (tests/parity.py)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for matrix in layer.experts.weight_matrices():
            matrix.copy_(torch.randn(matrix.shape, generator=g) / matrix.shape[-1] ** 0.5)
    return layer.eval()


def mixtral_pair() -> tuple[MoE, torch.nn.Module]:
    """Our layer and Hugging Face's Mixtral block holding the same weights."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=24, num_local_experts=4,
                                        num_experts_per_tok=2, hidden_act="silu", router_jitter_noise=0.0)
    ours = order_one(moe(expert_d_ff=24))
    ref = MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.weight)
        ref.experts.gate_up_proj.copy_(torch.cat([ours.experts.gate_proj, ours.experts.up_proj], 1))
        ref.experts.down_proj.copy_(ours.experts.down_proj)
    return ours, ref


def deepseek_v3_options() -> dict:
    return dict(n_experts=8, n_shared=2, expert_d_ff=16, score="sigmoid", route_scale=2.5)


def deepseek_v3_pair() -> tuple[MoE, torch.nn.Module]:
    """Our layer (shared experts, the correction bias set) and Hugging Face's DeepSeek-V3 block, the same weights."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = transformers.DeepseekV3Config(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                           n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
                                           n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                                           hidden_act="silu")
    ours = order_one(moe(**deepseek_v3_options()))
    ref = DeepseekV3MoE(config).eval()
    with torch.no_grad():
        ours.route_bias.copy_(torch.randn(8, generator=torch.Generator().manual_seed(2)) * 0.1)
        ref.gate.weight.copy_(ours.router.weight)
        ref.gate.e_score_correction_bias.copy_(ours.route_bias)
        ref.experts.gate_up_proj.copy_(torch.cat([ours.experts.gate_proj, ours.experts.up_proj], 1))
        ref.experts.down_proj.copy_(ours.experts.down_proj)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(ref.shared_experts, name).weight.copy_(getattr(ours.shared, name).weight)
    return ours, ref


REFERENCES = {"mixtral": mixtral_pair, "deepseek_v3": deepseek_v3_pair}


def test_matches_mixtral_sparse_block():
    ours, ref = mixtral_pair()
    x = tokens()
    with torch.no_grad():
        assert_parity(ours(x), ref(x))


def test_matches_deepseek_v3_moe_with_shared_experts_and_the_correction_bias():
    ours, ref = deepseek_v3_pair()
    x = tokens()
    with torch.no_grad():
        assert_parity(ours(x), ref(x))
        unbiased = order_one(moe(**deepseek_v3_options()))
        assert not torch.allclose(unbiased(x), ours(x))  # the bias (changes which experts are picked) did


@pytest.mark.parametrize("reference", REFERENCES)
def test_one_expert_off_by_a_thousandth_fails_the_comparison(reference):
    """The parity checks above can see a 0.1% error in any one expert: each expert's down_proj in the reference
    scaled by 1.001 in turn, the same comparison fails."""
    ours, ref = REFERENCES[reference]()
    x = tokens()
    with torch.no_grad():
        assert_parity(ours(x), ref(x))
        for expert in range(ours.n_experts):
            ref.experts.down_proj[expert] *= 1.001
            with pytest.raises(AssertionError, match="not close"):
                assert_parity(ours(x), ref(x))
            ref.experts.down_proj[expert] /= 1.001
            assert_parity(ours(x), ref(x))


@pytest.mark.parametrize("bias", [False, True])
def test_one_expert_top_1_is_the_dense_swiglu_exactly(bias):
    dense = SwiGLU(32, 48, dropout=0.0, bias=bias)
    one = moe(n_experts=1, top_k=1, bias=bias)
    with torch.no_grad():
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(one.experts, name)[0].copy_(getattr(dense, name).weight)
            if bias:
                getattr(one.experts, name.replace("proj", "bias"))[0].copy_(getattr(dense, name).bias)
    x = tokens()
    torch.testing.assert_close(one(x), dense(x), rtol=0, atol=0)


def test_grouped_matmul_and_the_per_expert_loop_equal_the_float_computation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 32, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(4, 16, 32, generator=g).bfloat16().requires_grad_()
    bias = torch.randn(4, 16, generator=g).bfloat16().requires_grad_()
    counts = torch.tensor([7, 0, 30, 3])
    assert groupable(x, weight) and not groupable(x.float(), weight.float())
    exact = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    expert = torch.repeat_interleave(torch.arange(4), counts)
    ref = torch.einsum("nd,nfd->nf", exact[0], exact[1][expert]) + exact[2][expert]  # row by row, in float64
    ref_grads = torch.autograd.grad(ref.square().sum(), exact)
    for grouped in (True, False):
        out = grouped_linear(x, weight, bias, counts, grouped)
        grads = torch.autograd.grad(out.float().square().sum(), (x, weight, bias))
        for got, want in zip((out, *grads), (ref, *ref_grads), strict=True):  # bfloat16 rounding: 2^-8 relative
            torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-2 * want.abs().max().item())


def test_losses_equal_the_direct_formulas():
    layer = moe(n_experts=4, top_k=2).train()
    x = tokens()
    layer(x)
    losses = layer.aux_losses(torch.ones(1, dtype=torch.bool))
    logits = x.reshape(-1, 32) @ layer.router.weight.T  # (N, E)
    probs = logits.softmax(-1)
    chosen = probs.topk(2, -1).indices
    share = F.one_hot(chosen, 4).float().sum((0, 1)) / chosen.numel()  # f_e: share of the token slots
    torch.testing.assert_close(losses["moe_balance"].value, 4 * (share * probs.mean(0)).sum())
    torch.testing.assert_close(losses["router_z"].value, logits.logsumexp(-1).square().mean())
    assert (losses["moe_balance"].weight, losses["router_z"].weight) == (0.01, 0.001)
    assert layer.aux_losses(torch.ones(1, dtype=torch.bool)) == {}  # read once


def test_load_figures_and_dropped_slots_with_a_capacity():
    layer = moe(n_experts=4, top_k=2, capacity_factor=0.5).train()
    x = tokens()
    out = layer(x)
    chosen = (x.reshape(-1, 32) @ layer.router.weight.T).topk(2, -1).indices
    counts = torch.bincount(chosen.flatten(), minlength=4).float()
    capacity = 10  # ceil(0.5 x 40 slots / 4)
    figures = collect_diagnostics(torch.nn.ModuleDict({"layer": layer}))
    torch.testing.assert_close(torch.stack([figures[f"moe/layer/tokens/{e}"] for e in range(4)]), counts)
    torch.testing.assert_close(figures["moe/layer/cv"], counts.std(correction=0) / counts.mean())
    torch.testing.assert_close(figures["moe/layer/dropped"], (counts - capacity).clamp(min=0).sum())
    assert figures["moe/layer/dropped"] > 0
    layer.eval()  # evaluation is dropless: equals the training forward only where no slot was dropped
    assert not torch.allclose(layer(x), out)
    step_updates(layer)
    assert collect_diagnostics(layer) == {}


def test_the_bias_update_moves_the_load_toward_balance():
    layer = moe(n_experts=4, top_k=1, score="sigmoid", balance_weight=0.0, bias_update_rate=0.02).train()
    with torch.no_grad():
        layer.router.weight[0] += 0.5  # expert 0 takes most tokens
    x = tokens(200).abs()
    cvs = []
    for _ in range(30):
        layer(x)
        cvs.append(float(collect_diagnostics(layer)["moe//cv"]))
        step_updates(layer)
    assert cvs[-1] < 0.5 * cvs[0]
    assert layer.route_bias[0] < 0 and layer.route_bias.sum() < 0.3 * 30 * 0.02 * 4


def test_active_parameters_and_flops_count_top_k_and_shared_experts():
    layer = moe(n_experts=8, top_k=2, n_shared=1, bias=True)
    per_expert = 3 * 32 * 32 + 2 * 32 + 32  # gated, hidden = round(2 x 48 / 3) = 32, with biases
    shared = 3 * 32 * 32 + 2 * 32 + 32
    assert layer.active_params() == 8 * 32 + 2 * per_expert + shared
    assert sum(p.numel() for p in layer.parameters()) == 8 * 32 + 8 * per_expert + shared
    shape = Shape(2, 10)
    assert layer.flops(shape) == 20 * 2 * (8 * 32 + 2 * 3 * 32 * 32 + 3 * 32 * 32)
    assert layer.flops(shape.replace(total=True)) == 20 * 2 * (8 * 32 + 8 * 3 * 32 * 32 + 3 * 32 * 32)


@pytest.mark.parametrize("options", [dict(top_k=2), dict(top_k=3, n_shared=2, score="sigmoid"),
                                     dict(top_k=1, expert="relu")], ids=["top2", "top3_shared2", "relu_top1"])
def test_flops_equal_torchs_counter_on_a_forward(options):
    """Matrix products only, as torch's counter counts them: the router (2 D E a token), each token's top_k experts
    (dropless in evaluation: N top_k slots, whatever the assignment, one F.linear per expert over its slots) and the
    shared experts. Biases, activations and the routing weights are elementwise: neither side counts them."""
    layer = moe(n_experts=4, bias=True, **options).eval()
    x = tokens()  # (2, 20, 32)
    with flop_counter.FlopCounterMode(display=False) as counter:
        layer(x)
    assert layer.flops(Shape(2, 20)) == counter.get_total_flops()


def test_flops_less_the_dropped_slots_equal_torchs_counter_with_a_capacity():
    """With a capacity a training forward runs fewer slots than N top_k: `flops` counts the nominal top_k a
    token is routed to, so the counter sees exactly the dropped slots' expert products less."""
    layer = moe(n_experts=4, top_k=2, capacity_factor=0.5).train()
    x = tokens()
    with flop_counter.FlopCounterMode(display=False) as counter:
        layer(x)
    chosen = (x.reshape(-1, 32) @ layer.router.weight.T).topk(2, -1).indices  # (N, k) the actual assignment
    dropped = (torch.bincount(chosen.flatten(), minlength=4) - 10).clamp(min=0).sum().item()  # capacity 10
    per_slot = 2 * 3 * 32 * 32  # gate, up, down of hidden round(2 x 48 / 3) = 32
    assert dropped > 0
    assert layer.flops(Shape(2, 20)) - dropped * per_slot == counter.get_total_flops()


def config(**overrides) -> ModelConfig:
    fields = dict(kind="decoder_only", vocab_size=17, d_model=16, n_heads=2, n_layers=2, d_ff=48, dropout=0.0,
                  norm="pre", pos="rotary", ffn={"name": "moe", "n_experts": 4, "top_k": 2}, n_classes=3)
    return ModelConfig(**{**fields, **overrides})


@pytest.mark.parametrize("n_shared", [0, 1])
def test_match_flops_holds_active_flops_of_the_dense_model_within_2_percent(n_shared):
    shape = Shape(8, 64, causal=True)
    target = flops_per_token(config(ffn="swiglu", d_ff=96), shape)
    sparse = config(d_ff=96, ffn={"name": "moe", "n_experts": 8, "top_k": 2, "n_shared": n_shared})
    matched, found = match_field(sparse, target, lambda c: flops_per_token(c, shape), "match_flops")
    assert abs(found - target) / target < 0.02 and matched.d_ff < 96
    assert count_parameters(build_model(matched)) > count_parameters(build_model(config(ffn="swiglu", d_ff=96)))


@pytest.mark.parametrize(("options", "message"), [
    ({"top_k": 5}, "top_k=5 must be between 1 and n_experts=4"),
    ({"n_experts": 0, "top_k": 1}, "n_experts=0 must be at least 1"),
    ({"capacity_factor": 0.0}, "capacity_factor=0.0 must be positive"),
    ({"expert": "moe"}, "expert='moe' cannot be an expert .* valid: geglu, gelu, relu, relu2, swiglu"),
])
def test_bad_options_are_refused_before_building(options, message):
    with pytest.raises(ValueError, match=message):
        config(ffn={"name": "moe", "n_experts": 4, "top_k": 2, **options}).validate()


@pytest.mark.parametrize("kind", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_recomputation(kind):
    torch.manual_seed(0)
    model = build_model(config(kind=kind)).eval()
    x = torch.randint(1, 17, (2, 9))
    assert_cached_decoding_equals_full_forward(model, kind, x, torch.randint(1, 17, (2, 7)))


def test_encoder_only_with_checkpointing_gives_the_same_gradients():
    x = torch.randint(1, 17, (2, 9))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(config(kind="encoder_only", activation_checkpointing=checkpointing)).train()
        out = model(x)
        out.square().sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        step_updates(model)
    assert grads[0].keys() == grads[1].keys() and any("experts" in n for n in grads[0])
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


@pytest.mark.slow
def test_a_forward_under_torch_compile_equals_eager():
    torch.manual_seed(0)
    model = build_model(config()).eval()
    x = torch.randint(1, 17, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(x), model(x), **TOL)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "task"), [("decoder_only", "shakespeare_char"), ("encoder_decoder", "reverse"),
                                            ("encoder_only", "is_sorted")])
def test_train_py_logs_aux_losses_expert_load_and_active_parameters(tmp_path, kind, task):
    run_dir = tmp_path / "run"
    out = scripts.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", f"model={kind}", f"task={task}",
                          "ffn=moe", "model.ffn.n_experts=4", "model.ffn.capacity_factor=1.0",
                          "model.ffn.bias_update_rate=0.001", "trainer.max_steps=4", "trainer.log_every_n_steps=2",
                          "trainer.val_check_interval=4", "logger=csv", "eval.decode_samples=0",
                          f"hydra.run.dir={run_dir}", f"output_root={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("train/aux/moe_balance")]
    assert len(rows) == 2
    layer = "decoder.0.ffn" if kind != "encoder_only" else "encoder.0.ffn"
    for row in rows:
        assert float(row["train/aux/moe_balance"]) >= 1.0 - 1e-6 and float(row["train/aux/router_z"]) > 0
        load = [float(row[f"diag/moe/{layer}/tokens/{e}"]) for e in range(4)]
        assert sum(load) > 0 and float(row[f"diag/moe/{layer}/cv"]) >= 0
        assert float(row[f"diag/moe/{layer}/dropped"]) >= 0
    results = json.loads((run_dir / "results.json").read_text())
    assert 0 < results["active_params"] < results["params"]


@pytest.mark.slow
def test_ddp_trains_with_the_bias_update_summed_over_ranks(tmp_path):
    """Two CPU processes under torchrun: the run completes and the routing bias moved (the load is all-reduced)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "train.py"), "experiment=smoke", "model=decoder_only", "task=shakespeare_char", "ffn=moe",
           "model.ffn.n_experts=4", "model.ffn.bias_update_rate=0.01", "trainer=ddp", "trainer.max_steps=4",
           "trainer.val_check_interval=4", "logger=csv", "eval.decode_samples=0", f"hydra.run.dir={run_dir}",
           f"output_root={tmp_path}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    out = scripts.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2 and results["steps"] == 4
    (ckpt, *_) = sorted(run_dir.rglob("*.ckpt"))
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    bias = state["model.decoder.blocks.0.ffn.route_bias"]
    assert bias.abs().sum() > 0  # 4 updates of +-0.01 (0 where an expert's load was exactly the mean)
