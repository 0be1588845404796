"""Hugging Face export (`archsweep-export`) and import: logits equal to the `transformers` model's, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import scripts
import torch

from archsweep.core.data.codec import codec_from_state
from archsweep.core.data.tokenizer import BpeTokenizer
from archsweep.core.eval.export import export, main
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.plugins import PLUGIN

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

VOCAB = 300
GPT2 = dict(kind="decoder_only", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=128, max_seq_len=32,
            norm="pre", pos="learned", ffn={"name": "gelu", "approximate": "tanh"}, scale_embedding=False,
            tie_embeddings=True, init="gpt2")
LLAMA = dict(kind="decoder_only", vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=96,
             max_seq_len=64, norm="pre", norm_type="rmsnorm", norm_eps=1e-6, pos="rotary", ffn="swiglu", bias=False,
             scale_embedding=False, tie_embeddings=False)


def bpe_codec() -> dict:
    tok = BpeTokenizer.train(["the cat sat on the mat, the dog sat on the log. " * 20], VOCAB)
    text = tok.tok.to_str()
    return {"type": "tokenizer", "src": text, "tgt": text, "seq2seq": False, "pad_id": 0, "bos_id": 1, "eos_id": 2,
            "sep_id": 3}


def save_run(tmp_path, fields: dict, codec: dict | None = None, seed: int = 0):
    """A checkpoint as train.py writes it (state_dict under `model.`, the config and codec under `archsweep`),
    with random weights (biases and norms too, so a misplaced one shows)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(**fields)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "archsweep": {"model_config": model.config.to_dict(), "codec": codec}},
               run / "checkpoints" / "best.ckpt")
    return run, model


def hf_logits(folder, tokens):
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        return ref(tokens).logits


@pytest.mark.parametrize("fields", [
    pytest.param(GPT2, id="gpt2"),
    pytest.param({**LLAMA, "pos": {"name": "rotary", "scaling": "linear", "factor": 2.0}}, id="llama-gqa-linear-rope"),
    pytest.param({**LLAMA, "bias": True, "tie_embeddings": True, "pos": {"name": "rotary", "scaling": "ntk",
                                                                          "factor": 4.0}}, id="llama-bias-ntk-tied"),
    pytest.param({**LLAMA, "attention": {"name": "sliding_window", "window": 5}}, id="mistral-window"),
    # muP at 4x its base width: the score factor folded into the query rows, the tied head's logit factor into an
    # untied head (param/base.py ForwardScales; hf/base.py fold_parametrisation)
    pytest.param({**LLAMA, "d_model": 128, "d_ff": 384, "param": {"name": "mup", "base_width": 32}}, id="llama-mup"),
    pytest.param({**LLAMA, "d_model": 128, "d_ff": 384, "tie_embeddings": True,
                  "param": {"name": "mup", "base_width": 32}}, id="llama-mup-tied"),
])
def test_export_then_from_pretrained_gives_our_logits(tmp_path, fields):
    run, model = save_run(tmp_path, fields)
    out = tmp_path / "hf"
    export(run, out)
    tokens = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        ours = model(tokens)
    torch.testing.assert_close(hf_logits(out, tokens), ours, atol=1e-5, rtol=1e-5)


def test_export_writes_tokenizer_with_special_tokens(tmp_path):
    codec = bpe_codec()
    run, _ = save_run(tmp_path, LLAMA, codec)
    out = tmp_path / "hf"
    main([f"ckpt={run}", f"out={out}"])
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    ours = codec_from_state(codec)
    text = "the cat sat on the log"
    assert tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == ("[EOS]", 2, 1, 0)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


@pytest.mark.parametrize("fields, named", [
    ({**LLAMA, "norm": "post", "pos": "alibi"}, ["norm=post", "pos=alibi"]),
    ({**LLAMA, "attention": "performer"}, ["attention=performer"]),
    ({**GPT2, "scale_embedding": True, "plugins": {"qk_norm": {"type": "rmsnorm"}}},
     ["scale_embedding=true", "qk_norm (type=rmsnorm: no Hugging Face equivalent; set qk_norm=none)"]),
])
def test_configuration_without_equivalent_is_refused_naming_each_option(tmp_path, fields, named):
    run, _ = save_run(tmp_path, fields)
    out = tmp_path / "hf"
    with pytest.raises(ValueError, match="no exact Hugging Face equivalent") as info:
        export(run, out)
    for option in named:
        assert option in str(info.value)
    assert not out.exists()


