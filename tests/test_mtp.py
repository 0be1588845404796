"""Multi-token prediction (the `mtp` plug-in, DeepSeek-V3): its logits and losses against the paper's equations written
in plain torch (tests/plain_decoder.py, our weights copied in), its causality, its FLOP count against torch's counter,
what it leaves alone (evaluation and decoding), what it refuses, and train.py with it and with MLA."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
import scripts
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter

from archsweep.core.model.build import ModelConfig, build_model, count_parameters
from archsweep.core.model.config import AXES
from archsweep.variants.flops import Shape, forward_flops
from archsweep.variants.hooks import collect_aux_losses
from archsweep.variants.model import KIND, form_of
from archsweep.variants.plugins import PLUGIN
from tests import plain_decoder
from tests.parity import assert_parity

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
VOCAB, D, T = 23, 32, 10


def tiny(mtp: int = 2, plugins: dict | None = None, **fields) -> torch.nn.Module:
    """A decoder with `mtp` prediction depths (0: none, the plug-in left out) of weight 0.25, and `plugins`."""
    torch.manual_seed(0)
    plugins = {**(plugins or {}), **({"mtp": {"depths": mtp, "weight": 0.25}} if mtp else {})}
    cfg = dict(kind="decoder_only", vocab_size=VOCAB, d_model=D, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
               norm="pre", pos="rotary", norm_type="rmsnorm", plugins=plugins)
    return build_model(ModelConfig(**{**cfg, **fields})).train()


def tokens(b: int = 3, t: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def reference_losses(logits: list[torch.Tensor], x: torch.Tensor, labelled: torch.Tensor) -> list[torch.Tensor]:
    """DeepSeek-V3's equation 24 per depth: the mean cross-entropy of P^k_(i+k+1) against t_(i+k+1) over the
    labelled positions whose target is in the row (depth k's target is position i + k's label)."""
    losses = []
    for k, depth in enumerate(logits, start=1):
        n = depth.shape[1]  # T - k - 1 positions
        nll = -depth.log_softmax(-1).gather(-1, x[:, k + 1:, None])[..., 0]  # (B, n)
        keep = labelled[:, k:k + n]
        losses.append((nll * keep).sum() / keep.sum())
    return losses


def test_the_decoder_written_in_plain_torch_gives_the_models_next_token_logits():
    """The reference (tests/plain_decoder.py) is right about the stack the prediction modules read: h^0."""
    model, x = tiny().eval(), tokens()
    w = plain_decoder.copy_weights(model, n_heads=4, n_kv_heads=4)
    with torch.no_grad():
        assert_parity(model(x), plain_decoder.head(plain_decoder.decoder(x, w, 4, 4), w))


def test_the_modules_equal_deepseek_v3s_equations_written_in_plain_torch():
    """Each depth's logits, its loss and their mean against the equations written out in plain torch
    (tests/plain_decoder.py: h'^k_i = M_k [RMSNorm(h^(k-1)_i); RMSNorm(Emb(t_(i+k)))], a block, the shared head),
    our weights copied in; the losses come through the auxiliary-loss hook."""
    model, x = tiny(), tokens()
    labelled = torch.ones_like(x, dtype=torch.bool)
    labelled[0, :4] = False  # a prefix-LM row: the source is not predicted
    model(x)
    ours = [logits.detach() for logits, _, _ in model.plugins["mtp"].predictions]
    aux = collect_aux_losses(model, labelled)
    w = plain_decoder.copy_weights(model, n_heads=4, n_kv_heads=4)
    with torch.no_grad():
        logits = plain_decoder.mtp_logits(x, plain_decoder.decoder(x, w, 4, 4), w, 4, 4)
        expected = reference_losses(logits, x, labelled)
    assert [t.shape for t in ours] == [(3, T - 2, VOCAB), (3, T - 3, VOCAB)]
    for k, (got, want) in enumerate(zip(ours, logits, strict=True), start=1):
        assert_parity(got, want, msg=f"depth {k}")
    for k, loss in enumerate(expected, start=1):
        assert_parity(aux[f"mtp_{k}"].value.detach(), loss)
        assert aux[f"mtp_{k}"].weight == 0.0  # logged only
    assert_parity(aux["mtp"].value.detach(), torch.stack(expected).mean())
    assert aux["mtp"].weight == 0.25 and set(aux) == {"mtp", "mtp_1", "mtp_2"}
    assert collect_aux_losses(model, labelled) == {}  # read once


def test_depth_k_sees_no_token_after_i_plus_k():
    model, x = tiny(), tokens()
    model(x)
    before = [logits.detach() for logits, _, _ in model.plugins["mtp"].predictions]
    y = x.clone()
    y[:, 6] = (y[:, 6] % (VOCAB - 1)) + 1  # another token at position 6
    model(y)
    after = [logits.detach() for logits, _, _ in model.plugins["mtp"].predictions]
    for k, (a, b) in enumerate(zip(before, after, strict=True), start=1):
        torch.testing.assert_close(a[:, :6 - k], b[:, :6 - k])  # positions i + k < 6 are unchanged
        assert not torch.allclose(a[:, 6 - k], b[:, 6 - k])  # position i = 6 - k embeds it


def test_evaluation_and_decoding_use_the_next_token_head_only():
    plain, with_mtp, x = tiny(mtp=0), tiny(mtp=2), tokens()
    missing = with_mtp.load_state_dict(plain.state_dict(), strict=False).missing_keys  # the same stack and head
    assert missing and all(key.startswith("plugins.mtp.") for key in missing)
    torch.testing.assert_close(with_mtp(x), plain(x))  # training forward: the same next-token logits
    assert collect_aux_losses(with_mtp, torch.ones_like(x, dtype=torch.bool))  # that forward trained them
    with_mtp.eval(), plain.eval()
    with_mtp(x)
    assert with_mtp.plugins["mtp"].predictions == []  # not run outside training
    from archsweep.core.eval.generation import DecodingConfig, generate

    prompts, mask = tokens(2, 4), torch.ones(2, 4, dtype=torch.bool)
    cfg = DecodingConfig(strategy="greedy", max_new_tokens=6)
    out = [generate(m, prompts, mask, cfg, eos_id=VOCAB + 5, pad_id=0, bos_id=1).tokens for m in (plain, with_mtp)]
    assert torch.equal(*out)


def test_parameters_count_the_modules_which_every_training_token_uses():
    plain, with_mtp = tiny(mtp=0), tiny(mtp=2)
    block = sum(p.numel() for p in with_mtp.decoder.blocks[0].parameters())
    extra = 2 * (block + 2 * D * D + 3 * D)  # block, projection, two input norms and the final norm per depth
    assert count_parameters(with_mtp) - count_parameters(plain) == extra
    assert count_parameters(with_mtp, count="active") == count_parameters(with_mtp)


def test_flops_count_the_modules_work_in_training_exactly():
    """Under SDPA's math backend every attention product is a matmul torch's counter sees; a causal call costs it
    all T x T query-key pairs, the analytic count the T (T + 1) / 2 a query sees: they differ by exactly that, over
    the stack's 2 layers at T and the depths' blocks at T - 1 and T - 2 positions."""
    model, x = tiny(), tokens()
    with sdpa_kernel(SDPBackend.MATH), flop_counter.FlopCounterMode(display=False) as counter:
        model(x)
    hidden = sum(4 * 3 * 4 * (D // 4) * (n * n - n * (n + 1) // 2) for n in (T, T, T - 1, T - 2))  # 4 B H Dh a pair
    assert forward_flops(model, Shape(3, T)) + hidden == counter.get_total_flops()
    assert forward_flops(model, Shape(3, T)) > forward_flops(tiny(mtp=0), Shape(3, T))


@pytest.mark.parametrize("fields, match", [
    (dict(kind="encoder_only"), r"mtp needs one causal stack over one sequence, which kind=encoder_only is not; "
                                r"set mtp=none or choose model=decoder_only"),
    (dict(kind="encoder_decoder"), r"which kind=encoder_decoder is not"),
    (dict(pos="shaw"), r"mtp cannot be used with pos=shaw: its score terms are learned per layer"),
    (dict(plugins={"mtp": {"depths": 1}, "value_residual": {"learnable": False}}),
     r"mtp cannot be used with value_residual: .*; set mtp=none or value_residual=none"),
    (dict(plugins={"mtp": {"depths": -1}}), r"mtp: depths=-1 must be >= 1"),
    (dict(plugins={"mtp": {"depths": 1, "weight": -0.1}}), r"mtp: weight=-0.1 must be >= 0 \(DeepSeek-V3"),
])
def test_what_it_cannot_take_is_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{"kind": "decoder_only", "vocab_size": VOCAB, "plugins": {"mtp": {"depths": 1}},
                       **fields}).validate()


def test_every_option_of_every_group_trains_with_it():
    """Each yaml of conf/<group>/ (one at a time, the rest default) of every axis and of every other plug-in that a
    decoder can take, with mtp=2: every parameter of the prediction modules learns."""
    groups = {"norm": "norm", "norm_type": "norm_type", "pos": "pos", "ffn": "ffn", "attention": "attention",
              "param": "param"}
    assert set(groups) == set(AXES)
    choices = [({"norm_type": "layernorm", axis: option}, None) for axis, group in groups.items()
               for option in sorted(p.stem for p in (CONF / group).glob("*.yaml"))]
    choices += [({"norm_type": "layernorm"}, {name: yaml.safe_load(path.read_text())})
                for name in PLUGIN.names() if name != "mtp"
                for path in sorted((CONF / name).glob("*.yaml")) if path.stem != "none"]
    tried = 0
    for fields, plugins in choices:
        option = plugins or fields
        try:
            model = tiny(plugins=plugins, dropout=0.1, **fields)
        except ValueError as refused:  # an image-only encoding, a per-layer one, value residual: refused, saying why
            assert str(refused).startswith("mtp ") or "image" in str(refused), str(refused)
            continue
        x = tokens(2, 8)
        loss = model(x).logsumexp(-1).mean()
        aux = collect_aux_losses(model, torch.ones_like(x, dtype=torch.bool))
        (loss + aux["mtp"].value * aux["mtp"].weight).backward()
        grads = [p.grad for p in model.plugins["mtp"].parameters()]
        assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads), option
        tried += 1
    assert tried >= 20
    assert [k for k in KIND.names() if form_of(k) == "causal"] == ["decoder_only"]


def test_with_document_masking_positions_see_only_their_document_and_skip_targets_of_another():
    model, x = tiny(), tokens(2, T)
    docs = torch.tensor([[0] * 5 + [1] * 5, [0] * 10])
    model(x, doc_ids=docs)
    first = [logits.detach() for logits, _, _ in model.plugins["mtp"].predictions]
    valid = model.plugins["mtp"].predictions[0][2]
    assert valid[0].tolist() == [True] * 4 + [False] + [True] * 3 and valid[1].all()  # t_(i+1) of another document
    y = x.clone()
    y[0, 0] = (y[0, 0] % (VOCAB - 1)) + 1  # the first document changes
    model(y, doc_ids=docs)
    for a, (b, _, _) in zip(first, model.plugins["mtp"].predictions, strict=True):
        torch.testing.assert_close(a[0, 5:], b.detach()[0, 5:])  # the second document's positions do not see it


@pytest.mark.slow
def test_train_py_runs_with_mtp_and_latent_attention_and_logs_the_loss(tmp_path):
    env = {**os.environ, "ARCHSWEEP_CACHE_DIR": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    out = scripts.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "model=decoder_only",
                          "mtp=deepseek_v3", "model.plugins.mtp.depths=2", "attention=mla", "pos=rotary",
                          "trainer.max_steps=4", "trainer.log_every_n_steps=2", "trainer.val_check_interval=4",
                          "logger=csv", "eval.decode_samples=0", f"hydra.run.dir={run_dir}", f"output_root={tmp_path}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("train/aux/mtp")]
    assert len(rows) == 2
    for r in rows:
        depths = [float(r["train/aux/mtp_1"]), float(r["train/aux/mtp_2"])]
        assert float(r["train/aux/mtp"]) == pytest.approx(sum(depths) / 2, rel=1e-5) and min(depths) > 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["params"] == results["active_params"] > 0
