"""Checkpoints: rebuild the plain model from one without Hydra or Lightning, find the file a setting names
(`resolve_checkpoint`: to resume, or to evaluate and generate from), and write them atomically.

    from archsweep.core.model.checkpoint import load_model
    model = load_model("outputs/runs/2025-01-01_12-00-00/checkpoints/best.ckpt")  # an nn.Module, eval mode
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from archsweep.core.model.config import ModelConfig

CKPT_DIR = "checkpoints"
RESUME_IGNORED = ("ckpt_path", "resume", "trainer.max_steps", "schedule.total_steps")  # may differ when resuming


class CheckpointError(ValueError):
    """A file given as a checkpoint that does not load safely: truncated, not a checkpoint, or holding objects
    beyond tensors and plain containers (which `torch.load(weights_only=True)` refuses to unpickle)."""


def check_checkpoint_file(path: str | Path) -> None:
    """A look, without torch, that `path` can be a torch.save file: a complete zip archive (a truncated copy has
    lost the archive's closing directory) whose members match their checksums (torch reads a member whose bytes
    changed, on a bad disk or in a broken copy, without a word: wrong weights). Reading the archive for the checksums
    costs about what loading it does (1 GB/s). CheckpointError naming the file otherwise; safe_load checks the rest."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file" if not path.exists() else f"{path} is not a file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is not a readable checkpoint (not the zip archive torch.save writes: "
                              f"truncated, e.g. by an interrupted copy, or another kind of file); give a checkpoint "
                              f"written by train.py")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        bad = f"its structure ({e})"
    if bad is not None:
        raise CheckpointError(f"{path} is damaged: {bad} does not match the checksum the archive recorded when it "
                              f"was written (a disk or copy error); use another copy, or the run's other checkpoint "
                              f"(checkpoints/best.ckpt or last.ckpt)")


def safe_load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """torch.load with weights_only=True (tensors and plain containers only: unpickling cannot run code), every
    failure raised as a CheckpointError that names the file. train.py's own checkpoints load this way."""
    import pickle

    import torch

    path = Path(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # what weights_only refuses: a class or callable named by the file
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} holds objects that do not load safely (torch.load weights_only=True refused "
                              f"them: {first[:200]}); archsweep loads only checkpoints written by train.py, whose "
                              f"contents are tensors and plain values") from None
    except Exception as e:  # noqa: BLE001  (truncated zip, a text file, ...: torch raises many kinds)
        if isinstance(e, FileNotFoundError):
            raise CheckpointError(f"{path}: no such file") from None
        if isinstance(e, IsADirectoryError):
            raise CheckpointError(f"{path} is a directory, not a checkpoint file") from None
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e)[:160]}); it may be "
                              f"truncated (an interrupted copy) or not a .ckpt file; give a checkpoint written by "
                              f"train.py") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a train.py checkpoint (a dict with "
                              f"'state_dict' and 'archsweep')")
    return ckpt


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A train.py checkpoint as a dict, loaded safely (`safe_load`), its `archsweep` entry and weights' names
    upgraded if old."""
    from archsweep.core.model.legacy import upgrade_checkpoint

    return upgrade_checkpoint(safe_load(path))  # runs written before the rename and the plug-ins load too


def load_model(path: str | Path, device: str = "cpu"):
    """The trained `nn.Module` stored in a train.py checkpoint, rebuilt from the config it carries."""
    return model_from_checkpoint(read_checkpoint(path), path).to(device).eval()


def model_from_checkpoint(ckpt: dict[str, Any], path: str | Path):
    """Rebuild the plain model from a loaded train.py checkpoint dict."""
    from archsweep.core.model.build import build_model

    if "archsweep" not in ckpt or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a train.py checkpoint (no 'archsweep' or 'state_dict' entry)")
    model = build_model(ModelConfig.from_dict(ckpt["archsweep"]["model_config"]))
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()
                           if k.startswith("model.")})
    return model


def resolve_init(value: str | Path) -> Path:
    """The checkpoint file train.py's `init_from` names (a run directory: best.ckpt, else last.ckpt), checked to
    be a complete archive (no torch needed)."""
    path = Path(value)
    if path.is_dir():
        path = next((path / CKPT_DIR / n for n in ("best.ckpt", "last.ckpt") if (path / CKPT_DIR / n).is_file()),
                    path / CKPT_DIR / "best.ckpt")
    if not path.is_file():
        raise CheckpointError(f"init_from={value}: no checkpoint there; give a .ckpt file written by train.py or "
                              f"its run directory")
    check_checkpoint_file(path)
    return path


def init_weights_from(model, value: str | Path) -> Path:
    """Load the weights of a train.py checkpoint (a .ckpt file, or a run directory: its best.ckpt, else last.ckpt)
    into `model`, which must have the same parameters; options that add no weights may differ (RoPE scaling, the
    context length of a table-free encoding, dropout). Returns the file read. For fine-tuning (train.py
    `init_from`); resuming a run is `ckpt_path`."""
    path = resolve_init(value)
    ckpt = read_checkpoint(path)
    if "state_dict" not in ckpt:
        raise CheckpointError(f"init_from={path} is not a train.py checkpoint (no 'state_dict' entry)")
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
              if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f"missing {', '.join(missing[:4])}" if missing else "",
                 f"unexpected {', '.join(unexpected[:4])}" if unexpected else "",
                 f"shapes differ: {'; '.join(shapes[:4])}" if shapes else ""]
        found = "; ".join(p for p in parts if p)
        raise CheckpointError(f"init_from={path} holds weights of another architecture ({found}); "
                              f"init_from needs the same sizes and variants, only weight-free options may change")
    model.load_state_dict(state)
    return path


def atomic_save(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary file beside `path`, then rename over it: a reader never sees a partial file
    and an interrupted save leaves the previous checkpoint intact."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        # torch's archive writer can fail as `[enforce fail at inline_container.cc:...] ... file write failed`,
        # without the cause: taken for a full disk when the checkpoint does not fit in the space left
        writer_failed = isinstance(e, RuntimeError) and "inline_container" in str(e)
        if not (_disk_full(e) or writer_failed):
            raise
        import shutil

        tmp.unlink(missing_ok=True)  # before measuring: the partial file's space is free again
        free, needed = shutil.disk_usage(path.parent).free, saved_size(obj)
        if not _disk_full(e) and needed <= free:
            raise
        short = f"{_size(needed - free)} or more" if needed > free else "some space"
        raise OSError(errno.ENOSPC, f"cannot write the checkpoint {path}: the disk is full ({path.name} needs "
                                    f"{_size(needed)}, {path.parent} has {_size(free)} free); the previous "
                                    f"{path.name}, if any, is intact. Free {short} there, or give output_root= a "
                                    f"disk with room, and resume") from None
    finally:
        tmp.unlink(missing_ok=True)


class _ByteCounter:
    """A file-like sink that only counts what torch.save writes into it."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def saved_size(obj: Any) -> int:
    """The bytes torch.save writes for `obj` (serialised into a counter: no memory or disk used for them)."""
    import torch

    counter = _ByteCounter()
    torch.save(obj, counter)
    return counter.count


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _disk_full(error: BaseException) -> bool:
    return (getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            or "No space left on device" in str(error) or "Disk quota exceeded" in str(error))


