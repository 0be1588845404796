"""Language modelling from pre-tokenized shards (`task=tokens`): the shards `archsweep-prepare` writes, or
modded-nanogpt's `.bin`, nanoGPT's `train.bin`/`val.bin` and `.npy` arrays (`archsweep.core.data.shards`).

The shards stay on disk, memory-mapped: memory does not grow with the corpus. A training batch is a function of
(seed, batch index) alone, so a resumed run draws the batches the uninterrupted one would have. Two samplings:
- `random`: windows of block_size + 1 tokens at random offsets (nanoGPT's);
- `bos_aligned`: every row starts at a document start, documents packed whole into rows by best fit, cropped only
  when none fits (nanochat's and modded-nanogpt's loaders), see `packing.py`.
Validation and test read fixed consecutive windows of the held-out tokens, the same for every run of a sweep
whatever its sampling: the validation split from its start, the test split (or, where none was prepared, the
validation split from its end). With `doc_mask=true` each batch carries `doc_ids`: a document starts at each
boundary token, and the model keeps attention inside a document and restarts its positions there.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archsweep.core.data import paths
from archsweep.core.data.tasks.base import Task
from archsweep.core.data.tasks.text import positive
from archsweep.core.model.config import ModelConfig
from archsweep.variants.model import CAUSAL, SOURCE_TARGET, form_of

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

log = logging.getLogger(__name__)
SAMPLINGS = ("random", "bos_aligned")
GET_SHARDS = ("Make shards with `archsweep-prepare <text, JSONL or Parquet files> --out <folder>` (docs/shards.md), or "
              "point task.path at modded-nanogpt .bin shards, nanoGPT's train.bin/val.bin (with task.dtype) or .npy "
              "arrays; relative paths are looked up in the current directory, then the data folder.")


class TokensTask(Task):
    name = "tokens"
    forms = (CAUSAL, SOURCE_TARGET)
    family = "lm"
    sep_id = -1

    def __init__(self, path: str | None, block_size: int, batch_size: int, val_batches: int, test_batches: int,
                 eval_seed: int, sampling: str = "random", doc_mask: bool = False, dtype: str | None = None,
                 boundary_id: int | None = None, vocab_size: int | None = None, tokenizer: str | None = None,
                 data_dir: str | None = None, cache_dir: str | None = None, name: str = "tokens") -> None:
        from archsweep.core.data.shards import open_shards

        positive(block_size=block_size, batch_size=batch_size, val_batches=val_batches, test_batches=test_batches)
        if block_size < 2:
            raise ValueError(f"task.block_size={block_size} must be at least 2")
        if sampling not in SAMPLINGS:
            raise ValueError(f"task.sampling={sampling!r} is not a sampling; choose one of {', '.join(SAMPLINGS)}")
        if doc_mask not in (True, False):
            raise ValueError(f"task.doc_mask={doc_mask!r} must be true or false")
        if path is None:
            raise ValueError(f"task.path is not set: give the folder of token shards to train on. {GET_SHARDS}")
        self.name, self.block_size, self.batch_size, self.eval_seed = name, block_size, batch_size, eval_seed
        self.sampling, self.doc_mask = sampling, doc_mask
        folder = paths.locate(path, data_dir, f"task.path={path}", GET_SHARDS)
        self.shards = open_shards(folder, dtype=dtype, boundary_id=boundary_id, what=f"task.path={path}")
        self.boundary_id = self.shards.boundary_id
        if (sampling == "bos_aligned" or doc_mask) and self.boundary_id is None:
            setting = "task.sampling=bos_aligned" if sampling == "bos_aligned" else "task.doc_mask=true"
            raise ValueError(f"{setting} needs the token that separates documents, and {folder} ({self.shards.layout}"
                             f" layout) does not say which it is; set task.boundary_id (GPT-2's <|endoftext|> is "
                             f"50256)")
        self.vocab_size = self.task_vocab(vocab_size, folder)
        self.pad_id = -1  # nothing is padding; a document's boundary token ends generation and starts a prompt
        self.bos_id = self.eos_id = self.boundary_id if self.boundary_id is not None else -1
        self.tokenizer_path = self.check_tokenizer(tokenizer)
        self.cache = paths.cache_dir(cache_dir)
        self.windows = {split: self.eval_windows(split) for split in ("val", "test")}
        n_val = self.windows["val"][1]
        if n_val < batch_size:
            raise ValueError(f"task.batch_size={batch_size}: the validation split of {folder} holds "
                             f"{self.shards.tokens['val']:,} tokens, {n_val} window(s) of block_size + 1 = "
                             f"{block_size + 1} tokens, fewer than one batch; prepare more validation documents "
                             f"(archsweep-prepare --val-docs) or lower task.batch_size / task.block_size")
        self.n_batches = {"train": None, "val": min(val_batches, n_val // batch_size),
                          "test": min(test_batches, self.windows["test"][1] // batch_size)}
        if self.n_batches["val"] < val_batches:
            log.warning(f"task.val_batches={val_batches}: the validation split holds {n_val} windows, "
                        f"{self.n_batches['val']} batches; validating on those")
        self._indexes: dict[str, list[Any]] = {}
        self._tokenizer = None
        from archsweep.core.data.tasks.packing import Reads

        self.read = Reads()  # windows by plain reads: the process's memory stays that of its batches

    def task_vocab(self, given: int | None, folder: Path) -> int:
        known = self.shards.vocab_size
        if known is None and given is None:
            raise ValueError(f"task.vocab_size is not set and {folder} ({self.shards.layout} layout) does not record "
                             f"its vocabulary; set task.vocab_size to the tokenizer's (GPT-2: 50257)")
        if known is not None and given is not None and given < known:
            raise ValueError(f"task.vocab_size={given} is smaller than the vocabulary the shards in {folder} were "
                             f"made with ({known}); leave task.vocab_size=null to take it from meta.json")
        return given if given is not None else known

    def check_tokenizer(self, tokenizer: str | None) -> Path | None:
        """The tokenizer.json that decodes these shards: the shards' own, or `task.tokenizer`, which must be the
        one they were made with (same SHA-256) where meta.json records it."""
        from archsweep.core.data.paths import file_sha256

        if tokenizer is None:
            return self.shards.tokenizer_path
        given = Path(tokenizer).expanduser()
        if not given.is_file():
            raise FileNotFoundError(f"task.tokenizer={tokenizer}: no such file; give the tokenizer.json the shards "
                                    f"were made with, or leave task.tokenizer=null")
        made_with = self.shards.tokenizer_sha256
        if made_with is not None and file_sha256(given) != made_with:
            raise ValueError(f"task.tokenizer={tokenizer} is not the tokenizer the shards in {self.shards.folder} "
                             f"were made with ({self.shards.tokenizer_name}, sha256 {made_with[:12]}...); give that "
                             f"one, leave task.tokenizer=null, or prepare the shards again with this tokenizer")
        return given

    # -- what the model is checked against ------------------------------------------------------------------------

    def why_not(self, kind: str) -> str:
        return ("token shards carry only their tokenizer's ids, and masked-token prediction needs a [MASK] id; "
                f"it serves {', '.join(self.kinds())}")

    def check_model(self, cfg: ModelConfig) -> None:
        super().check_model(cfg)
        if self.doc_mask:
            from archsweep.core.model.config import check_doc_mask

            check_doc_mask(cfg)
        for split in self.shards.splits:
            for path, index in zip(self.shards.splits[split], self.indexes(split), strict=True):
                if index.max_id >= cfg.vocab_size:
                    raise ValueError(f"{path} holds token id {index.max_id}, at or above the model's vocabulary "
                                     f"(model.vocab_size={cfg.vocab_size}); set task.vocab_size (or model.vocab_size)"
                                     f" to the tokenizer's vocabulary, or check that these are the shards meant")

    def max_input_len(self, kind: str) -> int:
        return self.block_size - self.block_size // 2 if form_of(kind) == SOURCE_TARGET else self.block_size

    # -- reading ----------------------------------------------------------------------------------------------------

    def indexes(self, split: str) -> list[Any]:
        """Each shard's document starts and largest id (made once per shard, kept in the cache)."""
        from archsweep.core.data.tasks.packing import DocIndex

        if split not in self._indexes:
            self._indexes[split] = [DocIndex.of(tokens, path, self.boundary_id, self.cache) for tokens, path in
                                    zip(self.shards.arrays(split), self.shards.splits[split], strict=True)]
        return self._indexes[split]

    def eval_windows(self, split: str) -> tuple[str, int, bool]:
        """(split read, windows available, read from the end): consecutive windows of block_size + 1 tokens, a
        stride of block_size apart."""
        source = split if split in self.shards.splits else "val"
        sizes = self.shard_sizes(source)
        return source, sum(max(0, (n - 1) // self.block_size) for n in sizes), source != split

    def shard_sizes(self, split: str) -> list[int]:
        return [len(a) for a in self.shards.arrays(split)]

    def window(self, split: str, number: int) -> np.ndarray:
        """Evaluation window `number` (from the end of the split where `eval_windows` says so)."""

        source, total, from_end = self.windows[split]
        w = total - 1 - number if from_end else number
        for tokens in self.shards.arrays(source):
            here = max(0, (len(tokens) - 1) // self.block_size)
            if w < here:
                lo = w * self.block_size
                return self.read(tokens, lo, lo + self.block_size + 1)
            w -= here
        raise IndexError(f"window {number} of {split}")

    def random_rows(self, rng: np.random.Generator) -> np.ndarray:
        import numpy as np

        arrays = self.shards.arrays("train")
        room = np.array([max(0, len(a) - self.block_size) for a in arrays], dtype=np.float64)
        if room.sum() == 0:
            raise ValueError(f"every training shard in {self.shards.folder} is shorter than block_size + 1 = "
                             f"{self.block_size + 1} tokens; lower task.block_size")
        picks = rng.choice(len(arrays), size=self.batch_size, p=room / room.sum())
        rows = []
        for s in picks:
            o = int(rng.integers(0, room[s]))
            rows.append(self.read(arrays[s], o, o + self.block_size + 1))
        return np.stack(rows)

    def aligned_rows(self, rng: np.random.Generator) -> np.ndarray:
        """Rows packed from the documents that follow a random document of a shard (drawn by its size)."""
        import numpy as np

        from archsweep.core.data.tasks.packing import best_fit

        arrays, indexes = self.shards.arrays("train"), self.indexes("train")
        docs = np.array([len(ix.starts) for ix in indexes], dtype=np.float64)
        if docs.sum() == 0:
            raise ValueError(f"task.sampling=bos_aligned: no boundary token (id {self.boundary_id}) in the training "
                             f"shards of {self.shards.folder}; check task.boundary_id or use task.sampling=random")
        s = int(rng.choice(len(arrays), p=docs / docs.sum()))
        width, need = self.block_size + 1, self.batch_size * (self.block_size + 1)
        first, count = int(rng.integers(0, docs[s])), 4 * self.batch_size
        while True:
            offsets, lengths = indexes[s].documents(first, count)
            packed = best_fit(lengths, self.batch_size, width)
            if packed is not None or count >= 4 * need:
                break
            count *= 2
        if packed is None:
            raise ValueError(f"task.sampling=bos_aligned: shard {self.shards.splits['train'][s]} has too few tokens "
                             f"to fill a batch of {self.batch_size} rows of {width}")
        rows = np.empty((self.batch_size, width), dtype=np.int64)
        for r, row in enumerate(packed):
            at = 0
            for doc, n in row:
                rows[r, at:at + n] = self.read(arrays[s], offsets[doc], offsets[doc] + n)
                at += n
        return rows

    # -- batches ----------------------------------------------------------------------------------------------------

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        import numpy as np

        from archsweep.core.data.tasks import batches

        if split not in self.n_batches:
            raise ValueError(f"split={split!r} must be one of {', '.join(self.n_batches)}")

        def make(index: int) -> dict[str, Any]:
            if split == "train":
                rng = np.random.default_rng(batches.batch_seed(seed, split, index))
                rows = self.aligned_rows(rng) if self.sampling == "bos_aligned" else self.random_rows(rng)
            else:
                rows = np.stack([self.window(split, index * self.batch_size + r) for r in range(self.batch_size)])
            return self.make_batch(rows, kind)

        return batches.stream_loader(make, start, self.n_batches[split], rank, world_size)

    def make_batch(self, rows: np.ndarray, kind: str) -> dict[str, Any]:
        """Windows (B, T + 1) -> the batch a model of `kind` reads."""
        import torch

        window = torch.from_numpy(rows.astype("int64"))
        b, t = self.batch_size, self.block_size
        if form_of(kind) == SOURCE_TARGET:  # continuation: the encoder reads the first half
            half = t // 2
            return {"src": window[:, :half], "src_mask": None, "tgt_in": window[:, half:t], "tgt_mask": None,
                    "labels": window[:, half + 1:], "n_tokens": b * t}
        batch = {"tokens": window[:, :-1], "pad_mask": None, "labels": window[:, 1:], "n_tokens": b * t}
        if self.doc_mask:  # a document starts at each boundary token
            batch["doc_ids"] = (batch["tokens"] == self.boundary_id).long().cumsum(1)  # (B, T)
        return batch

    # -- text -------------------------------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        from archsweep.core.data.tokenizer import load_tokenizer

        if self._tokenizer is None and self.tokenizer_path is not None:
            self._tokenizer = load_tokenizer(self.tokenizer_path)
        return self._tokenizer

    def codec_state(self) -> dict[str, Any]:
        """The tokenizer's JSON where there is one; else ids written as numbers."""
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id, "sep_id": self.sep_id}
        if self.tokenizer_path is None:
            return {"type": "ids", "seq2seq": False, **ids}
        text = self.tokenizer_path.read_text()
        return {"type": "tokenizer", "src": text, "tgt": text, "seq2seq": False, **ids}

    def save(self, run_dir: str | Path) -> None:
        """Copy the tokenizer next to the run's outputs; a run continued on shards made with another tokenizer than
        the one it started with is refused."""
        if self.tokenizer_path is None:
            return
        target = Path(run_dir) / "tokenizer.json"
        data = self.tokenizer_path.read_bytes()
        if target.is_file() and target.read_bytes() != data:
            def digest(raw: bytes) -> str:
                return hashlib.sha256(raw).hexdigest()[:12]
            raise ValueError(f"{target} (sha256 {digest(target.read_bytes())}...) is not the tokenizer of the shards "
                             f"in {self.shards.folder} (sha256 {digest(data)}...): this run was made with other "
                             f"shards; continue it on those, or start a new run")
        target.write_bytes(data)

    def token_bytes(self, kind: str) -> Tensor | None:
        """Bytes per id from the shards' tokenizer, where it is a byte-level BPE (their sum over a split is the
        byte count meta.json records); None without a tokenizer."""
        import torch

        if self.tokenizer is None or not hasattr(self.tokenizer, "token_bytes"):
            return None
        table = self.tokenizer.token_bytes()
        table += [0] * (self.vocab_size - len(table))
        return torch.tensor(table, dtype=torch.long)

    def token_stream(self, split: str):
        source = self.windows[split][0] if split in self.windows else "train"
        return self.shards.arrays(source)[0]
