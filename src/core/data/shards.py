"""Token shards: pre-tokenized corpora as memory-mapped integer arrays with document boundaries (issue 27): the
format, its writer (used by `archsweep-prepare`) and its readers.

Reads our format (a folder with meta.json, written by `archsweep-prepare`, see docs/shards.md) and the layouts
others publish: modded-nanogpt's `.bin` shards (a 256-int32 header, then uint16 tokens), nanoGPT's headerless
`train.bin` / `val.bin`, and `.npy` files with or without the NumPy header (OLMo-core writes raw memmaps). Every
file is checked against its header or meta.json when the folder is opened, so a truncated or mislabelled shard is
refused before training starts rather than read as garbage.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT, VERSION = "archsweep-tokens", 1
META = "meta.json"
TOKENIZER = "tokenizer.json"
SPLITS = ("train", "val", "test")
MODDED_MAGIC, MODDED_VERSION, MODDED_HEADER = 20240520, 1, 256  # header: 256 int32
MODDED_BOUNDARY = 50256  # GPT-2's <|endoftext|>, put before each document by modded-nanogpt's fineweb.py
NPY_MAGIC = b"\x93NUMPY"
DTYPES = ("uint16", "uint32")


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.npy"


def dtype_for(vocab_size: int) -> np.dtype:
    """The smallest of our dtypes that holds every id of a vocabulary of this size."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


@dataclass(frozen=True)
class ShardSet:
    """A shard folder opened by `open_shards`: its files per split and what is known about them."""

    folder: Path
    layout: str  # "archsweep" | "modded-nanogpt" | "nanogpt" | "npy"
    splits: dict[str, list[Path]]
    dtype: np.dtype
    vocab_size: int | None
    boundary_id: int | None
    boundary: str  # "end": after each document | "start": before it
    tokens: dict[str, int]
    documents: dict[str, int] | None
    bytes: dict[str, int] | None
    tokenizer_name: str | None
    tokenizer_sha256: str | None
    tokenizer_path: Path | None
    cache: dict[str, list[np.ndarray]] = field(default_factory=dict, repr=False, compare=False)

    def arrays(self, split: str) -> list[np.ndarray]:
        """Read-only memmaps, one per shard of `split`, opened once."""
        if split not in self.splits:
            raise KeyError(f"split {split!r} is not in {self.folder} (it has {', '.join(self.splits)})")
        if split not in self.cache:
            self.cache[split] = [_memmap(p, self.layout, self.dtype)[0] for p in self.splits[split]]
        return self.cache[split]


def open_shards(folder: str | Path, dtype: str | None = None, boundary_id: int | None = None,
                what: str = "task.path") -> ShardSet:
    """Open a shard folder of any known layout, checking every file (see the module docstring). `dtype` is
    needed for headerless files; `boundary_id` names the document-boundary token of foreign layouts."""
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"{what}={folder}: no such folder; prepare one with `archsweep-prepare INPUT --out "
                                f"{folder}` or name an existing shard folder")
    if not folder.is_dir():
        raise ValueError(f"{what}={folder} is a file; name the folder that holds the shards")
    want = _parse_dtype(dtype, what)
    if (folder / META).is_file():
        return _open_archsweep(folder, want, boundary_id, what)
    return _open_foreign(folder, want, boundary_id, what)


def _parse_dtype(dtype: str | None, what: str) -> np.dtype | None:
    if dtype is None:
        return None
    if str(dtype) not in DTYPES:
        raise ValueError(f"{what.rsplit('.', 1)[0]}.dtype={dtype} is not a token dtype; use one of {', '.join(DTYPES)}")
    return np.dtype(dtype)


