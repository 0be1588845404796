"""The prepared-data cache: tokenised arrays and the tokenizer, computed once per (data, settings).

An entry is a folder `<cache dir>/<name>-<key>/`, where the key hashes the contents of every input file, the
settings that shape the result and FORMAT_VERSION. It is built in a temporary folder next to it, gets a `COMPLETE`
marker as its last file, and is then renamed into place: a preparation that is interrupted (or fails on bad input)
leaves at most a `.tmp-*` folder, which no later run reads (and the next preparation in that cache removes, once
the process that made it has ended), and a folder without the marker is rebuilt. The marker lists every file's
size: an entry whose files no longer have them (truncated by a full disk or a partial copy), or whose marker or
info.json does not parse, is rebuilt too. A file of an entry that does not read later (`read`: damaged at the same
size) raises an error naming it and the folder to delete.
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


def damaged_files(entry: Path) -> list[str]:
    """Files of a complete entry whose size differs from the one its marker lists (or that are missing). An
    entry written before the marker listed sizes is taken as it is."""
    try:
        marker = json.loads((entry / MARKER).read_text())
    except ValueError:  # cut short, or other bytes (UnicodeDecodeError is a ValueError)
        return [MARKER]
    if not isinstance(marker, dict):
        return [MARKER]
    sizes = marker.get("sizes", {})
    damaged = []
    for rel, size in sizes.items():
        path = entry / rel
        if not path.is_file() or path.stat().st_size != size:
            damaged.append(rel)
    return damaged


def read_info(entry: Path) -> dict[str, Any] | None:
    """The entry's info.json, or None when it does not parse as an object."""
    try:
        info = json.loads((entry / "info.json").read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def rebuild_hint(entry: Path) -> str:
    return f"delete the cache entry {entry} and the next run prepares it again"


def read(path: Path, reader: Callable[[Path], Any]) -> Any:
    """reader(path) for a file of a complete entry; a file that does not read (damaged since it was written, at
    the same size) raises ValueError naming it and the entry to delete."""
    try:
        return reader(path)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{path} in the data cache does not read ({type(e).__name__}: {str(e)[:160]}); "
                         f"{rebuild_hint(path.parent)}") from None


def remove_stale_builds(root: Path) -> None:
    """Remove `.tmp-*-pid<pid>-*` folders of builds whose process has ended (killed mid-preparation)."""
    for tmp in root.glob(".tmp-*"):
        pid = next((part[3:] for part in tmp.name.split("-") if part.startswith("pid") and part[3:].isdigit()), None)
        if pid is None or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still building
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        say(f"removed {tmp}, left by an interrupted preparation (process {pid})")


def prepared(root: str | Path, name: str, files: list[str | Path], settings: dict[str, Any],
             build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The cache entry for (files, settings), built by `build(tmp_dir) -> info` if missing. Returns the entry's
    folder and its info (what `build` returned, saved as info.json). Paths may be str or Path."""
    root, files = Path(root), [Path(f) for f in files]
    key = cache_key(files, settings)
    entry = root / f"{name}-{key}"
    if (entry / MARKER).is_file():
        damaged = damaged_files(entry)
        info = None if damaged else read_info(entry)
        if info is not None:
            return entry, info
        if damaged and damaged != [MARKER]:
            why = f"{', '.join(damaged[:3])} not the size it was written with: truncated?"
        else:
            why = f"{MARKER if damaged else 'info.json'} does not parse"
        say(f"{entry} is damaged ({why}); rebuilding it")
        shutil.rmtree(entry, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(root)
    start = time.time()
    say(f"preparing {name} from {', '.join(map(str, files))} into {entry} (once; later runs reuse it)")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-{key}-pid{os.getpid()}-", dir=root))
    try:
        info = build(tmp)
        (tmp / "info.json").write_text(json.dumps({**info, "settings": settings}, indent=1))
        sizes = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT_VERSION, "sizes": sizes}, indent=1) + "\n")
        if entry.exists():  # a folder without the marker (not ours: renames are atomic), or a concurrent builder
            if (entry / MARKER).is_file() and not damaged_files(entry):
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
