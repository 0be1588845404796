"""Muon (Jordan et al. 2024): the Newton-Schulz iteration against its scalar polynomial on the singular values, the
update against a reference written here, which parameters it takes, its AdamW part against torch's AdamW, training,
checkpoint state, and the refusals of bad settings."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.config.schemas import MUON_NS_DTYPES, MUON_SCALINGS, MuonSchema, typed
from archsweep.core.train.optimisers.muon import Muon, newton_schulz
from archsweep.core.train.optimisers.optim import make_optimizer

A, B, C = 3.4445, -4.7750, 2.0315
CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_muon(*overrides: str):
    """train.yaml's `optim` group with optim=muon, composed against its schema."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=["optim=muon", *overrides]).optim


MUON = OmegaConf.to_container(compose_muon())


@pytest.mark.parametrize("shape", [(128, 64), (192, 64), (64, 256), (7, 300), (300, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_puts_every_singular_value_within_half_and_one_and_a_half(shape, dtype):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    out = newton_schulz(g, steps=5, dtype=dtype)
    assert out.shape == g.shape and out.dtype == g.dtype
    s = torch.linalg.svdvals(out.float())
    assert s.min() >= 0.5 and s.max() <= 1.5, (s.min(), s.max())


def test_newton_schulz_cannot_lift_a_vanishing_singular_value():
    """The documented range needs singular values not vanishingly small next to the Frobenius norm: near 0 the
    iteration multiplies by a^5 ~ 486 in 5 steps, so a square Gaussian matrix (smallest singular value ~ 1/n of
    the others) keeps one well below 0.5. Gradients are rarely that ill-conditioned; the limit is the reference's
    too."""
    g = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(newton_schulz(g))
    assert s.max() <= 1.5 and s.min() < 0.5 and (s >= 0.5).float().mean() > 0.95


def test_newton_schulz_is_its_quintic_on_the_singular_values():
    """An odd matrix polynomial keeps the singular vectors and maps each singular value s by p(s) = a s + b s^3 +
    c s^5, five times, after dividing by the Frobenius norm: U p^5(S / |G|) V^T."""
    g = torch.randn(48, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    s = s / (g.norm() + 1e-7)
    for _ in range(5):
        s = A * s + B * s ** 3 + C * s ** 5
    torch.testing.assert_close(newton_schulz(g, 5, torch.float64), u @ torch.diag(s) @ vh)


def reference_muon_steps(w: torch.Tensor, grads: list[torch.Tensor], lr: float, m: float) -> torch.Tensor:
    """The reference's update written out: EMA momentum, Nesterov blend, orthogonalise (by SVD and the quintic),
    scale by max(1, rows/cols)^0.5."""
    w, buf = w.clone().double(), torch.zeros_like(w, dtype=torch.float64)
    for g in grads:
        g = g.double()
        buf = m * buf + (1 - m) * g
        u, s, vh = torch.linalg.svd((1 - m) * g + m * buf, full_matrices=False)
        s = s / (s.square().sum().sqrt() + 1e-7)
        for _ in range(5):
            s = A * s + B * s ** 3 + C * s ** 5
        w = w - lr * max(1.0, w.shape[0] / w.shape[1]) ** 0.5 * (u @ torch.diag(s) @ vh)
    return w


@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])  # tall: scaled by sqrt(3); wide: by 1
def test_update_shape_and_scaling_match_the_reference(shape):
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(*shape, generator=gen)
    grads = [torch.randn(*shape, generator=gen) for _ in range(3)]
    p = nn.Parameter(w0.clone())
    opt = Muon([{"params": [p], "muon": True}], lr=0.05, momentum=0.9)
    scale = max(1, shape[0] / shape[1]) ** 0.5
    for g in grads:
        before = p.detach().clone()
        p.grad = g.clone()
        opt.step()
        # each step: lr * scale * a near-orthogonal matrix, whose Frobenius norm is about sqrt(min(rows, cols))
        size = (p.detach() - before).norm().item() / (0.05 * scale * min(shape) ** 0.5)
        assert 0.7 < size < 1.2, size
    torch.testing.assert_close(p.detach().double(), reference_muon_steps(w0, grads, 0.05, 0.9), atol=2e-5, rtol=0)


def test_moonlight_scaling_is_point_two_sqrt_of_the_larger_dimension():
    p = nn.Parameter(torch.zeros(96, 32))
    q = nn.Parameter(torch.zeros(96, 32))
    p.grad = q.grad = torch.randn(96, 32)
    Muon([{"params": [p], "muon": True}], lr=0.1, scaling="moonlight").step()
    Muon([{"params": [q], "muon": True}], lr=0.1, scaling="reference").step()
    expected = q.detach() * (0.2 * 96 ** 0.5 / 3 ** 0.5)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def tiny(**overrides) -> nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind="decoder_only", vocab_size=17, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
               norm="pre", pos="rotary")
    return build_model(ModelConfig(**{**cfg, **overrides}))


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "pos": "learned"},
                                       {"kind": "encoder_only", "plugins": {"qk_norm": {"type": "rmsnorm"}}},
                                       {"kind": "encoder_decoder",
                                        "plugins": {"value_residual": {"learnable": True}}}])
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(overrides):
    model = tiny(**overrides)
    opt = make_optimizer(model, MUON)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.param_groups if g["muon"] for p in g["params"]}
    adam = {names[id(p)] for g in opt.param_groups if not g["muon"] for p in g["params"]}
    projections = ("qkv_proj.weight", "out_proj.weight", "up_proj.weight", "down_proj.weight", "q_proj.weight",
                   "kv_proj.weight")
    assert muon == {n for n in names.values() if n.endswith(projections)}
    assert adam == set(names.values()) - muon  # every parameter once
    assert not [n for n in muon if "embed" in n or "head" in n or "norm" in n]
    assert opt.param_groups[0]["muon"] and opt.param_groups[0]["lr"] == MUON["lr"]  # train/lr logs Muon's rate
    assert all(g["lr"] == MUON["adamw_lr"] for g in opt.param_groups[1:])
    if not model.config.tie_embeddings:
        assert any(n.startswith("head") or "lm_head" in n for n in adam)