def first_option(name: str) -> dict:
    """The options of the first yaml of the plug-in's group conf/<name>/ that turns it on."""
    import yaml

    conf = Path(__file__).resolve().parents[1] / "conf" / name
    return next(yaml.safe_load(p.read_text()) for p in sorted(conf.glob("*.yaml")) if p.stem != "none")


@pytest.mark.parametrize("name", PLUGIN.names())
def test_each_plugin_is_exported_only_where_it_declares_an_equivalent(tmp_path, name):
    """A plug-in without a Hugging Face equivalent (`hf`: None) is refused, naming it and its options; one whose
    equivalent is none (training only) is dropped: the exported logits are the run's."""
    run, model = save_run(tmp_path, {**LLAMA, "plugins": {name: first_option(name)}})
    out = tmp_path / "hf"
    if PLUGIN.get(name).hf is None:
        with pytest.raises(ValueError, match=rf"{name} \([^)]*: no Hugging Face equivalent; set {name}=none\)"):
            export(run, out)
        assert not out.exists()
        return
    export(run, out)
    tokens = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(out, tokens), model(tokens), atol=1e-5, rtol=1e-5)


def test_encoder_only_checkpoint_is_refused(tmp_path):
    run, _ = save_run(tmp_path, {**GPT2, "kind": "encoder_only"})
    with pytest.raises(ValueError, match="kind=encoder_only"):
        export(run, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_non_empty_out_folder_is_refused_and_kept(tmp_path, capsys):
    run, _ = save_run(tmp_path, GPT2)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main([f"ckpt={run}", f"out={out}"])
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


# -- import --------------------------------------------------------------------------------------------------------

def hf_folder(tmp_path, config) -> tuple:
    """A `transformers` model with random weights (biases and norms too), saved as a model folder."""
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path / "published"
    ref.save_pretrained(folder)
    return folder, ref


HF_CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4),
    "llama": lambda: transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=64, rope_theta=500.0,
                                              rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "mistral": lambda: transformers.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                                  max_position_embeddings=64, sliding_window=5),
}


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_import_then_our_logits_equal_the_hugging_face_models(tmp_path, name):
    from safetensors.torch import load_file, save_file

    from archsweep.core.model.hf import load_folder_weights, read_folder

    folder, ref = hf_folder(tmp_path, HF_CONFIGS[name]())
    if name == "gpt2":  # the original gpt2 folder's names: without the base model's `transformer.`
        weights = load_file(str(folder / "model.safetensors"))
        save_file({k.removeprefix("transformer."): v for k, v in weights.items()}, str(folder / "model.safetensors"))
    layout, hf = read_folder(folder)
    model = build_model(ModelConfig.from_dict({**layout.model_fields(hf), "dropout": 0.0})).eval()
    load_folder_weights(model, folder)
    tokens = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), ref(tokens).logits, atol=1e-5, rtol=1e-5)


def test_import_keeps_the_runs_weight_free_options_and_refuses_a_clash(tmp_path):
    from archsweep.core.model.hf import import_fields, read_folder

    folder, _ = hf_folder(tmp_path, HF_CONFIGS["llama"]())
    layout, hf = read_folder(folder)
    composed = {**ModelConfig(kind="decoder_only").to_dict(), "pos": {"name": "rotary", "scaling": "ntk",
                                                                      "factor": 4.0}, "dropout": 0.2}
    fields = import_fields(composed, layout.model_fields(hf), {"pos.scaling", "pos.factor", "dropout"})
    cfg = ModelConfig.from_dict(fields)
    rope = cfg.options("pos")
    assert (rope["base"], rope["scaling"], rope["factor"]) == (500.0, "ntk", 4.0)  # base: the folder's
    assert (cfg.d_model, cfg.kv_heads, cfg.choice("norm_type"), cfg.dropout) == (32, 2, "rmsnorm", 0.2)
    with pytest.raises(ValueError, match=r"contradict.*n_layers=6 \(the folder's config.json: 2\).*pos=alibi"):
        import_fields({**composed, "pos": "alibi"}, layout.model_fields(hf), {"n_layers", "pos"})