def _memmap(path: Path, layout: str, dtype: np.dtype | None) -> tuple[np.ndarray, np.dtype]:
    """The file's tokens as a read-only memmap and their dtype, or ValueError naming the damage and the fix."""
    size = path.stat().st_size
    if layout == "modded-nanogpt":
        header = np.fromfile(path, dtype=np.int32, count=MODDED_HEADER)
        if len(header) < MODDED_HEADER or header[0] != MODDED_MAGIC:
            raise ValueError(f"{path}: wrong magic {header[0] if len(header) else 'none'} (modded-nanogpt shards "
                             f"start with {MODDED_MAGIC}); if it holds raw tokens, name it train.bin / val.bin "
                             f"and pass task.dtype")
        if header[1] != MODDED_VERSION:
            raise ValueError(f"{path}: unknown modded-nanogpt version {header[1]} (known: {MODDED_VERSION}); "
                             f"re-export it with modded-nanogpt's data/fineweb.py")
        n, start = int(header[2]), MODDED_HEADER * 4
        if size != start + 2 * n:
            raise ValueError(f"{path}: truncated or padded: {size} bytes, its header says {n} uint16 tokens "
                             f"({start + 2 * n} bytes); download or export it again")
        return np.memmap(path, dtype=np.uint16, mode="r", offset=start, shape=(n,)), np.dtype(np.uint16)
    if layout in ("archsweep", "npy") and _has_npy_header(path):
        try:
            array = np.load(path, mmap_mode="r")
        except ValueError as err:  # numpy: "mmap length is greater than file size"
            raise ValueError(f"{path}: truncated .npy file ({size} bytes: {err}); write it again") from None
        if array.ndim != 1:
            raise ValueError(f"{path}: a {array.ndim}-D array of shape {array.shape}; token shards are 1-D")
        if array.dtype.name not in DTYPES:
            raise ValueError(f"{path}: dtype {array.dtype} is not a token dtype ({', '.join(DTYPES)})")
        if dtype is not None and array.dtype != dtype:
            raise ValueError(f"{path}: dtype mismatch: the file holds {array.dtype}, {dtype} was expected; "
                             f"pass task.dtype={array.dtype} or write the shard again")
        return array, array.dtype
    if layout == "archsweep":
        raise ValueError(f"{path}: not a .npy file (no NumPy header); prepare the folder again")
    if dtype is None:
        raise ValueError(f"{path}: headerless token file; its dtype is not written in it: pass task.dtype "
                         f"(task.dtype=uint16 for nanoGPT's GPT-2 shards)")
    if size % dtype.itemsize:
        raise ValueError(f"{path}: truncated: {size} bytes is not a whole number of {dtype} tokens "
                         f"({dtype.itemsize} bytes each); check task.dtype or copy the file again")
    return np.memmap(path, dtype=dtype, mode="r", shape=(size // dtype.itemsize,)), dtype


def _has_npy_header(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(NPY_MAGIC)) == NPY_MAGIC


def _open_archsweep(folder: Path, want: np.dtype | None, boundary_id: int | None, what: str) -> ShardSet:
    meta_path = folder / META
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{meta_path}: not valid JSON ({err}); prepare the folder again") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{meta_path}: unknown format {meta.get('format')!r} version {meta.get('version')!r} "
                         f"(this archsweep reads {FORMAT!r} version {VERSION}); prepare it with this archsweep")
    if meta.get("dtype") not in DTYPES:
        raise ValueError(f"{meta_path}: dtype {meta.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    dtype, vocab = np.dtype(meta["dtype"]), int(meta["vocab_size"])
    if dtype == np.uint16 and vocab > 1 << 16:
        raise ValueError(f"{meta_path}: vocab_size={vocab} does not fit dtype uint16 (65536 ids at most); "
                         f"prepare the folder again (it then writes uint32)")
    if want is not None and want != dtype:
        raise ValueError(f"{what.rsplit('.', 1)[0]}.dtype={want} but {meta_path} says {dtype}; drop task.dtype")
    if boundary_id is not None and boundary_id != meta["eos_id"]:
        raise ValueError(f"boundary_id={boundary_id} but {meta_path} says eos_id={meta['eos_id']}; drop it")
    if meta.get("complete") is False:
        raise ValueError(f"{folder}: an unfinished archsweep-prepare (meta.json says complete: false); re-run the "
                         f"same command to finish it")
    splits, tokens, documents, nbytes = {}, {}, {}, {}
    for split, shards in meta["splits"].items():
        splits[split] = []
        for shard in shards:
            path = folder / shard["file"]
            if not path.is_file():
                raise FileNotFoundError(f"{path}: listed in {meta_path} but missing; copy the whole folder again "
                                        f"or prepare it again")
            array, _ = _memmap(path, "archsweep", dtype)
            if len(array) != shard["tokens"]:
                raise ValueError(f"{path}: truncated: {len(array)} tokens, {meta_path} says {shard['tokens']}; "
                                 f"prepare the folder again")
            splits[split].append(path)
        tokens[split] = sum(s["tokens"] for s in shards)
        documents[split] = sum(s["documents"] for s in shards)
        nbytes[split] = sum(s["bytes"] for s in shards)
    _require_splits(folder, splits, what)
    tok = meta.get("tokenizer") or {}
    path = folder / TOKENIZER
    return ShardSet(folder, "archsweep", splits, dtype, vocab, int(meta["eos_id"]), "end", tokens, documents, nbytes,
                    tok.get("name"), tok.get("sha256"), path if path.is_file() else None)


def _split_of(path: Path) -> str | None:
    found = [s for s in SPLITS if re.search(rf"(^|[^a-z]){s}", path.stem.lower())]
    return found[0] if len(found) == 1 else None


def _open_foreign(folder: Path, want: np.dtype | None, boundary_id: int | None, what: str) -> ShardSet:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".bin", ".npy") and p.is_file())
    if not files:
        raise ValueError(f"{what}={folder}: empty: no meta.json, .bin or .npy shards in it; prepare it with "
                         f"`archsweep-prepare INPUT --out {folder}`")
    if len({p.suffix for p in files}) > 1:
        raise ValueError(f"{what}={folder} mixes .bin and .npy files; keep one layout per folder")
    if files[0].suffix == ".npy":
        layout = "npy"
    elif any(_first_int32(p) == MODDED_MAGIC for p in files) or want is None and not _nanogpt_names(files):
        layout = "modded-nanogpt"  # _memmap then refuses a file with another magic, naming it
    else:
        layout = "nanogpt"
    if layout == "modded-nanogpt" and want is not None and want != np.uint16:
        raise ValueError(f"{what.rsplit('.', 1)[0]}.dtype={want} but modded-nanogpt shards hold uint16; "
                         f"drop task.dtype")
    splits: dict[str, list[Path]] = {}
    tokens: dict[str, int] = {}
    dtypes = set()
    for path in files:
        split = _split_of(path)
        if split is None:
            raise ValueError(f"{path}: no single split in its name; rename it with one of train / val / test in it "
                             f"(e.g. {path.with_stem('train_' + path.stem).name})")
        array, dtype = _memmap(path, layout, want)
        dtypes.add(dtype)
        splits.setdefault(split, []).append(path)
        tokens[split] = tokens.get(split, 0) + len(array)
    if len(dtypes) > 1:
        raise ValueError(f"{folder}: dtype mismatch between its .npy files ({', '.join(map(str, dtypes))}); "
                         f"write them with one dtype")
    _require_splits(folder, splits, what)
    if layout == "modded-nanogpt" and boundary_id is None:
        boundary_id = MODDED_BOUNDARY
    return ShardSet(folder, layout, splits, dtypes.pop(), None, boundary_id,
                    "start" if layout == "modded-nanogpt" else "end", tokens, None, None, None, None, None)


