"""Hugging Face `transformers` layouts: which configurations have an exact equivalent there, their `config.json`,
and the weights moved between our names and theirs, both ways (export: `archsweep.core.eval.export`; import:
train.py `model.init_from=<folder>`). No `transformers` import: the layouts are written from their documented
`config.json` fields and weight names (GPT-2: Radford et al. 2019; Llama: Touvron et al. 2023; Mistral: Jiang et
al. 2023; ViT: Dosovitskiy et al. 2021, exported only), so exporting needs only `safetensors`.

Each layout says, for a `ModelConfig`, every option it has no place for (`refusals`); a configuration is exported
as the first layout with none, else refused naming them. Options that change no logits at inference (dropout,
init, z_loss, activation checkpointing) carry over or are dropped.
"""

from archsweep.core.model.hf.base import Layout, Weights
from archsweep.core.model.hf.folder import import_fields, load_folder_weights, read_folder, weight_files
from archsweep.core.model.hf.gpt2 import GPT2
from archsweep.core.model.hf.layouts import LAYOUTS, layout_for, layout_of
from archsweep.core.model.hf.llama import Llama, Mistral
from archsweep.core.model.hf.vit import ViT

__all__ = ["GPT2", "LAYOUTS", "Layout", "Llama", "Mistral", "ViT", "Weights", "import_fields", "layout_for",
           "layout_of", "load_folder_weights", "read_folder", "weight_files"]