def test_import_refuses_a_folder_without_weights_and_another_vocabulary(tmp_path):
    from archsweep.core.train.lifecycle.checks import hf_import

    folder, _ = hf_folder(tmp_path, HF_CONFIGS["gpt2"]())
    fields = ModelConfig(kind="decoder_only").to_dict()
    with pytest.raises(ValueError, match=f"vocabulary of {VOCAB} ids, the task 65"):
        hf_import({**fields, "vocab_size": 65}, str(folder), [])
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no weights"):
        hf_import({**fields, "vocab_size": VOCAB}, str(folder), [])


@pytest.mark.slow
def test_train_starts_from_a_hugging_face_folder(tmp_path):
    """train.py model.init_from=<folder>: the folder sets the model (the defaults' post-norm, sinusoidal
    positions and sizes give way), the checkpoint's logits are the Hugging Face model's (lr ~0); a contradicting
    option is refused before training."""
    import sys
    from pathlib import Path

    from archsweep.core.model.checkpoint import load_model

    config = transformers.LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    folder, ref = hf_folder(tmp_path, config)
    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, "train.py", "task=reverse", "model=decoder_only", f"model.init_from={folder}",
            "optim.lr=1e-12", "trainer.max_steps=2", "task.batch_size=8", "task.max_len=8", "task.val_batches=1",
            "task.test_batches=1", "trainer.val_check_interval=2", "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"]
    out = scripts.run(args, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    model = load_model(tmp_path / "run" / "checkpoints" / "best.ckpt")
    assert (model.config.n_layers, model.config.kv_heads, model.config.choice("norm")) == (2, 2, "pre")
    tokens = torch.randint(0, 20, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), ref(tokens).logits, atol=1e-5, rtol=1e-5)
    clash = scripts.run([*args[:-1], "model.n_layers=3", f"hydra.run.dir={tmp_path / 'clash'}"], cwd=root,
                           capture_output=True, text=True, timeout=300)
    assert clash.returncode != 0
    assert "n_layers=3 (the folder's config.json: 2)" in clash.stdout + clash.stderr
    mup = scripts.run([*args[:-1], "param=mup", f"hydra.run.dir={tmp_path / 'mup'}"], cwd=root, capture_output=True,
                      text=True, timeout=300)  # base width 64, the folder's 32: muP would rescale its forward pass
    assert mup.returncode != 0
    assert "param=mup at d_model=32 would scale its forward pass; set model.param.base_width=32" in mup.stdout + \
        mup.stderr


def test_the_folders_tokenizer_comes_along_and_another_is_refused(tmp_path):
    """A run on bare token ids takes the folder's tokenizer.json as its codec (generate.py then decodes text); a
    task with another tokenizer than the folder's is refused."""
    from archsweep.core.train.config.setup import ConfigError
    from archsweep.core.train.lifecycle.fit import folder_codec

    codec = bpe_codec()
    run, _ = save_run(tmp_path, LLAMA, codec)
    export(run, tmp_path / "hf")
    ids = {"type": "ids", "seq2seq": False, "pad_id": 0, "bos_id": 1, "eos_id": 2, "sep_id": 3}
    taken = folder_codec(ids, tmp_path / "hf")
    assert codec_from_state(taken).encode("the cat") == codec_from_state(codec).encode("the cat")
    assert folder_codec(codec, tmp_path / "hf")["tgt"] == codec["tgt"]
    other = BpeTokenizer.train(["a quite different text for another tokenizer " * 20], VOCAB).tok.to_str()
    with pytest.raises(ConfigError, match="not the folder's tokenizer.json"):
        folder_codec({**codec, "src": other, "tgt": other}, tmp_path / "hf")


def test_vit_export_then_from_pretrained_gives_our_logits(tmp_path):
    """A ViT (8x8 single-channel images, 2x2 patches, a position table longer than the 17 tokens) as
    ViTForImageClassification, its class names in config.json."""
    fields = dict(kind="vit", vocab_size=10, n_classes=3, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=20,
                  image_size=8, patch_size=2, in_channels=1, head_hidden=None, norm="pre", pos="learned", ffn="gelu")
    run, model = save_run(tmp_path, fields, {"type": "classes", "classes": ["cat", "dog", "owl"], "seq2seq": False})
    export(run, tmp_path / "hf")
    ref = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    images = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ref(pixel_values=images).logits, model(images), atol=1e-5, rtol=1e-5)
    assert ref.config.id2label == {0: "cat", 1: "dog", 2: "owl"}