def test_the_adamw_part_equals_torch_adamw():
    gen = torch.Generator().manual_seed(3)
    ours, theirs = nn.Parameter(torch.randn(5, 3, generator=gen)), None
    theirs = nn.Parameter(ours.detach().clone())
    bias, bias2 = nn.Parameter(torch.randn(3, generator=gen)), None
    bias2 = nn.Parameter(bias.detach().clone())
    settings = dict(lr=0.01, betas=(0.9, 0.98), eps=1e-9)
    a = Muon([{"params": [ours], "weight_decay": 0.1}, {"params": [bias]}], **settings)
    b = torch.optim.AdamW([{"params": [theirs], "weight_decay": 0.1}, {"params": [bias2], "weight_decay": 0.0}],
                          **settings)
    for _ in range(4):
        g, gb = torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen)
        ours.grad, theirs.grad, bias.grad, bias2.grad = g, g.clone(), gb, gb.clone()
        a.step()
        b.step()
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(bias, bias2)


def batch_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    logits = model(x[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())


def test_muon_trains_a_small_model():
    model = tiny()
    x = torch.randint(0, 17, (8, 12), generator=torch.Generator().manual_seed(4))
    opt = make_optimizer(model, MUON)
    first = batch_loss(model, x).item()
    for _ in range(30):
        opt.zero_grad()
        batch_loss(model, x).backward()
        opt.step()
    assert batch_loss(model, x).item() < 0.5 * first


def test_state_dict_round_trips_and_resumes_the_same_trajectory():
    x = torch.randint(0, 17, (4, 10), generator=torch.Generator().manual_seed(5))

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            batch_loss(model, x).backward()
            opt.step()

    model = tiny()
    opt = make_optimizer(model, MUON)
    steps(model, opt, 3)
    saved = io.BytesIO()  # through torch.save, as a checkpoint holds it
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved)
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    buf = opt.state[model.decoder.blocks[0].self_attn.qkv_proj.weight]
    assert set(buf) == {"momentum_buffer"}
    steps(model, opt, 3)
    again = tiny()
    again.load_state_dict(state["model"])
    opt2 = make_optimizer(again, MUON)
    opt2.load_state_dict(state["optimizer"])
    steps(again, opt2, 3)
    for (name, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6 * p.abs().max().item(), msg=name)


@pytest.mark.parametrize("shape", [(3,), (2, 3, 4, 5)])
def test_muon_refuses_a_vector_and_a_4d_tensor(shape):
    with pytest.raises(ValueError, match=r"2-D weight matrices, or stacks of them \(E, out, in\)"):
        Muon([{"params": [nn.Parameter(torch.zeros(shape))], "muon": True}], lr=0.1)


@pytest.mark.parametrize("scaling", MUON_SCALINGS)
@pytest.mark.parametrize("ns_dtype", MUON_NS_DTYPES)
def test_every_setting_the_schema_allows_takes_a_step(scaling, ns_dtype):
    """The schema's names are the ones Muon implements: each builds and moves the hidden matrices."""
    model = tiny()
    opt = make_optimizer(model, OmegaConf.to_container(compose_muon(f"optim.scaling={scaling}",
                                                                    f"optim.ns_dtype={ns_dtype}")))
    hidden = [p for g in opt.param_groups if g["muon"] for p in g["params"]]
    before = [p.detach().clone() for p in hidden]
    batch_loss(model, torch.randint(0, 17, (2, 6))).backward()
    opt.step()
    assert all(torch.isfinite(p).all() and not torch.equal(p, b) for p, b in zip(hidden, before, strict=True))


@pytest.mark.parametrize("key, value, match", [
    ("momentum", 1.0, r"optim.momentum=1.0 must be a number in \[0, 1\)"),
    ("ns_steps", 0, "optim.ns_steps=0 must be a positive whole number"),
    ("ns_dtype", "float16", "optim.ns_dtype='float16' must be one of float32, bfloat16"),
    ("scaling", "spectral", "optim.scaling='spectral' must be one of reference, moonlight"),
    ("adamw_lr", 0.0, "optim.adamw_lr=0.0 must be a positive learning rate"),
])
def test_bad_muon_settings_are_refused(key, value, match):
    assert isinstance(typed(compose_muon(), "optim"), MuonSchema)  # the shipped settings pass
    with pytest.raises(ValueError, match=match):
        typed(compose_muon(f"optim.{key}={value}"), "optim")


@pytest.mark.parametrize("key, value", [("nesterov", "maybe"), ("ns_steps", "five"), ("momentum", "high")])
def test_a_value_of_the_wrong_type_is_refused_when_composing(key, value):
    with pytest.raises(ConfigCompositionException) as caught:
        compose_muon(f"optim.{key}={value}")
    assert f"full_key: optim.{key}" in str(caught.value.__cause__)