def _resume_key(overrides: list[str]) -> list[str]:
    return sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in RESUME_IGNORED)


PURPOSES = ("resume", "evaluate")  # what a checkpoint is resolved for; evaluate also means generate


def resolve_checkpoint(value: str | Path, purpose: str, output_root: str | Path | None = None,
                       overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """The checkpoint file `value` names, by one rule: a file is itself; a run directory means its
    checkpoints/last.ckpt when resuming (the newest state) and its checkpoints/best.ckpt, else last.ckpt, when
    evaluating or generating (the lowest val/loss); `last`, for resuming only, is the newest last.ckpt
    under `output_root` of a run launched with the same `overrides` (ckpt_path and the step budget aside).

    Errors name the setting train.py (`ckpt_path`) or evaluate.py / generate.py (`ckpt`) read."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose={purpose!r} must be one of {', '.join(PURPOSES)}")
    if purpose == "resume" and str(value) == "last":
        return _newest_last(output_root if output_root is not None else ".", overrides)
    path = Path(value)
    names = ("last.ckpt",) if purpose == "resume" else ("best.ckpt", "last.ckpt")
    if path.is_dir():
        found = [path / CKPT_DIR / n for n in names if (path / CKPT_DIR / n).is_file()]
        path = found[0] if found else path / CKPT_DIR / names[0]
    if path.is_file():
        return path
    if purpose == "resume":
        raise ValueError(f"ckpt_path={value}: no checkpoint file there; give a .ckpt file, a run directory "
                         f"holding {CKPT_DIR}/last.ckpt, or `last`")
    raise ValueError(f"ckpt={value}: no checkpoint there; give a .ckpt file written by train.py or its run "
                     f"directory (holding {CKPT_DIR}/best.ckpt or last.ckpt)")


def _newest_last(output_root: str | Path, overrides: list[str] | tuple[str, ...]) -> Path:
    wanted = _resume_key(list(overrides))
    candidates = sorted(Path(output_root).glob(f"**/{CKPT_DIR}/last.ckpt"), key=lambda p: p.stat().st_mtime,
                        reverse=True)
    for path in candidates:
        recorded = path.parent.parent / ".hydra" / "overrides.yaml"  # written by Hydra in every run directory
        if recorded.is_file() and _resume_key(list(OmegaConf.load(recorded))) == wanted:
            return path
    raise ValueError(f"ckpt_path=last: no run under {output_root}/ launched with overrides {wanted or '(none)'} "
                     f"has {CKPT_DIR}/last.ckpt ({len(candidates)} other runs have one); pass the checkpoint "
                     f"file or run directory instead")
