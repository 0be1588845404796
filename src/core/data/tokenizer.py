"""Tokenizers: characters, or byte-level BPE trained with Hugging Face `tokenizers`; both put the same special
tokens first, so ids 0-5 mean the same thing in every task. A character vocabulary can instead be exactly the
text's characters (`specials=False`: nanoGPT's shakespeare_char, 65 ids), with no special ids at all.

Byte-level BPE starts from the 256 byte symbols, so any text encodes without unknown tokens and decoding gives the
text back exactly; `[UNK]` exists for character vocabularies, whose unseen characters map to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[SEP]", "[UNK]", "[MASK]")
PAD, BOS, EOS, SEP, UNK, MASK = range(len(SPECIALS))
KINDS = ("char", "bpe")


class CharTokenizer:
    """One id per distinct character of the training text, after the special tokens (or with `specials=False`,
    the characters alone: an unknown character is then refused, as there is no [UNK])."""

    kind = "char"

    def __init__(self, chars: list[str], specials: bool = True) -> None:
        self.chars, self.specials = chars, specials
        self.first = len(SPECIALS) if specials else 0
        self.ids = {c: i for i, c in enumerate(chars, self.first)}

    @classmethod
    def train(cls, texts: Iterable[str], specials: bool = True) -> CharTokenizer:
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        return cls(sorted(seen), specials)

    @property
    def vocab_size(self) -> int:
        return self.first + len(self.chars)

    def encode(self, text: str) -> list[int]:
        ids = self.ids
        if self.specials:
            return [ids.get(c, UNK) for c in text]
        unknown = sorted(set(text) - set(ids))
        if unknown:
            raise ValueError(f"character(s) {''.join(unknown)!r} are not in this exact character vocabulary "
                             f"({len(self.chars)} characters, no [UNK]); use characters of the training text")
        return [ids[c] for c in text]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        n = self.first
        return "".join(self.chars[i - n] if i >= n else ("\ufffd" if i == UNK and n else "") for i in map(int, ids))

    def token_bytes(self) -> list[int]:
        """UTF-8 bytes each id decodes to: its character's, 3 for [UNK] (decoded as U+FFFD), 0 for the others."""
        specials = [len(self.decode([i]).encode()) for i in range(self.first)]
        return specials + [len(c.encode()) for c in self.chars]

    def save(self, path: str | Path) -> None:
        data = {"kind": "char", "specials": SPECIALS if self.specials else [], "chars": self.chars}
        Path(path).write_text(json.dumps(data, ensure_ascii=False))


class BpeTokenizer:
    """Byte-level BPE (GPT-2's scheme) from Hugging Face `tokenizers`."""

    kind = "bpe"

    def __init__(self, tokenizer) -> None:  # a tokenizers.Tokenizer
        self.tok = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def token_bytes(self) -> list[int]:
        """UTF-8 bytes each id stands for, 0 for the special tokens (which decoding drops). Byte-level BPE writes
        every byte as one symbol of a 256-symbol alphabet and its decoder maps each symbol back to its byte, adding
        and removing nothing, so a token's bytes are its symbols, whatever surrounds it. (Decoding a token alone
        would miscount one that holds part of a multi-byte character: it decodes to U+FFFD.)"""
        from tokenizers import decoders, pre_tokenizers

        if not isinstance(self.tok.decoder, decoders.ByteLevel):
            raise ValueError(f"this BPE tokenizer decodes with {self.tok.decoder!r}, not byte-level; bytes per "
                             f"token are known only for byte-level BPE (retrain it with task.tokenizer=bpe)")
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        specials = {i for i, added in self.tok.get_added_tokens_decoder().items() if added.special}
        table = []
        for i in range(self.vocab_size):
            symbols = self.tok.id_to_token(i)
            if i in specials:  # ours: the first six ids; GPT-2's: <|endoftext|>
                table.append(0)
            elif set(symbols) <= alphabet:
                table.append(len(symbols))
            else:
                raise ValueError(f"token {i} ({symbols!r}) is not written in byte-level symbols; bytes per token "
                                 f"are known only for byte-level BPE (retrain it with task.tokenizer=bpe)")
        return table

    def save(self, path: str | Path) -> None:
        self.tok.save(str(path))


Tokenizer = CharTokenizer | BpeTokenizer


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int) -> Tokenizer:
    if kind == "char":
        return CharTokenizer.train(texts)
    tok = BpeTokenizer.train(texts, vocab_size)
    return tok


def load_tokenizer(path: str | Path, fix: str = "replace it with an intact copy") -> Tokenizer:
    """The tokenizer a `save` wrote (a str or a Path). A file that does not parse raises ValueError naming it, with
    `fix` (what to do about it where it lies)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not a tokenizer's object")
        if data.get("kind") == "char":
            return CharTokenizer(data["chars"], specials=bool(data.get("specials", SPECIALS)))
        from tokenizers import Tokenizer as HFTokenizer

        return BpeTokenizer(HFTokenizer.from_file(str(path)))
    except OSError:
        raise  # missing or unreadable: not the file's content
    except Exception as e:  # noqa: BLE001  (JSON, a missing key, or the tokenizers library's own exception type)
        raise ValueError(f"{path} is not a readable tokenizer file ({type(e).__name__}: {str(e)[:160]}): truncated "
                         f"or damaged; {fix}") from None


def check_kind(kind: str, vocab_size: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"task.tokenizer={kind!r} is not a known tokenizer; valid options: {', '.join(KINDS)}")
    if kind == "bpe" and (not isinstance(vocab_size, int) or vocab_size < 257 + len(SPECIALS)):
        raise ValueError(f"task.bpe_vocab_size={vocab_size!r} is too small: byte-level BPE needs the 256 bytes and "
                         f"{len(SPECIALS)} special tokens plus merges; use e.g. 1000-16000")


def chunks(text: str, size: int = 1 << 16) -> Iterator[str]:
    """Pieces of a long text split at line ends, for encode_batch and tokenizer training."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end
