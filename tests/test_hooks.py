"""The hooks through which a variant brings its own losses, parameters and costs (`variants/hooks.py`), on a toy
mixture of experts written here (stacked (E, out, in) expert matrices, top-1 routing, a balancing loss): its loss
is added and logged, its parameters are initialised, given to Muon and scaled by DeepNorm, its active and total
parameters and FLOPs are counted and matched; and PaLM's z-loss gives the numbers it gave before the hook."""

from __future__ import annotations

import csv
import inspect
import json
import os
import sys
from pathlib import Path

import pytest
import scripts
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor, nn

from archsweep.core.data.tasks.forward import forward_tokens
from archsweep.core.data.tasks.is_sorted import forward_classify
from archsweep.core.eval.trace import parameters_text
from archsweep.core.model import build
from archsweep.core.model.build import ModelConfig, build_model, count_parameters, match_d_ff, parameter_count
from archsweep.core.train.config.setup import ConfigError
from archsweep.core.train.lifecycle.checks import match_params
from archsweep.core.train.lit import LitModel
from archsweep.core.train.optimisers.muon import Muon
from archsweep.core.train.optimisers.optim import hidden_matrices, muon_param_groups
from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FFNBase
from archsweep.variants.flops import Shape
from archsweep.variants.hooks import AuxLoss, collect_aux_losses
from archsweep.variants.norm.deepnorm import deepnorm_constants
from archsweep.variants.roles import EXPERT, HIDDEN, parameter_roles

VOCAB, E = 17, 4
ROOT = Path(__file__).resolve().parents[1]


