"""The prepared-data cache: tokenised arrays and the tokenizer, computed once per (data, settings).

An entry is a folder `<cache dir>/<name>-<key>/`, where the key hashes the contents of every input file, the
settings that shape the result and FORMAT_VERSION. It is built in a temporary folder next to it, gets a `COMPLETE`
marker as its last file, and is then renamed into place: a preparation that is interrupted (or fails on bad input)
leaves at most a `.tmp-*` folder, which no later run reads, and a folder without the marker is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
MARKER = "COMPLETE"


def file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def cache_key(files: list[Path], settings: dict[str, Any]) -> str:
    """Hash of the input files' contents (not their names or times: a moved copy hits the same entry), the
    settings and the format version."""
    parts = {"format": FORMAT_VERSION, "settings": settings, "files": [file_digest(f) for f in files]}
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=8).hexdigest()


def say(msg: str) -> None:
    print(f"[data] {msg}", file=sys.stderr, flush=True)


def prepared(root: Path, name: str, files: list[Path], settings: dict[str, Any],
             build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The cache entry for (files, settings), built by `build(tmp_dir) -> info` if missing. Returns the entry's
    folder and its info (what `build` returned, saved as info.json)."""
    key = cache_key(files, settings)
    entry = root / f"{name}-{key}"
    if (entry / MARKER).is_file():
        return entry, json.loads((entry / "info.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    start = time.time()
    say(f"preparing {name} from {', '.join(map(str, files))} into {entry} (once; later runs reuse it)")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-{key}-", dir=root))
    try:
        info = build(tmp)
        (tmp / "info.json").write_text(json.dumps({**info, "settings": settings}, indent=1))
        (tmp / MARKER).write_text(f"format {FORMAT_VERSION}\n")
        if entry.exists():  # a folder without the marker (not ours: renames are atomic), or a concurrent builder
            if (entry / MARKER).is_file():
                shutil.rmtree(tmp)
                return entry, json.loads((entry / "info.json").read_text())
            shutil.rmtree(entry)
        try:
            os.replace(tmp, entry)
        except OSError:
            if not (entry / MARKER).is_file():
                raise
            shutil.rmtree(tmp)  # another process finished the same entry first

    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"prepared {name} in {time.time() - start:.1f} s")
    return entry, json.loads((entry / "info.json").read_text())
