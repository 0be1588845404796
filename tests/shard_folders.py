"""Token shard folders written by hand, in archsweep's format (meta.json + .npy shards; docs/shards.md) and in the
foreign layouts `task=tokens` reads, for the tests: what the reader must accept, independent of the writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB, EOS = 50, 49


def documents(n: int, seed: int, low: int = 3, high: int = 40) -> list[np.ndarray]:
    """n documents of random ids in [1, EOS), of random lengths in [low, high)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, EOS, int(rng.integers(low, high))) for _ in range(n)]


def shard_files(folder: Path, split: str, docs: list[np.ndarray], shard_tokens: int, eos: int,
                dtype: str = "uint16") -> list[dict]:
    """Each document then EOS; a shard closes after the document that reaches shard_tokens."""
    entries, current, n_docs = [], [], 0

    def close() -> None:
        name = f"{split}_{len(entries):06d}.npy"
        tokens = np.concatenate(current).astype(dtype)
        np.save(folder / name, tokens)
        entries.append({"file": name, "tokens": len(tokens), "documents": n_docs, "bytes": 3 * (len(tokens) - n_docs)})

    for doc in docs:
        current.append(np.append(doc, eos))
        n_docs += 1
        if sum(map(len, current)) >= shard_tokens:
            close()
            current, n_docs = [], 0
    if current:
        close()
    return entries


def make_shards(folder: Path, train_docs: int = 400, val_docs: int = 60, test_docs: int = 0, seed: int = 0,
                shard_tokens: int = 2000, vocab: int = VOCAB, eos: int = EOS) -> Path:
    """An archsweep shard folder of random documents (3 bytes per token in `bytes`, as if each stood for 3)."""
    folder.mkdir(parents=True, exist_ok=True)
    splits = {"train": documents(train_docs, seed), "val": documents(val_docs, seed + 1)}
    if test_docs:
        splits["test"] = documents(test_docs, seed + 2)
    meta = {"format": "archsweep-tokens", "version": 1, "dtype": "uint16", "vocab_size": vocab, "eos_id": eos,
            "tokenizer": {"name": "random ids", "sha256": "0" * 64}, "shard_tokens": shard_tokens, "settings": {},
            "splits": {split: shard_files(folder, split, docs, shard_tokens, eos) for split, docs in splits.items()}}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return folder


def make_modded_nanogpt(folder: Path, seed: int = 0, bos: int = 50256) -> Path:
    """modded-nanogpt's layout: a 256 x int32 header (magic 20240520, version 1, token count), then uint16 tokens;
    each document begins with `bos`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 300), ("val", 60)):
        tokens = np.concatenate([np.insert(d, 0, bos) for d in documents(n, seed)]).astype(np.uint16)
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, len(tokens))
        with open(folder / f"fineweb_{split}_000000.bin", "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.tobytes())
    return folder


def make_nanogpt(folder: Path, seed: int = 0, eos: int = 50256) -> Path:
    """nanoGPT's layout: headerless train.bin / val.bin of uint16, each document followed by `eos`."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 300), ("val", 60)):
        tokens = np.concatenate([np.append(d, eos) for d in documents(n, seed)]).astype(np.uint16)
        tokens.tofile(folder / f"{split}.bin")
    return folder