def _first_int32(path: Path) -> int | None:
    head = np.fromfile(path, dtype=np.int32, count=1)
    return int(head[0]) if len(head) else None


def _nanogpt_names(files: list[Path]) -> bool:
    return all(p.name in ("train.bin", "val.bin", "test.bin") for p in files)


def _require_splits(folder: Path, splits: dict[str, list[Path]], what: str) -> None:
    for split in ("train", "val"):
        if not splits.get(split):
            raise ValueError(f"{what}={folder}: no {split} split (it has: {', '.join(splits) or 'nothing'}); a "
                             f"shard folder needs train and val shards (file names with 'train' / 'val' in them)")


def write_json(path: Path, data: dict) -> None:
    """Write `data` to `path` atomically: a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


class ShardWriter:
    """Appends tokenized documents to the open shard of a split; closes it after the document that reaches
    `shard_tokens` (temp file, then os.replace) and records it in meta.json (atomically) at once."""

    def __init__(self, out: Path, meta: dict) -> None:
        self.out, self.meta, self.limit = out, meta, meta["shard_tokens"]
        self.file = self.split = self.tmp = None
        self.tokens = self.docs = self.bytes = 0

    def add(self, split: str, tokens: np.ndarray, lengths: np.ndarray, nbytes: np.ndarray) -> None:
        if self.file is not None and self.split != split:
            self.close()
        ends = np.cumsum(lengths)
        first = 0
        while first < len(lengths):
            if self.file is None:
                self.begin(split)
            base = ends[first - 1] if first else 0
            last = min(int(np.searchsorted(ends, base + self.limit - self.tokens)), len(lengths) - 1)
            self.file.write(tokens[base:ends[last]].tobytes())
            self.tokens += int(ends[last] - base)
            self.docs += last + 1 - first
            self.bytes += int(nbytes[first:last + 1].sum())
            first = last + 1
            if self.tokens >= self.limit:
                self.close()

    def begin(self, split: str) -> None:
        self.split, self.tokens, self.docs, self.bytes = split, 0, 0, 0
        self.name = shard_name(split, len(self.meta["splits"][split]))
        self.tmp = self.out / f".{self.name}.tmp"
        self.file = open(self.tmp, "wb")
        self.header = self.write_header(0)

    def write_header(self, n: int) -> int:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(self.meta["dtype"])), "fortran_order": False,
                  "shape": (n,)}
        np.lib.format.write_array_header_1_0(self.file, header)  # padded for growth: the same length for any n
        return self.file.tell()

    def close(self) -> None:
        self.file.seek(0)
        if self.write_header(self.tokens) != self.header:
            raise RuntimeError("this NumPy pads .npy headers differently; upgrade numpy (>= 1.24)")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None
        os.replace(self.tmp, self.out / self.name)
        self.meta["splits"][self.split].append({"file": self.name, "tokens": self.tokens, "documents": self.docs,
                                                "bytes": self.bytes})
        write_json(self.out / META, self.meta)

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
            self.tmp.unlink(missing_ok=True)
