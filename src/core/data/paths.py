"""Where data and the prepared-data cache live.

Data: a relative path in a task's config is looked up in the current directory, then in the data directory:
`task.data_dir` (or train.py's `data_dir=`) if set, else `$ARCHSWEEP_DATA_DIR`, else both `../shared/data` next
to the repository (where the project's shared corpora live on developer machines and in CI) and the user data
folder `$XDG_DATA_HOME/archsweep/data` (`~/.local/share/archsweep/data`), where
`python -m archsweep.core.data.fetch` puts the public corpora. Cache: `task.cache_dir` if set, else
`$ARCHSWEEP_CACHE_DIR`, else `$XDG_CACHE_HOME/archsweep` (`~/.cache/archsweep`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


DATA_ENV = "ARCHSWEEP_DATA_DIR"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def user_data_dir() -> Path:
    """Where `python -m archsweep.core.data.fetch` downloads to by default."""
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "archsweep" / "data"


def data_dirs(explicit: str | os.PathLike | None = None) -> list[Path]:
    """The folders a relative data path is looked up in, in order (see the module docstring)."""
    if explicit is not None:
        return [Path(explicit).expanduser()]
    env = os.environ.get(DATA_ENV)
    return [Path(env).expanduser()] if env else [SHARED_DATA, user_data_dir()]


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The first of `data_dirs` that exists (else the first)."""
    folders = data_dirs(explicit)
    return next((f for f in folders if f.is_dir()), folders[0])


def cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit is not None:
        return Path(explicit).expanduser()
    env = os.environ.get("ARCHSWEEP_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "archsweep"


def locate(path: str | os.PathLike, data: str | os.PathLike | None, what: str, how: str,
           hint: Callable[[Path], str | None] | None = None) -> Path:
    """The existing file or folder `path` names (see the module docstring), or FileNotFoundError naming every
    place tried, `hint(path)` (the fetch command of a built-in corpus: `archsweep.core.data.fetch.hint`) and `how`
    to get the data."""
    given = Path(path).expanduser()
    tried = [given] if given.is_absolute() else [Path.cwd() / given, *(d / given for d in data_dirs(data))]
    for candidate in tried:
        if candidate.exists():
            return candidate
    fetch = hint(given) if hint is not None else None
    raise FileNotFoundError(f"{what}: {path} not found (tried {', '.join(map(str, tried))}). "
                            + (f"{fetch} " if fetch else "") + how)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read 1 MiB at a time (corpus checksums, the tokenizer a shard folder names)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
