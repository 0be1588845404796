"""Text <-> token ids for a trained model, rebuilt from a checkpoint alone (no data files, no Hydra).

A task describes its codec as a small JSON-serialisable dict (`Task.codec_state()`), which train.py stores in
every checkpoint:
- `symbols`: synthetic tasks; ids from `first` on are the listed symbols, written separated by `joiner`;
- `tokenizer`: text and translation tasks; the tokenizer files' JSON for the source and the target side;
- `classes`: image tasks; the class names, id i being the i-th (prompts are images, so nothing is encoded);
- `ids`: token shards without a tokenizer; ids written as numbers.
A task with a `codec_state()` method describes its own (`task=tokens`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class Codec:
    eos_id: int

    def encode(self, text: str, side: str = "src") -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        raise NotImplementedError


class SymbolCodec(Codec):
    def __init__(self, symbols: list[str], first: int, joiner: str, eos_id: int) -> None:
        self.symbols, self.first, self.joiner, self.eos_id = symbols, first, joiner, eos_id
        self.ids = {s: i for i, s in enumerate(symbols, first)}

    def encode(self, text: str, side: str = "src") -> list[int]:
        pieces = text.split() if self.joiner else [c for c in text if not c.isspace()]
        unknown = sorted({p for p in pieces if p not in self.ids})
        if unknown:
            raise ValueError(f"prompt has symbols this task does not know: {' '.join(unknown)}; valid symbols: "
                             f"{' '.join(self.symbols)}" + (" (separated by spaces)" if self.joiner else ""))
        return [self.ids[p] for p in pieces]

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        out = []
        for i in map(int, ids):
            if i == self.eos_id:
                break
            if self.first <= i < self.first + len(self.symbols):
                out.append(self.symbols[i - self.first])
        return self.joiner.join(out)


class TokenizerCodec(Codec):
    def __init__(self, src: str, tgt: str, eos_id: int) -> None:
        from archsweep.core.data.tokenizer import load_tokenizer

        self.eos_id = eos_id
        self.tokenizers = {}
        with tempfile.TemporaryDirectory() as tmp:
            for side, text in (("src", src), ("tgt", tgt)):
                path = Path(tmp) / f"{side}.json"
                path.write_text(text)
                self.tokenizers[side] = load_tokenizer(path)

    def encode(self, text: str, side: str = "src") -> list[int]:
        return self.tokenizers[side].encode(text)

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        ids = [int(i) for i in ids]
        return self.tokenizers[side].decode(ids[: ids.index(self.eos_id)] if self.eos_id in ids else ids)


class IdsCodec(Codec):
    """Token ids written as numbers separated by spaces: shards whose tokenizer the run does not have."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id

    def encode(self, text: str, side: str = "src") -> list[int]:
        try:
            return [int(p) for p in text.split()]
        except ValueError:
            raise ValueError(f"prompt {text[:40]!r}: this model's task has no tokenizer (its shards came without "
                             f"a tokenizer.json), so a prompt is token ids separated by spaces, e.g. '50256 464'"
                             ) from None

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        return " ".join(str(i) for i in map(int, ids))


class ClassCodec(Codec):
    eos_id = -1  # a class label has no end token

    def __init__(self, classes: list[str]) -> None:
        self.classes = classes

    def encode(self, text: str, side: str = "src") -> list[int]:
        raise ValueError("an image task's inputs are images, not text; there is nothing to encode")

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        return " ".join(self.classes[i] if 0 <= i < len(self.classes) else str(i) for i in map(int, ids))


def codec_from_state(state: dict[str, Any]) -> Codec:
    if state.get("type") == "symbols":
        return SymbolCodec(state["symbols"], state["first"], state["joiner"], state["eos_id"])
    if state.get("type") == "tokenizer":
        return TokenizerCodec(state["src"], state["tgt"], state["eos_id"])
    if state.get("type") == "classes":
        return ClassCodec(state["classes"])
    if state.get("type") == "ids":
        return IdsCodec(state["eos_id"])
    raise ValueError(f"unknown codec state {json.dumps(state)[:80]}; the checkpoint may come from a newer version")


def codec_state_for(task: Any) -> dict[str, Any]:
    """The codec state of a built task (stored in checkpoints by train.py)."""
    from archsweep.core.data.tasks.addition import AdditionTask
    from archsweep.core.data.tasks.text import TextTask
    from archsweep.core.data.tasks.translation import TranslationTask

    if hasattr(task, "codec_state"):  # a task that describes its own codec
        return task.codec_state()
    ids = {"pad_id": task.pad_id, "bos_id": task.bos_id, "eos_id": task.eos_id, "sep_id": task.sep_id}
    if hasattr(task, "first_symbol"):  # synthetic tasks: symbols after the special ids
        name = getattr(task, "symbol", lambda i: str(i - task.first_symbol))
        symbols = [name(i) for i in range(task.first_symbol, task.vocab_size)]
        joiner = "" if isinstance(task, AdditionTask) else " "
        return {"type": "symbols", "symbols": symbols, "first": task.first_symbol, "joiner": joiner,
                "seq2seq": True, **ids}
    if hasattr(task, "class_names"):  # image tasks: a label per image
        return {"type": "classes", "classes": list(task.class_names), "seq2seq": False, **ids}
    if isinstance(task, TextTask):
        text = (task.dir / "tokenizer.json").read_text()
        return {"type": "tokenizer", "src": text, "tgt": text, "seq2seq": False, **ids}
    if isinstance(task, TranslationTask):
        names = {"src": "tokenizer.json", "tgt": "tokenizer.json"} if task.vocab == "joint" else {
            "src": "tokenizer.src.json", "tgt": "tokenizer.tgt.json"}
        return {"type": "tokenizer", **{side: (task.dir / name).read_text() for side, name in names.items()},
                "seq2seq": True, **ids}
    raise ValueError(f"task {type(task).__name__} has no codec; add it to archsweep.core.data.codec.codec_state_for")
