"""Language modelling on any UTF-8 text (`task=text`, `task=shakespeare_char`), sampled as nanoGPT samples it:
contiguous windows of `block_size` tokens at random offsets.

The first (1 - val_fraction) of the characters train the model and the tokenizer; the rest is held out (nanoGPT's
90% / 10% split). nanoGPT has no test split: test windows are drawn from the same held-out part with another seed.
How each model kind reads a window of block_size + 1 tokens w:
- decoder_only: tokens w[:-1], labels w[1:] (next-token prediction);
- encoder_decoder: continuation: the encoder reads the first half, the decoder predicts the second half;
- encoder_only: masked-token prediction (BERT): 15% of positions are chosen, 80% of them become [MASK], 10% a
  random token, 10% stay; only chosen positions are labelled.
With `exact_vocab=true` (characters only) the vocabulary is exactly the text's characters, found in the whole text
as nanoGPT's shakespeare_char does (65 on Tiny Shakespeare, instead of 65 + 6 special ids); with no special ids
there is no [MASK] and no start token, so only decoder_only reads it, and generation runs to max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archsweep.core.data import cache, fetch, paths, read
from archsweep.core.data.tasks.base import Task
from archsweep.core.data.tokenizer import (
    MASK,
    SPECIALS,
    CharTokenizer,
    check_kind,
    chunks,
    load_tokenizer,
    train_tokenizer,
)
from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, SOURCE_TARGET, form_of

if TYPE_CHECKING:
    from torch import Tensor

GET_DATA = ("Or set task.path to a UTF-8 text file or a folder of them (relative paths: the current directory, then "
            "the data folder: data_dir= / task.data_dir, else $ARCHSWEEP_DATA_DIR, else ../shared/data next to the "
            "repository and ~/.local/share/archsweep/data). Tiny Shakespeare is char-rnn's "
            "data/tinyshakespeare/input.txt (github.com/karpathy/char-rnn), saved as tinyshakespeare.txt.")


def positive(**values: Any) -> None:
    for field, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"task.{field}={value!r} must be a positive integer")


class TextTask(Task):
    name = "text"
    family = "lm"
    pad_id, bos_id, eos_id, sep_id = 0, 1, 2, 3

    def __init__(self, path: str, data_dir: str | None, tokenizer: str, bpe_vocab_size: int, block_size: int,
                 batch_size: int, val_fraction: float, val_batches: int, test_batches: int, eval_seed: int,
                 mask_prob: float = 0.15, cache_dir: str | None = None, name: str = "text",
                 exact_vocab: bool = False) -> None:
        positive(block_size=block_size, batch_size=batch_size, val_batches=val_batches, test_batches=test_batches)
        check_kind(tokenizer, bpe_vocab_size)
        if exact_vocab not in (True, False):
            raise ValueError(f"task.exact_vocab={exact_vocab!r} must be true or false")
        if exact_vocab and tokenizer != "char":
            raise ValueError(f"task.exact_vocab=true needs task.tokenizer=char (a {tokenizer} vocabulary has its "
                             f"special tokens); set task.tokenizer=char or task.exact_vocab=false")
        self.exact_vocab = exact_vocab
        if exact_vocab:  # no special ids: -1 is never a token (generation runs to its length, nothing is padding)
            self.pad_id = self.bos_id = self.eos_id = self.sep_id = -1
            self.forms = (CAUSAL,)
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"task.val_fraction={val_fraction} must be in (0, 1) (nanoGPT holds out 0.1)")
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"task.mask_prob={mask_prob} must be in (0, 1) (BERT masks 0.15)")
        if block_size < 2:
            raise ValueError(f"task.block_size={block_size} must be at least 2")
        self.name, self.block_size, self.batch_size, self.mask_prob = name, block_size, batch_size, mask_prob
        self.eval_seed = eval_seed
        self.n_batches = {"train": None, "val": val_batches, "test": test_batches}
        source = paths.locate(path, data_dir, f"task.path={path}", GET_DATA, fetch.hint)
        files = read.text_files(source, f"task.path={path}", GET_DATA)
        settings = {"tokenizer": tokenizer, "bpe_vocab_size": bpe_vocab_size if tokenizer == "bpe" else None,
                    "val_fraction": val_fraction, "n_files": len(files)}
        if exact_vocab:
            settings["exact_vocab"] = True  # (absent by default: the existing cache entries stay valid)
        self.dir, info = cache.prepared(paths.cache_dir(cache_dir), f"text-{tokenizer}", files, settings,
                                        lambda tmp: self._build(tmp, source, path, tokenizer, bpe_vocab_size,
                                                                val_fraction, exact_vocab))
        self.vocab_size, self.sizes = info["vocab_size"], info["tokens"]
        for split, n in self.sizes.items():
            if n <= block_size:
                raise ValueError(f"task.block_size={block_size} is larger than the data: the {split} split of "
                                 f"{source} has {n} tokens and a window needs block_size + 1; lower task.block_size "
                                 f"or use more text")
        self._tokenizer = None
        self._arrays: dict[str, Any] = {}

    @staticmethod
    def _build(tmp: Path, source: Path, path: str, kind: str, bpe_vocab_size: int,
               val_fraction: float, exact_vocab: bool = False) -> dict[str, Any]:
        import numpy as np

        text = read.read_text(source, f"task.path={path}", GET_DATA)
        cut = int(len(text) * (1 - val_fraction))
        parts = {"train": text[:cut], "val": text[cut:]}
        if exact_vocab:  # every character of the text, so that nothing needs an [UNK]
            tok = CharTokenizer.train(chunks(text), specials=False)
            cache.say(f"exact character vocabulary: {tok.vocab_size} characters")
        else:
            cache.say(f"training a {kind} tokenizer on {len(parts['train']):,} characters")
            tok = train_tokenizer(kind, chunks(parts["train"]), bpe_vocab_size)
        tok.save(tmp / "tokenizer.json")
        dtype = np.uint16 if tok.vocab_size < 1 << 16 else np.int32
        tokens = {}
        for split, part in parts.items():
            ids = np.fromiter((i for piece in tok.encode_batch(list(chunks(part))) for i in piece), dtype=dtype)
            np.save(tmp / f"{split}.npy", ids)
            tokens[split] = len(ids)
            cache.say(f"{split}: {len(part):,} characters -> {len(ids):,} tokens")
        return {"vocab_size": tok.vocab_size, "tokens": tokens}

    def why_not(self, kind: str) -> str:
        if self.exact_vocab:
            return (f"task.exact_vocab=true leaves no special ids (no [MASK], no start token), so it serves only "
                    f"{', '.join(self.kinds())}; set task.exact_vocab=false for the others")
        return super().why_not(kind)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.dir / "tokenizer.json", cache.rebuild_hint(self.dir))
        return self._tokenizer

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        """Token ids back to text (special tokens dropped); one vocabulary, so `side` changes nothing."""
        return self.tokenizer.decode(ids)

    def save(self, run_dir: str | Path) -> None:
        """Copy the tokenizer next to a run's outputs."""
        (Path(run_dir) / "tokenizer.json").write_bytes((self.dir / "tokenizer.json").read_bytes())

    def array(self, split: str):
        import numpy as np

        name = "train" if split == "train" else "val"
        if name not in self._arrays:
            self._arrays[name] = cache.read(self.dir / f"{name}.npy", lambda f: np.load(f, mmap_mode="r"))
        return self._arrays[name]

    def token_stream(self, split: str):
        return self.array(split)  # test windows come from the held-out text, as the test split's do

    def token_bytes(self, kind: str) -> Tensor | None:
        """Bytes per id from the tokenizer (`token_bytes`), for the models that predict each next token (with or
        without an encoder reading the window's first half); a masked language model scores only the masked
        positions, so it gets none."""
        import torch

        if form_of(kind) == BIDIRECTIONAL:
            return None
        return torch.tensor(self.tokenizer.token_bytes(), dtype=torch.long)

    def max_input_len(self, kind: str) -> int:
        return self.block_size - self.block_size // 2 if form_of(kind) == SOURCE_TARGET else self.block_size

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        from archsweep.core.data.tasks import batches

        if split not in self.n_batches:
            raise ValueError(f"split={split!r} must be one of {', '.join(self.n_batches)}")
        data_seed = seed if split == "train" else self.eval_seed
        data = self.array(split)

        def make(index: int) -> dict[str, Any]:
            return self.make_batch(data, batches.batch_seed(data_seed, split, index), kind)

        return batches.stream_loader(make, start, self.n_batches[split], rank, world_size)

    def make_batch(self, data, seed: int, kind: str) -> dict[str, Any]:
        import numpy as np
        import torch

        rng = np.random.default_rng(seed)
        offsets = rng.integers(0, len(data) - self.block_size, self.batch_size)
        window = torch.from_numpy(np.stack([data[o:o + self.block_size + 1] for o in offsets]).astype(np.int64))
        b, t = self.batch_size, self.block_size  # window: (B, T + 1)
        form = form_of(kind)
        if form == CAUSAL:
            return {"tokens": window[:, :-1], "pad_mask": None, "labels": window[:, 1:], "n_tokens": b * t}
        if form == SOURCE_TARGET:
            half = t // 2
            return {"src": window[:, :half], "src_mask": None, "tgt_in": window[:, half:t], "tgt_mask": None,
                    "labels": window[:, half + 1:], "n_tokens": b * t}
        return self.masked(window[:, :-1], rng)

    def masked(self, tokens, rng) -> dict[str, Any]:
        """BERT's masking of (B, T) tokens; at least one labelled position per row."""
        import numpy as np
        import torch

        from archsweep.core.data.tasks.base import IGNORE_INDEX

        b, t = tokens.shape
        draw = rng.random((b, t))
        chosen = draw < self.mask_prob
        chosen[np.arange(b), draw.argmin(1)] = True
        how = rng.random((b, t))
        chosen_t = torch.from_numpy(chosen)
        labels = tokens.masked_fill(~chosen_t, IGNORE_INDEX)
        inputs = tokens.clone()
        inputs[torch.from_numpy(chosen & (how < 0.8))] = MASK
        swap = torch.from_numpy(chosen & (how >= 0.8) & (how < 0.9))
        inputs[swap] = torch.from_numpy(rng.integers(len(SPECIALS), self.vocab_size, int(swap.sum())))
        return {"tokens": inputs, "pad_mask": None, "labels": labels, "n_tokens": b * t}
