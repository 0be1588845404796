"""Translation on a parallel corpus (`task=multi30k`, `task=translation`), with BPE vocabularies and batches
bucketed by length.

Each split is two line-aligned files (`[train.en, train.de]`) or one `source<TAB>target` file. Byte-level BPE is
trained on the training split, one joint vocabulary for both languages (default; needed by decoder_only, which
reads `source SEP target` in one sequence) or one per side (`vocab: separate`, encoder_decoder only).
Training batches: each epoch is shuffled, cut into pools of `bucket_pool` batches, each pool sorted by length and
cut into batches, and the batches shuffled: sentences of a batch have similar lengths, so little compute goes to
padding. Validation and test batches run through the split in length order; `batch["ids"]` holds each row's line
index, and `references(split)` the target sentences by line, for BLEU on decoded output (`decode`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from archsweep.core.data import cache, fetch, paths, read
from archsweep.core.data.tasks.base import Task
from archsweep.core.data.tasks.synthetic import check_positive, pad
from archsweep.core.data.tokenizer import check_kind, load_tokenizer, train_tokenizer
from archsweep.variants.model import CAUSAL, SOURCE_TARGET, form_of

HOW = ("Each split is two line-aligned files [source, target] or one source<TAB>target file (relative paths: the "
       "current directory, then the data folder: data_dir= / task.data_dir, else $ARCHSWEEP_DATA_DIR, else "
       "../shared/data next to the repository and ~/.local/share/archsweep/data). Multi30k (task 1, en-de) is "
       "published at github.com/multi30k/dataset (data/task1/raw).")
EVAL_SPLITS = ("val", "test")


def as_files(value: Any, split: str, data_dir: str | None) -> list[Path]:
    files = [value] if isinstance(value, str) else list(value)
    if len(files) not in (1, 2):
        raise ValueError(f"task.{split}={value!r} must be one tab-separated file or a list of two line-aligned files")
    return [paths.locate(f, data_dir, f"task.{split}", HOW, fetch.hint) for f in files]


class TranslationTask(Task):
    name = "translation"
    forms = (SOURCE_TARGET, CAUSAL)
    family = "translation"

    def __init__(self, train: Any, val: Any, test: Any, data_dir: str | None, vocab: str, bpe_vocab_size: int,
                 max_len: int, batch_size: int, bucket_pool: int = 50, cache_dir: str | None = None,
                 name: str = "translation") -> None:
        check_positive(bpe_vocab_size=bpe_vocab_size, max_len=max_len, batch_size=batch_size, bucket_pool=bucket_pool)
        check_kind("bpe", bpe_vocab_size)
        if vocab not in ("joint", "separate"):
            raise ValueError(f"task.vocab={vocab!r} must be joint (one vocabulary, any model kind) or separate "
                             f"(one per language, encoder_decoder only)")
        if max_len < 2:
            raise ValueError(f"task.max_len={max_len} must be at least 2 (a token and the end token)")
        self.name, self.vocab, self.max_len, self.batch_size, self.pool = name, vocab, max_len, batch_size, bucket_pool
        if vocab == "separate":
            self.forms = (SOURCE_TARGET,)
        given = {"train": train, "val": val, "test": test if test is not None else val}
        if train is None or val is None:
            raise ValueError(f"task.train and task.val must name files; got train={train!r}, val={val!r}. {HOW}")
        files = {split: as_files(v, split, data_dir) for split, v in given.items()}
        for split, fs in files.items():
            for f in fs:
                if not f.is_file():
                    raise ValueError(f"task.{split}: {f} is not a file; give a file per language or one .tsv")
        flat = [f for split in given for f in files[split]]
        settings = {"vocab": vocab, "bpe_vocab_size": bpe_vocab_size, "layout": [len(files[s]) for s in given]}
        self.dir, info = cache.prepared(paths.cache_dir(cache_dir), "translation", flat, settings,
                                        lambda tmp: self._build(tmp, files, vocab, bpe_vocab_size))
        self.vocab_size = info["vocab_size"]
        self.src_vocab_size = info["src_vocab_size"] if vocab == "separate" else None
        self.sizes = info["pairs"]
        self._loaded: dict[str, Any] = {}
        self._tokenizers: dict[str, Any] = {}

    def why_not(self, kind: str) -> str:
        if form_of(kind) == CAUSAL:
            return "task.vocab=separate gives each language its own ids; set task.vocab=joint for decoder_only"
        return "a translation is not aligned position by position with its source"

    @staticmethod
    def _build(tmp: Path, files: dict[str, list[Path]], vocab: str, bpe_vocab_size: int) -> dict[str, Any]:
        import json

        import numpy as np

        lines = {}
        for split, fs in files.items():
            src, tgt = read.read_parallel(fs, f"task.{split}", HOW)
            keep = [i for i in range(len(src)) if src[i].strip() and tgt[i].strip()]
            if len(keep) < len(src):
                cache.say(f"{split}: skipping {len(src) - len(keep)} pairs with an empty side")
            if not keep:
                raise ValueError(f"task.{split}: {', '.join(map(str, fs))} holds no sentence pairs")
            lines[split] = ([src[i].strip() for i in keep], [tgt[i].strip() for i in keep])
        train_src, train_tgt = lines["train"]
        cache.say(f"training {vocab} BPE ({bpe_vocab_size} tokens) on {len(train_src):,} training pairs")
        if vocab == "joint":
            tok_src = tok_tgt = train_tokenizer("bpe", train_src + train_tgt, bpe_vocab_size)
            tok_src.save(tmp / "tokenizer.json")
        else:
            tok_src = train_tokenizer("bpe", train_src, bpe_vocab_size)
            tok_tgt = train_tokenizer("bpe", train_tgt, bpe_vocab_size)
            tok_src.save(tmp / "tokenizer.src.json")
            tok_tgt.save(tmp / "tokenizer.tgt.json")
        for split, (src, tgt) in lines.items():
            for side, tok, text in (("src", tok_src, src), ("tgt", tok_tgt, tgt)):
                ids = tok.encode_batch(text)
                offsets = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
                np.save(tmp / f"{split}.{side}.npy", np.fromiter((i for x in ids for i in x), dtype=np.int32,
                                                                  count=int(offsets[-1])))
                np.save(tmp / f"{split}.{side}.offsets.npy", offsets)
            (tmp / f"{split}.json").write_text(json.dumps({"src": src, "tgt": tgt}, ensure_ascii=False))
            cache.say(f"{split}: {len(src):,} pairs")
        return {"vocab_size": tok_tgt.vocab_size, "src_vocab_size": tok_src.vocab_size,
                "pairs": {split: len(v[0]) for split, v in lines.items()}}

    def tokenizer(self, side: str = "tgt"):
        if side not in self._tokenizers:
            name = "tokenizer.json" if self.vocab == "joint" else f"tokenizer.{side}.json"
            self._tokenizers[side] = load_tokenizer(self.dir / name, cache.rebuild_hint(self.dir))
        return self._tokenizers[side]

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        """Target (or source) ids back to text, up to the first end token."""
        ids = list(map(int, ids))
        return self.tokenizer(side).decode(ids[:ids.index(self.eos_id)] if self.eos_id in ids else ids)

    def references(self, split: str, side: str = "tgt") -> list[str]:
        """The split's sentences by line index (`batch["ids"]`), as read (detokenised)."""
        import json

        return cache.read(self.dir / f"{split}.json", lambda f: json.loads(f.read_text()))[side]

    def save(self, run_dir: str | Path) -> None:
        for f in self.dir.glob("tokenizer*.json"):
            (Path(run_dir) / f.name).write_bytes(f.read_bytes())

    def max_input_len(self, kind: str) -> int:
        return 2 * self.max_len + 1 if form_of(kind) == CAUSAL else self.max_len

    def load(self, split: str) -> dict[str, Any]:
        """Token arrays (memory-mapped) and lengths, source capped at max_len, target at max_len - 1 + EOS."""
        import numpy as np

        if split not in self._loaded:
            arrays = {}
            for side in ("src", "tgt"):
                arrays[side] = cache.read(self.dir / f"{split}.{side}.npy", lambda f: np.load(f, mmap_mode="r"))
                off = cache.read(self.dir / f"{split}.{side}.offsets.npy", np.load)
                arrays[f"{side}_start"] = off[:-1]
                arrays[f"{side}_len"] = np.diff(off)
            self._loaded[split] = arrays
        return self._loaded[split]

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        from archsweep.core.data.tasks import batches

        if split != "train" and split not in EVAL_SPLITS:
            raise ValueError(f"split={split!r} must be one of train, {', '.join(EVAL_SPLITS)}")
        data = self.load(split)
        if split == "train":
            order = TrainOrder(self, data, seed)
            return batches.stream_loader(lambda i: self.make_batch(data, order.batch(i), kind), start, None, rank,
                                         world_size)
        lengths = data["src_len"] + data["tgt_len"]
        ids = lengths.argsort(kind="stable")
        n = -(-len(ids) // self.batch_size)
        return batches.stream_loader(
            lambda i: self.make_batch(data, ids[i * self.batch_size:(i + 1) * self.batch_size], kind), start, n,
            rank, world_size)

    def make_batch(self, data: dict[str, Any], rows, kind: str) -> dict[str, Any]:
        import torch

        from archsweep.core.data.tasks import batches

        src_rows, tgt_rows = [], []
        for i in rows:
            s, t = int(data["src_start"][i]), int(data["tgt_start"][i])
            src_rows.append(data["src"][s:s + min(int(data["src_len"][i]), self.max_len)].tolist())
            tgt_rows.append(data["tgt"][t:t + min(int(data["tgt_len"][i]), self.max_len - 1)].tolist()
                            + [self.eos_id])
        src, src_len = pad(src_rows, self.pad_id)
        tgt, tgt_len = pad(tgt_rows, self.pad_id)
        if form_of(kind) == SOURCE_TARGET:
            out = batches.encoder_decoder_batch(src, src_len, tgt, tgt_len, self.pad_id, self.bos_id)
        else:
            out = batches.decoder_only_batch(src, src_len, tgt, tgt_len, self.pad_id, self.sep_id)
        out["ids"] = torch.as_tensor(rows, dtype=torch.long)
        return out


class TrainOrder:
    """Endless, resumable order of training batches: batch i is a function of (seed, i) alone."""

    def __init__(self, task: TranslationTask, data: dict[str, Any], seed: int) -> None:
        import numpy as np

        fits = (data["src_len"] <= task.max_len) & (data["tgt_len"] + 1 <= task.max_len)
        self.usable = np.flatnonzero(fits)
        if len(self.usable) < len(fits):
            cache.say(f"{task.name}: {len(fits) - len(self.usable):,} of {len(fits):,} training pairs are longer "
                      f"than task.max_len={task.max_len} tokens and are skipped")
        if len(self.usable) < task.batch_size:
            raise ValueError(f"task.batch_size={task.batch_size} exceeds the {len(self.usable)} usable training "
                             f"pairs; lower task.batch_size or raise task.max_len")
        self.lengths = (data["src_len"] + data["tgt_len"])[self.usable]
        self.task, self.seed = task, seed
        self.per_epoch = len(self.usable) // task.batch_size
        self.epoch, self.batches = -1, None

    def batch(self, index: int):
        import numpy as np

        from archsweep.core.data.tasks.batches import batch_seed

        epoch, j = divmod(index, self.per_epoch)
        if epoch != self.epoch:
            b, pool = self.task.batch_size, self.task.pool * self.task.batch_size
            rng = np.random.default_rng(batch_seed(self.seed, "train-epoch", epoch))
            perm = rng.permutation(len(self.usable))[:self.per_epoch * b]
            chunks = [perm[k:k + pool] for k in range(0, len(perm), pool)]
            ordered = np.concatenate([c[np.argsort(self.lengths[c], kind="stable")] for c in chunks])
            self.batches = ordered.reshape(self.per_epoch, b)[rng.permutation(self.per_epoch)]
            self.epoch = epoch
        return self.usable[self.batches[j]]
