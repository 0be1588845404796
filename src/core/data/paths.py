"""Where data and the prepared-data cache live.

Data: a relative path in a task's config is looked up in the current directory, then in the data directory:
`task.data_dir` if set, else `$ARCHSWEEP_DATA_DIR`, else `../shared/data` next to the repository (where the
project's shared corpora live on developer machines and in CI). Cache: `task.cache_dir` if set, else
`$ARCHSWEEP_CACHE_DIR`, else `$XDG_CACHE_HOME/archsweep` (`~/.cache/archsweep`).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit is not None:
        return Path(explicit).expanduser()
    env = os.environ.get("ARCHSWEEP_DATA_DIR")
    return Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data"


def cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit is not None:
        return Path(explicit).expanduser()
    env = os.environ.get("ARCHSWEEP_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "archsweep"


def locate(path: str | os.PathLike, data: str | os.PathLike | None, what: str, how: str) -> Path:
    """The existing file or folder `path` names (see the module docstring), or FileNotFoundError naming every
    place tried and `how` to get the data."""
    given = Path(path).expanduser()
    tried = [given] if given.is_absolute() else [Path.cwd() / given, data_dir(data) / given]
    for candidate in tried:
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{what}: {path} not found (tried {' and '.join(map(str, tried))}). {how}")
