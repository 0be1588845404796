"""The switches a faithful reproduction of a published recipe needs (issue 15), each off by default: LayerNorm
without bias (`model.norm_bias`), weight decay on the embedding tables (`optim.decay_embeddings`), and a
character vocabulary that is exactly the text's characters (`task.exact_vocab`, tests/test_data.py's text task
fixtures)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.config.schemas import AdamWSchema, typed
from archsweep.core.train.optimisers.optim import make_optimizer

SIZES = dict(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0)


def layer_norms(model: nn.Module) -> list[nn.LayerNorm]:
    return [m for m in model.modules() if isinstance(m, nn.LayerNorm)]


@pytest.mark.parametrize("kind,norm", [("encoder_decoder", "post"), ("decoder_only", "pre"),
                                       ("encoder_only", "sandwich"), ("decoder_only", "deepnorm")])
def test_layernorm_without_bias(kind, norm):
    with_bias = build_model(ModelConfig(kind=kind, norm=norm, **SIZES))
    without = build_model(ModelConfig(kind=kind, norm=norm, norm_bias=False, **SIZES))
    norms = layer_norms(without)
    assert norms and all(n.bias is None and n.weight is not None for n in norms)
    assert all(n.bias is not None for n in layer_norms(with_bias))  # the default keeps it
    assert ModelConfig(kind=kind, **SIZES).norm_bias is True
    n_params = lambda m: sum(p.numel() for p in m.parameters())
    assert n_params(with_bias) - n_params(without) == len(norms) * SIZES["d_model"]
    tokens = torch.randint(4, 30, (2, 6))
    args = (tokens, tokens) if kind == "encoder_decoder" else (tokens,)
    assert torch.isfinite(without(*args)).all()


def optim_cfg(**over) -> dict:
    return {"_target_": "archsweep.core.train.optimisers.optim.adamw", "_partial_": True, "name": "adamw", "lr": 1e-3,
            "betas": [0.9, 0.98], "eps": 1e-9, "weight_decay": 0.1, **over}


def test_weight_decay_on_embeddings_is_a_switch_off_by_default():
    model = build_model(ModelConfig(kind="encoder_decoder", pos="learned", max_seq_len=16, **SIZES))
    names = {id(p): n for n, p in model.named_parameters()}

    def decayed(cfg: dict) -> set[str]:
        groups = make_optimizer(model, cfg).param_groups
        return {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}

    default, on = decayed(optim_cfg()), decayed(optim_cfg(decay_embeddings=True))
    assert decayed(optim_cfg(decay_embeddings=False)) == default
    tables = {n for n in on - default}
    assert "encoder.embed.weight" in tables and "decoder.pos.table.weight" in tables
    assert all("embed" in n or "pos" in n for n in tables)
    assert not any("norm" in n or n.endswith("bias") for n in on)  # norms and biases are never decayed
    with pytest.raises(ValueError, match="optim.decay_embeddings: Value 'maybe' is not a valid bool"):
        from omegaconf import OmegaConf

        typed(OmegaConf.create(optim_cfg(decay_embeddings="maybe")), "optim", AdamWSchema)


def text_task(path, cache_dir, **over):
    from archsweep.core.data.tasks.text import TextTask

    args = dict(path=str(path), data_dir=None, tokenizer="char", bpe_vocab_size=300, block_size=16, batch_size=4,
                val_fraction=0.1, val_batches=2, test_batches=2, eval_seed=0, cache_dir=str(cache_dir))
    return TextTask(**{**args, **over})


def test_an_exact_character_vocabulary_is_the_texts_characters(tmp_path):
    import numpy as np

    from archsweep.core.data.paths import data_dir

    shakespeare = data_dir() / "tinyshakespeare.txt"
    exact = text_task("tinyshakespeare.txt", tmp_path, exact_vocab=True)
    default = text_task("tinyshakespeare.txt", tmp_path)
    assert exact.vocab_size == 65 and default.vocab_size == 71  # nanoGPT's 65; the default keeps 6 special ids
    raw = shakespeare.read_text()
    val = np.load(exact.dir / "val.npy")
    assert int(val.max()) < 65 and exact.decode(val[:300]) == raw[1_003_854:1_003_854 + 300]
    batch = next(iter(exact.dataloader("train", "decoder_only", seed=0)))
    assert int(batch["tokens"].max()) < 65 and int(batch["tokens"].min()) >= 0
    assert exact.tokenizer.encode("ROMEO:") == [sorted(set(raw)).index(c) for c in "ROMEO:"]


def test_an_exact_vocabulary_serves_decoder_only_and_refuses_what_needs_special_ids(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("to be or not to be, that is the question\n" * 30)
    task = text_task(path, tmp_path / "cache", exact_vocab=True)
    model_cfg = ModelConfig(kind="encoder_only", vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1,
                            d_ff=32)
    with pytest.raises(ValueError, match=r"task.exact_vocab=true leaves no special ids .* serves only decoder_only"):
        task.check_model(model_cfg)
    with pytest.raises(ValueError, match=r"task.exact_vocab=true needs task.tokenizer=char"):
        text_task(path, tmp_path / "cache", exact_vocab=True, tokenizer="bpe")
    with pytest.raises(ValueError, match=r"not in this exact character vocabulary"):
        task.tokenizer.encode("xyz!")


def test_generation_from_an_exact_vocabulary_runs_to_its_length(tmp_path):
    from omegaconf import OmegaConf

    from archsweep.core.data.codec import codec_state_for
    from archsweep.core.eval import inference

    path = tmp_path / "t.txt"
    path.write_text("to be or not to be, that is the question\n" * 30)
    task = text_task(path, tmp_path / "cache", exact_vocab=True)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=task.vocab_size, d_model=16, n_heads=2,
                                    n_layers=1, d_ff=32, dropout=0.0))
    task_cfg = {"_target_": "archsweep.core.data.tasks.text.TextTask", "path": str(path), "exact_vocab": True}
    meta = {"model_config": model.config.to_dict(), "config": {"task": task_cfg}, "codec": codec_state_for(task)}
    ckpt = tmp_path / "lm.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "archsweep": meta}, ckpt)
    cfg = OmegaConf.create({"ckpt": str(ckpt), "prompt": None, "prompts": ["to be", "the"], "device": "cpu",
                            "decoding": {"strategy": "greedy", "max_new_tokens": 12}})
    results = inference.run_generate(cfg)
    assert [hyps[0][0][:len(p)] for hyps, p in zip(results, ["to be", "the"], strict=True)] == ["to be", "the"]
    assert [len(hyps[0][0]) for hyps in results] == [5 + 12, 3 + 12]  # no end token: every step is a character
