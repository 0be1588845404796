"""`archsweep-export ckpt=<run dir or checkpoint> out=<folder>`: a train.py checkpoint as a Hugging Face model
folder (`model.safetensors`, `config.json`, `generation_config.json`, and `tokenizer.json` with
`tokenizer_config.json` where the run has a BPE tokenizer), which `AutoModelForCausalLM.from_pretrained(folder)`
and `AutoTokenizer.from_pretrained(folder)` load offline; a ViT as `ViTForImageClassification` with its class
names. The layouts are in `archsweep.core.model.hf`; a configuration without an exact equivalent, or an `out`
folder that exists and is not empty, is refused before anything is written.

    archsweep-export ckpt=outputs/runs/<time> out=exported/my-model
    python -m archsweep.core.eval.export ckpt=outputs/runs/<time>/checkpoints/best.ckpt out=exported/my-model
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from archsweep.core.model.checkpoint import read_checkpoint, resolve_checkpoint
from archsweep.core.model.config import ModelConfig
from archsweep.core.model.hf import layout_for
from archsweep.core.model.hf.base import fold_parametrisation
from archsweep.core.model.hf.layouts import to_hf

USAGE = "archsweep-export ckpt=<run directory or .ckpt> out=<new or empty folder>"
SPECIAL_NAMES = {"pad_id": "pad_token", "bos_id": "bos_token", "eos_id": "eos_token", "sep_id": "sep_token"}


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={out} is a file; give a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"out={out} exists and is not empty; nothing was overwritten: give a new or empty folder")


def tokenizer_files(codec: dict[str, Any] | None) -> dict[str, str]:
    """tokenizer.json (the run's own, byte-level BPE in Hugging Face `tokenizers` format) and
    tokenizer_config.json naming its special tokens; {} when the run has none in that format (symbols, characters,
    bare ids)."""
    if not codec or codec.get("type") != "tokenizer" or codec.get("seq2seq"):
        return {}
    text = codec["tgt"]
    data = json.loads(text)
    if data.get("kind") == "char":
        return {}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    specials = {}
    for key, name in SPECIAL_NAMES.items():
        token_id = codec.get(key)
        token = tok.id_to_token(token_id) if isinstance(token_id, int) and token_id >= 0 else None
        if token is not None:
            specials[name] = token
    if "[UNK]" in tok.get_vocab():
        specials["unk_token"] = "[UNK]"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "add_bos_token": False, "add_eos_token": False, **specials}
    return {"tokenizer.json": text, "tokenizer_config.json": json.dumps(config, indent=2),
            "special_tokens_map.json": json.dumps(specials, indent=2)}


def generation_config(codec: dict[str, Any] | None) -> dict[str, Any]:
    ids = {f"{k.removesuffix('_id')}_token_id": codec[k] for k in ("bos_id", "eos_id", "pad_id")
           if codec and isinstance(codec.get(k), int) and codec[k] >= 0}
    return {**ids, "do_sample": False}


def export(ckpt: str | Path, out: str | Path) -> list[Path]:
    """Write the Hugging Face folder of checkpoint `ckpt` (a file or a run directory) into `out`; returns the
    files written. ValueError before writing anything for a configuration, checkpoint or folder that cannot be."""
    from safetensors.torch import save_file

    out = Path(out)
    check_out(out)
    path = resolve_checkpoint(ckpt, "evaluate")
    state = read_checkpoint(path)
    if "archsweep" not in state or "state_dict" not in state:
        raise ValueError(f"ckpt={path} is not a train.py checkpoint (no 'archsweep' or 'state_dict' entry)")
    cfg = ModelConfig.from_dict(state["archsweep"]["model_config"])
    ours = {k.removeprefix("model."): v for k, v in state["state_dict"].items() if k.startswith("model.")}
    cfg, ours = fold_parametrisation(cfg, ours)  # param=mup's forward constants, into the weights
    layout = layout_for(cfg)
    weights = to_hf(layout, cfg, ours)
    codec = state["archsweep"].get("codec")
    config = {"architectures": [layout.architecture], "model_type": layout.model_type, "torch_dtype": "float32",
              **layout.hf_config(cfg)}
    texts = {}
    if layout.causal:
        config.update({k: v for k, v in generation_config(codec).items() if k != "do_sample"})
        texts = {"generation_config.json": json.dumps(generation_config(codec), indent=2), **tokenizer_files(codec)}
    elif codec and codec.get("type") == "classes":  # an image classifier's label names
        config["id2label"] = dict(enumerate(codec["classes"]))
        config["label2id"] = {name: i for i, name in enumerate(codec["classes"])}
    texts = {"config.json": json.dumps(config, indent=2), **texts}
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name, text in texts.items():
        (out / name).write_text(text + "\n")
    return [out / "model.safetensors", *(out / n for n in texts)]


def parse(argv: list[str]) -> dict[str, str]:
    args = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in ("ckpt", "out") or not value:
            raise ValueError(f"cannot read the argument {arg!r}; usage: {USAGE}")
        args[key] = value
    missing = [k for k in ("ckpt", "out") if k not in args]
    if missing:
        raise ValueError(f"{' and '.join(missing)} missing; usage: {USAGE}")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    try:
        args = parse(argv)
        written = export(args["ckpt"], args["out"])
    except ValueError as err:  # CheckpointError is one
        print(f"archsweep-export: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {len(written)} files to {written[0].parent}: {', '.join(p.name for p in written)}")


if __name__ == "__main__":
    main()
