"""Reading UTF-8 text and line-aligned parallel corpora, refusing bad input with an error that says what is wrong,
where, and what to do. Paths may be given as `str` or `Path`."""

from __future__ import annotations

import os
from pathlib import Path

PathLike = str | os.PathLike


def missing(path: Path, what: str, how: str) -> FileNotFoundError:
    return FileNotFoundError(f"{what}: {path} does not exist. {how}")


def text_files(path: PathLike, what: str, how: str) -> list[Path]:
    """The file itself, or every non-hidden file under a folder (sorted, recursively)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"{what}: the folder {path} holds no files; put UTF-8 text files in it")
        return files
    raise missing(path, what, how)


def decode_utf8(raw: bytes, path: PathLike) -> str:
    path = Path(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path} is not UTF-8 text: byte {e.start} (line {line}) is {raw[e.start:e.start + 1]!r} "
                         f"({e.reason}); convert it first, e.g. `iconv -f latin1 -t utf-8 {path.name}`") from None


def read_text(path: PathLike, what: str, how: str) -> str:
    """All text of a file, or of the files of a folder joined in sorted order."""
    path = Path(path)
    parts = []
    for file in text_files(path, what, how):
        text = decode_utf8(file.read_bytes(), file)
        if text.strip():
            parts.append(text)
    if not parts:
        raise ValueError(f"{what}: {path} is empty (no text to train on)")
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts) if len(parts) > 1 else parts[0]


def read_lines(path: PathLike, what: str, how: str) -> list[str]:
    """Lines of a file, without line ends; one trailing newline does not make an extra line."""
    path = Path(path)
    if not path.is_file():
        raise missing(path, what, how)
    text = decode_utf8(path.read_bytes(), path)
    if not text.strip():
        raise ValueError(f"{what}: {path} is empty")
    return text.rstrip("\n").split("\n") if "\r\n" not in text else text.rstrip("\r\n").split("\r\n")


def read_parallel(files: list[PathLike], what: str, how: str) -> tuple[list[str], list[str]]:
    """(source lines, target lines) from two line-aligned files, or from one file of `source<TAB>target` lines."""
    files = [Path(f) for f in files]
    if len(files) == 2:
        src, tgt = (read_lines(f, what, how) for f in files)
        if len(src) != len(tgt):
            raise ValueError(f"{what}: the parallel files have different line counts: {files[0]} has {len(src)} "
                             f"lines, {files[1]} has {len(tgt)}; line i of one must translate line i of the other")
        return src, tgt
    [file] = files
    src, tgt = [], []
    for i, line in enumerate(read_lines(file, what, how), 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{what}: line {i} of {file} has {len(fields)} tab-separated fields; a one-file "
                             f"parallel corpus needs exactly two per line (source<TAB>target)")
        src.append(fields[0])
        tgt.append(fields[1])
    return src, tgt