class ToyExperts(FFNBase):
    """Top-1 of n_experts ReLU experts held as two stacked parameters, and a Switch-style balancing loss."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int = E, balance: float = 0.01) -> None:
        super().__init__()
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.up = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.down = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.hidden_size, self.p, self.balance = d_ff, 0.0, balance
        self.recorded: Tensor | None = None
        self.init_calls: list[tuple[str, int]] = []

    def forward(self, x: Tensor) -> Tensor:
        probs = self.router(x).softmax(-1)  # (B, T, E)
        expert = probs.argmax(-1)  # (B, T)
        hidden = torch.relu(torch.einsum("btfd,btd->btf", self.up[expert], x))
        out = torch.einsum("btdf,btf->btd", self.down[expert], hidden) * probs.gather(-1, expert[..., None])
        if self.training and torch.is_grad_enabled():
            share = F.one_hot(expert, self.up.shape[0]).float().mean((0, 1))  # (E,) tokens' share per expert
            self.recorded = self.up.shape[0] * (share * probs.mean((0, 1))).sum()
        return out

    def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]:
        value, self.recorded = self.recorded, None
        return {} if value is None else {"balance": AuxLoss(self.balance, value)}

    @torch.no_grad()
    def init_parameters(self, scheme: str, n_layers: int) -> None:
        self.init_calls.append((scheme, n_layers))
        self.up.fill_(1.0 / n_layers)
        self.down.fill_(-1.0 / n_layers)

    def weight_matrices(self) -> list[nn.Parameter]:
        return [self.up, self.down]

    def roles(self) -> dict[str, str]:
        return {"up": "expert", "down": "expert"}  # stacked (E, out, in) expert matrices

    def active_params(self) -> int:
        return self.router.weight.numel() + (self.up.numel() + self.down.numel()) // self.up.shape[0]

    def flops(self, shape: Shape) -> float:
        d_ff, d_model = self.up.shape[1:]
        experts = self.up.shape[0] if shape.total else 1
        return 2.0 * shape.tokens * (d_model * self.up.shape[0] + experts * 2 * d_model * d_ff)


@pytest.fixture
def toy_ffn(monkeypatch):
    """`ffn=toy_experts` for this test only (the registry is left as it was)."""
    FFN.names()  # discover the package's options first
    monkeypatch.setitem(FFN._classes, "toy_experts", ToyExperts)
    ToyExperts.option_name = "toy_experts"
    return "toy_experts"


def config(**overrides) -> ModelConfig:
    fields = dict(kind="decoder_only", vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, d_ff=24, dropout=0.0,
                  norm="pre", pos="rotary")
    return ModelConfig(**{**fields, **overrides})


def lit_step(model: nn.Module, batch: dict, forward=forward_tokens) -> tuple[Tensor, dict[str, Tensor]]:
    """LitModel.training_step on a log step, with what it logs."""
    lit = LitModel(model, forward, {}, {}, label_smoothing=0.0, seed=0, meta={})
    logged: dict[str, Tensor] = {}
    lit._log_step = lambda: True
    lit.log = lambda name, value, **kwargs: logged.__setitem__(name, value)
    return lit.training_step(batch, 0), logged


def lm_batch() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, VOCAB, (3, 9), generator=g)
    labels = torch.randint(1, VOCAB, (3, 9), generator=g)
    labels[0, :4] = labels[2, 7:] = -100
    return {"tokens": tokens, "pad_mask": torch.ones_like(tokens, dtype=torch.bool), "labels": labels}


def test_z_loss_on_the_hook_gives_the_loss_and_log_of_the_old_formula():
    torch.manual_seed(0)
    model = build_model(config(plugins={"z_loss": {"weight": 1e-4}, "logit_softcap": {"cap": 5.0}})).train()
    batch = lm_batch()
    logits = forward_tokens(model, batch)
    labels = batch["labels"]
    real = labels != -100  # the formula lit.py had: mean over labelled tokens of log(Z)^2
    old_z = (logits.float().logsumexp(dim=-1).square() * real).sum() / real.sum().clamp(min=1)
    old_loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100) + 1e-4 * old_z
    loss, logged = lit_step(model, batch)
    torch.testing.assert_close(loss, old_loss, rtol=0, atol=0)
    torch.testing.assert_close(logged["train/aux/z_loss"], old_z.detach(), rtol=0, atol=0)
    assert "train/z_loss" not in logged


def test_z_loss_of_a_classifier_is_on_its_class_logits():
    torch.manual_seed(0)
    model = build_model(config(kind="encoder_only", n_classes=3, plugins={"z_loss": {"weight": 1e-3}})).train()
    batch = {**lm_batch(), "labels": torch.tensor([[0], [2], [-100]])}
    logits = forward_classify(model, batch)  # (B, 1, n_classes)
    real = batch["labels"] != -100
    expected = (logits.float().logsumexp(-1).square() * real).sum() / real.sum()
    loss, logged = lit_step(model, batch, forward_classify)
    torch.testing.assert_close(logged["train/aux/z_loss"], expected.detach())


def test_no_loss_is_added_from_a_forward_that_is_not_a_training_step():
    model = build_model(config(plugins={"z_loss": {"weight": 1e-4}}))
    batch = lm_batch()
    with torch.no_grad():
        forward_tokens(model.train(), batch)
    forward_tokens(model.eval(), batch)
    assert collect_aux_losses(model, batch["labels"] != -100) == {}
    loss, logged = lit_step(build_model(config()).train(), batch)  # no z_loss: nothing recorded, nothing logged
    assert not any(name.startswith("train/aux") for name in logged)


def test_a_modules_aux_loss_is_added_with_its_weight_and_logged_unweighted(toy_ffn):
    torch.manual_seed(0)
    model = build_model(config(ffn=toy_ffn, n_layers=3)).train()
    batch = lm_batch()
    logits = forward_tokens(model, batch)
    values = [m.recorded for m in model.modules() if isinstance(m, ToyExperts)]
    assert len(values) == 3 and all(v is not None for v in values)
    cross_entropy = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    loss, logged = lit_step(model, batch)
    balance = sum(values)  # one per layer, summed under one name
    torch.testing.assert_close(logged["train/aux/balance"], balance.detach())
    torch.testing.assert_close(loss, cross_entropy + 0.01 * balance)
    loss.backward()
    assert model.decoder.blocks[0].ffn.router.weight.grad.abs().sum() > 0  # the balancing loss reaches the router


def test_one_name_with_two_weights_is_refused():
    class Reports(nn.Module):
        def __init__(self, weight: float) -> None:
            super().__init__()
            self.weight = weight

        def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]:
            return {"balance": AuxLoss(self.weight, torch.tensor(1.0))}

    with pytest.raises(ValueError, match="'balance' is reported with weights 0.1 and 0.2"):
        collect_aux_losses(nn.Sequential(Reports(0.1), Reports(0.2)), torch.ones(1, dtype=torch.bool))


@pytest.mark.parametrize("init", ["xavier", "gpt2"])
def test_a_module_initialises_its_own_parameters(toy_ffn, init):
    model = build_model(config(ffn=toy_ffn, n_layers=4, init=init))
    experts = [m for m in model.modules() if isinstance(m, ToyExperts)]
    assert [m.init_calls for m in experts] == [[(init, 4)]] * 4
    for m in experts:
        assert torch.all(m.up == 0.25) and torch.all(m.down == -0.25)
        assert m.router.weight.std() < 0.5  # the default rule still initialises its nn.Linear
    roles = parameter_roles(model)  # the declared roles, the router's by its type
    assert [roles[f"decoder.blocks.0.ffn.{n}"] for n in ("up", "down", "router.weight")] == [EXPERT, EXPERT, HIDDEN]


def test_deepnorm_scales_the_matrices_a_module_declares(toy_ffn):
    model = build_model(config(ffn=toy_ffn, n_layers=2, norm="deepnorm"))
    _, beta = deepnorm_constants("stack", 2, 2)
    for m in (m for m in model.modules() if isinstance(m, ToyExperts)):
        torch.testing.assert_close(m.up, torch.full_like(m.up, 0.5 * beta))
        torch.testing.assert_close(m.down, torch.full_like(m.down, -0.5 * beta))


def test_muon_takes_declared_matrices_and_orthogonalises_each_expert_on_its_own(toy_ffn):
    model = build_model(config(ffn=toy_ffn))
    hidden = hidden_matrices(model)
    experts = [m for m in model.modules() if isinstance(m, ToyExperts)]
    assert all(id(m.up) in hidden and id(m.down) in hidden and id(m.router.weight) in hidden for m in experts)
    groups = muon_param_groups(model, lr=0.02, adamw_lr=1e-3, weight_decay=0.0)
    assert {id(p) for p in groups[0]["params"]} == hidden and groups[0]["muon"]

    stacked = nn.Parameter(torch.randn(E, 6, 5))
    slices = [nn.Parameter(stacked.detach()[e].clone()) for e in range(E)]
    grad = torch.randn(E, 6, 5)
    stacked.grad = grad.clone()
    for e, p in enumerate(slices):
        p.grad = grad[e].clone()
    for params in ([stacked], slices):
        Muon([{"params": params, "muon": True}], lr=0.1).step()
    torch.testing.assert_close(stacked.detach(), torch.stack([p.detach() for p in slices]))


def test_active_and_total_parameters_and_flops(toy_ffn):
    cfg = config(ffn=toy_ffn, n_layers=3)
    model = build_model(cfg)
    total, active = count_parameters(model), count_parameters(model, count="active")
    unused_per_layer = (E - 1) * 2 * 16 * 24  # three of four experts' up and down matrices
    assert total - active == 3 * unused_per_layer
    assert parameter_count(cfg, "active") == active and parameter_count(cfg) == total
    shape = Shape(2, 9, causal=True)
    extra = build.flops_per_token(cfg, shape, "total") - build.flops_per_token(cfg, shape, "active")
    assert extra == pytest.approx(3 * 3 * (E - 1) * 2 * 2 * 16 * 24)  # training = 3 x forward, 3 layers
    dense = config(ffn="relu")
    assert parameter_count(dense, "active") == parameter_count(dense)
    assert build.flops_per_token(dense, shape, "total") == build.flops_per_token(dense, shape)


def test_match_params_holds_the_active_or_the_total_count(toy_ffn):
    cfg = config(ffn=toy_ffn)
    target = parameter_count(config(ffn="relu", d_ff=64))
    by_active, count = match_d_ff(cfg, target, count="active")
    assert abs(count - target) / target < 0.02 and parameter_count(by_active, "active") == count
    by_total, count = match_d_ff(cfg, target)
    assert abs(count - target) / target < 0.02 and by_total.d_ff < by_active.d_ff
    with pytest.raises(ValueError, match="match_count='some' is not a known count; valid: total, active"):
        match_d_ff(cfg, target, count="some")


def test_existing_models_report_equal_active_and_total_counts():
    for kind in ("decoder_only", "encoder_decoder", "encoder_only"):
        model = build_model(config(kind=kind, n_classes=2))
        assert count_parameters(model, count="active") == count_parameters(model)


def test_the_trace_and_the_match_setting_name_the_counts(toy_ffn):
    model = build_model(config(ffn=toy_ffn, n_layers=1))
    total, active = count_parameters(model), count_parameters(model, count="active")
    assert parameters_text(model) == f"{total:,} parameters ({active:,} active per token)"
    assert parameters_text(build_model(config())).endswith(" parameters")
    with pytest.raises(ConfigError, match="match_count='all' is not a known count; valid: total, active"):
        match_params(config(ffn=toy_ffn), 5000, "d_ff", "all")


PLUGIN = """from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FFNBase
from archsweep.variants.flops import Shape
from archsweep.variants.hooks import AuxLoss

