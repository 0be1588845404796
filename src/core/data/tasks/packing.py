"""Where documents start in a token shard, and packing whole documents into rows (`task.sampling=bos_aligned`).

A document starts at each boundary token (the end-of-document token our shards and nanoGPT's append, or the
beginning-of-document token modded-nanogpt's prepend): the token acts as the document's start, so a row that
begins at a document begins with it (a shard's last token, which ends our layout's last document, starts none).
`DocIndex` finds those positions with one chunked pass over a memory-mapped shard and keeps them (with the shard's
largest id) in a file of the cache, so neither the pass nor the index costs memory that grows with the corpus, and
later runs skip the pass.

`best_fit` fills rows as nanochat's and modded-nanogpt's BOS-aligned loaders do: each row takes the longest
document that still fits, and when none fits, the next document cropped to the space left, so every row starts at
a document start and no token is padding.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

CHUNK = 1 << 24  # tokens per pass step: 32 MiB of uint16


def index_key(path: Path, boundary_id: int | None) -> str:
    stat = path.stat()
    parts = [str(path.resolve()), stat.st_size, stat.st_mtime_ns, boundary_id, 2]
    return hashlib.blake2b(json.dumps(parts).encode(), digest_size=10).hexdigest()


class DocIndex:
    """The document starts (int64 positions, memory-mapped) and the largest token id of one shard."""

    def __init__(self, starts: np.ndarray, max_id: int, end: int) -> None:
        self.starts, self.max_id, self.end = starts, max_id, end  # end: where the last document ends

    @classmethod
    def of(cls, tokens: np.ndarray, path: Path, boundary_id: int | None, cache: Path) -> DocIndex:
        """The index of `tokens` (the shard at `path`), read from `cache` or made there once."""
        folder = cache / "doc-index"
        key = index_key(path, boundary_id)
        info_path, starts_path = folder / f"{key}.json", folder / f"{key}.starts"
        info = read_json(info_path)
        if info is None or not starts_path.is_file() or starts_path.stat().st_size != 8 * info["n_starts"]:
            info = cls.build(tokens, boundary_id, folder, key, path)
        starts = (np.memmap(starts_path, dtype=np.int64, mode="r") if info["n_starts"]
                  else np.zeros(0, dtype=np.int64))
        return cls(starts, info["max_id"], info["end"])

    @staticmethod
    def build(tokens: np.ndarray, boundary_id: int | None, folder: Path, key: str, path: Path) -> dict[str, Any]:
        from archsweep.core.data.cache import say

        say(f"indexing {path.name} ({len(tokens):,} tokens: document starts, largest id) once, into {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.starts.tmp-{os.getpid()}"
        max_id, n = -1, 0
        with open(tmp, "wb") as out:
            for lo, chunk in chunks(tokens):
                max_id = max(max_id, int(chunk.max()))
                if boundary_id is not None:
                    hits = np.flatnonzero(chunk == boundary_id).astype(np.int64) + lo
                    hits = hits[hits < len(tokens) - 1]  # an end-of-document token last in the shard starts none
                    out.write(hits.tobytes())
                    n += len(hits)
        os.replace(tmp, folder / f"{key}.starts")
        ends_with_boundary = len(tokens) > 0 and boundary_id is not None and int(tokens[-1]) == boundary_id
        info = {"max_id": max_id, "n_starts": n, "end": len(tokens) - int(ends_with_boundary)}
        write_json(folder / f"{key}.json", info)
        return info

    def documents(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, lengths) of `count` documents from start number `first` on, wrapping around the shard."""
        n = len(self.starts)
        picks = (first + np.arange(count)) % n
        offsets = np.asarray(self.starts[picks])
        ends = np.where(picks + 1 < n, np.asarray(self.starts[np.minimum(picks + 1, n - 1)]), self.end)
        return offsets, ends - offsets


class Reads:
    """Token ranges of memory-mapped shards read with plain reads (`os.pread`) rather than by slicing the map: a
    slice maps its pages, and the kernel's fault-around and read-ahead map their neighbours too, into this process,
    whose resident memory then grows toward the size of the set as random windows touch it. Plain reads leave the
    pages in the page cache, owned by no process."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}

    def __call__(self, tokens: np.ndarray, lo: int, hi: int) -> np.ndarray:
        hi = min(hi, len(tokens))
        if not isinstance(tokens, np.memmap) or hi <= lo:
            return np.asarray(tokens[lo:hi])
        fd = self.files.get(tokens.filename)
        if fd is None:
            fd = self.files[tokens.filename] = os.open(tokens.filename, os.O_RDONLY)
        raw = os.pread(fd, (hi - lo) * tokens.itemsize, tokens.offset + lo * tokens.itemsize)
        return np.frombuffer(raw, dtype=tokens.dtype)

    def __getstate__(self) -> dict[str, Any]:  # descriptors do not cross processes: each opens its own
        return {"files": {}}

    def __del__(self) -> None:
        for fd in self.files.values():
            os.close(fd)


def chunks(tokens: np.ndarray):
    """(start, tokens) CHUNK at a time. A memory-mapped file is read with plain reads: the pass then leaves none of
    the file's pages mapped into this process (mapped pages would count in its resident memory, up to the size of
    the set)."""
    if not isinstance(tokens, np.memmap):
        for lo in range(0, len(tokens), CHUNK):
            yield lo, np.asarray(tokens[lo:lo + CHUNK])
        return
    with open(tokens.filename, "rb") as f:
        for lo in range(0, len(tokens), CHUNK):
            count = min(CHUNK, len(tokens) - lo)
            f.seek(tokens.offset + lo * tokens.itemsize)
            yield lo, np.fromfile(f, dtype=tokens.dtype, count=count)


def best_fit(lengths: np.ndarray, rows: int, width: int) -> list[list[tuple[int, int]]] | None:
    """Pack documents (their `lengths`, in the order drawn) into `rows` rows of `width` tokens: per row, the
    longest unused document that fits, else the next unused one cropped. Each row is a list of (document, tokens
    taken); None when the documents run out first."""
    unused = sorted((int(n), i) for i, n in enumerate(lengths))  # by length, then draw order
    order = list(range(len(lengths)))  # draw order, for cropping
    taken = [False] * len(lengths)
    packed = []
    for _ in range(rows):
        row, space = [], width
        while space > 0:
            at = bisect.bisect_right(unused, (space, len(lengths))) - 1
            if at >= 0:
                n, i = unused.pop(at)
                row.append((i, n))
                space -= n
            else:  # nothing fits whole: the first unused document, cropped to the space left
                while order and taken[order[0]]:
                    order.pop(0)
                if not order:
                    return None
                i = order.pop(0)
                unused.remove((int(lengths[i]), i))
                row.append((i, space))
                space = 0
            taken[i] = True
        packed.append(row)
    return packed


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