E = 4


@FFN.register("toy_experts")
"""


@pytest.mark.slow
def test_a_toy_mixture_of_experts_trains_from_one_py_and_one_yaml(tmp_path):
    """train.py: its balancing loss and the z-loss in metrics.csv, active and total parameters in results.json."""
    (tmp_path / "toy_moe.py").write_text(PLUGIN + inspect.getsource(ToyExperts))
    (tmp_path / "conf" / "ffn").mkdir(parents=True)
    (tmp_path / "conf" / "ffn" / "toy_experts.yaml").write_text("# @package model.ffn\n_target_: toy_moe.ToyExperts\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ARCHSWEEP_CONFIG_PATH": str(tmp_path / "conf"),
           "ARCHSWEEP_CACHE_DIR": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    out = scripts.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "ffn=toy_experts",
                          "z_loss=palm", "trainer.max_steps=4", "trainer.log_every_n_steps=2",
                          "trainer.val_check_interval=4", "logger=csv", "eval.decode_samples=0",
                          f"hydra.run.dir={run_dir}", f"output_root={tmp_path}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("train/aux/balance")]
    assert len(rows) == 2 and all(float(r["train/aux/balance"]) >= 1.0 and float(r["train/aux/z_loss"]) > 0
                                  for r in rows)  # E * sum(share * mean prob) >= 1 (Switch's minimum is 1)
    results = json.loads((run_dir / "results.json").read_text())
    model = OmegaConf.load(run_dir / "config.yaml").model  # experiment=smoke: one encoder and one decoder layer
    assert model.kind == "encoder_decoder" and model.n_layers == 1 and model.n_decoder_layers in (None, 1)
    assert results["params"] - results["active_params"] == 2 * (E - 1) * 2 * model.d_model * model.d_ff
    assert f"({results['active_params']:,} active per token)" in out.stdout + out.stderr
