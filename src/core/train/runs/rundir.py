"""Run and sweep directories that never mix or lose results.

- A default directory is `<output_root>/runs/<time>_<6 hex digits>` (sweeps: `sweeps/<time>_<hex>`), created
  exclusively, so runs launched in the same second never share one.
- A directory that already holds a run (checkpoints, metrics.csv, or a results.json that is not a failed start)
  is refused, unless the run resumes from a checkpoint inside it or `overwrite=true` says to replace it.
- A run, a sweep and each job of a sweep hold an exclusive lock (`.lock`, filelock's SoftFileLock: pid, host)
  on their directory while they work; a second launcher there is refused, and a lock whose process has died
  (same host) is stale and taken over.
- Temporary files a killed process left (`checkpoints/.<name>.tmp-<pid>`, `.metrics.csv.tmp-<pid>`, `*.json.tmp`)
  are removed at the next start in that directory, which says so in one line.
- A single run's start refused before training (job.py's ConfigError) leaves nothing: the directory made for it
  is removed (`withdraw`), and one that existed (a resumed run's) gets back its `.hydra/` and `train.log`.

Light (Hydra, OmegaConf and filelock only): all of it runs before the heavy imports.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from filelock import SoftFileLock, Timeout
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from archsweep.core.model.checkpoint import CKPT_DIR, resolve_checkpoint
from archsweep.core.train.launch.submitit_job import task_log_name
from archsweep.core.train.runs.results import RESULTS, Results

log = logging.getLogger("train")
LOCK = ".lock"
# what train.py writes into a run directory; overwrite=true removes these and nothing else
RUN_OUTPUTS = ("checkpoints", "metrics.csv", "results.json", "config.yaml", "error.txt", "train.log", "attention",
               ".hydra", "wandb", "tensorboard", "hparams.yaml")
RANK_ENV = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")


def _unique() -> str:
    return secrets.token_hex(3)  # not from the seeded RNGs


if not OmegaConf.has_resolver("unique"):  # `${unique:}` in conf/train.yaml's hydra.run.dir and hydra.sweep.dir
    OmegaConf.register_new_resolver("unique", _unique, use_cache=True)


if not OmegaConf.has_resolver("task_log"):  # the log file's name: a submitit job's task > 0 logs to its own file
    OmegaConf.register_new_resolver("task_log", task_log_name)  # (conf/hydra/job_logging/archsweep.yaml)


if not OmegaConf.has_resolver("mul"):  # `${mul:4,${model.d_model}}`: a size that follows another (presets)
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b)


class DirectoryInUse(RuntimeError):
    """Another live process holds the directory's lock."""


def is_worker_process() -> bool:
    """A DDP worker (Lightning re-runs the command line for ranks > 0) or another non-zero rank: it works in the
    directory rank 0 set up and locked."""
    return any(os.environ.get(k, "0") not in ("", "0") for k in RANK_ENV)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DirectoryLock:
    """An exclusive lock on `directory` (its `.lock` file), filelock's SoftFileLock: the file records the holder's
    pid and host; a lock whose holder has died on this host is taken over, one held on another host never is (this
    host cannot tell whether that process lives). `release()` (also at exit) removes it. `what` (a run, a sweep, a
    sweep job) is for the messages."""

    def __init__(self, directory: str | Path, what: str) -> None:
        self.path = Path(directory) / LOCK
        self.what = what
        self.lock = SoftFileLock(self.path, timeout=0)
        self.held = False

    def acquire(self) -> DirectoryLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        before = self._owner()[0] if self.path.exists() else None
        try:
            self.lock.acquire()
        except Timeout:
            raise DirectoryInUse(self._in_use_message()) from None
        if before is not None and before != os.getpid():
            log.warning(f"{self.path}: stale lock of process {before}, which has ended; taken over ({self.what})")
        self.held = True
        atexit.register(self.release)
        return self

    def _owner(self) -> tuple[int | None, str]:
        """(pid, host) that the lock file names: its first two lines, as SoftFileLock writes them."""
        try:
            pid, host, *_ = self.path.read_text().split("\n")
            return int(pid), host
        except (OSError, ValueError):
            return None, ""

    def _in_use_message(self) -> str:
        pid, host = self._owner()
        if pid is None:  # e.g. `pid host time what` on one line, as archsweep wrote locks before filelock
            return (f"{self.path.parent} is locked by {self.path}, which does not name its holder as this version "
                    f"writes it (a lock from an earlier archsweep?); if no run or sweep is working there, remove "
                    f"{self.path}")
        try:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.path.stat().st_mtime))
        except OSError:
            since = "?"
        where = "" if host in ("", socket.gethostname()) else f" on host {host}"
        return (f"{self.path.parent} is in use by process {pid}{where} (since {since}); two launches into one "
                f"directory would mix their results. Wait for it to end or choose another directory (if that "
                f"process is gone, remove {self.path})")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        self.lock.release()

    def __getstate__(self) -> dict:
        """A launcher that starts jobs in other processes (joblib, submitit) pickles the Hydra callbacks, and with
        them the sweep's lock: the copy names the directory but does not hold (or release) the lock, which stays
        with the launching process."""
        return {"path": self.path, "what": self.what}

    def __setstate__(self, state: dict) -> None:
        self.path, self.what = state["path"], state["what"]
        self.lock, self.held = SoftFileLock(self.path, timeout=0), False


def holds_run(run_dir: Path) -> str | None:
    """What in `run_dir` is a run's result (None when nothing is): checkpoints, metrics, or a results.json of a run
    that got further than a refused start."""
    ckpts = sorted(p.name for p in (run_dir / CKPT_DIR).glob("*.ckpt")) if (run_dir / CKPT_DIR).is_dir() else []
    if ckpts:
        return f"{CKPT_DIR}/{', '.join(ckpts)}"
    if (run_dir / "metrics.csv").is_file():
        return "metrics.csv"
    results = run_dir / RESULTS
    if results.is_file():
        try:
            status = Results.read(results).status
        except (OSError, UnicodeDecodeError, ValueError):
            status = "unreadable"
        if status != "failed" or (run_dir / "config.yaml").is_file():
            return f"{RESULTS} (status {status})"
    return None


def clean_stale_temp(directory: Path) -> list[Path]:
    """Remove the temporary files a killed process left: `checkpoints/.<name>.tmp-<pid>` and `.metrics.csv.tmp-<pid>`
    of a dead process (same host) and `<name>.json.tmp` (results, written and renamed at once by whoever holds the
    directory)."""
    removed = []
    for tmp in [*(directory / CKPT_DIR).glob(".*.tmp-*"), *directory.glob(".*.tmp-*"), *directory.glob("*.json.tmp")]:
        pid = tmp.name.rsplit("-", 1)[-1] if ".tmp-" in tmp.name else None
        if pid is not None and pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    if removed:
        log.info(f"removed {len(removed)} temporary file(s) left by an interrupted run: "
                 + ", ".join(str(p) for p in removed))
    return removed


def resumes_inside(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> bool:
    """Whether cfg.ckpt_path names a checkpoint inside `run_dir` (resuming a run in its own directory)."""
    if cfg.get("ckpt_path") is None:
        return False
    try:
        ckpt = resolve_checkpoint(str(cfg.ckpt_path), "resume", cfg.get("output_root", "."), overrides)
    except ValueError:
        return False  # job.py reports it
    return run_dir.resolve() in ckpt.resolve().parents


def writable_directory(path: Path, setting: str) -> None:
    """Create `path` (and its parents); ValueError naming `setting` (output_root, hydra.run.dir, ...) when it
    cannot be created or written: a file in the way, a read-only or full file system."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ValueError(f"{setting}: cannot write to {path} ({reason}{': ' + e.filename if e.filename else ''}); "
                         f"choose a writable directory, e.g. output_root=$HOME/archsweep-outputs") from None


def setting_of(cfg: DictConfig, directory: Path, key: str) -> str:
    """`output_root=<value>` when `directory` lies under it (the default places), else the hydra key."""
    root = Path(str(cfg.get("output_root", "outputs")))
    try:
        directory.resolve().relative_to(root.resolve())
        return f"output_root={root}"
    except ValueError:
        return f"{key}={directory}"


def claim_run_dir(cfg: DictConfig, run_dir: Path, overrides: list[str], what: str = "run") -> DirectoryLock:
    """Make `run_dir` this run's: create it, lock it, refuse it if it holds another run (unless resuming from
    inside it or overwrite=true), and clean stale temporary files. Raises ValueError / DirectoryInUse."""
    writable_directory(run_dir, setting_of(cfg, run_dir, "hydra.run.dir"))
    lock = DirectoryLock(run_dir, what).acquire()
    try:
        held = holds_run(run_dir)
        if held and not resumes_inside(cfg, run_dir, overrides):
            if not cfg.get("overwrite", False):
                raise ValueError(f"hydra.run.dir={run_dir} already holds a run ({held}); it is kept. Choose another "
                                 f"directory (or leave hydra.run.dir unset: every run gets its own), continue it with "
                                 f"resume={run_dir}, or replace it with overwrite=true")
            log.warning(f"overwrite=true: removing the run in {run_dir} ({held})")
            for name in RUN_OUTPUTS:
                path = run_dir / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
        clean_stale_temp(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


class Before:
    """What a run directory held before this process claimed it, so that a start refused before training can be
    undone (`withdraw`): whether it existed (and the topmost folder made for it), Hydra's `.hydra/` files, and
    the length of `train.log`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.existed = run_dir.exists()
        self.top = run_dir
        while not self.top.parent.exists() and self.top.parent != self.top:
            self.top = self.top.parent
        hydra_dir = run_dir / ".hydra"
        self.hydra = {p.name: p.read_bytes() for p in hydra_dir.iterdir() if p.is_file()} if hydra_dir.is_dir() else {}
        log_file = run_dir / "train.log"
        self.log_size = log_file.stat().st_size if log_file.is_file() else None
        self.lock: DirectoryLock | None = None

    def restore(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if not self.existed:  # made for this start: removed, with the empty folders made for it
            shutil.rmtree(self.run_dir, ignore_errors=True)
            folder = self.run_dir.parent
            while folder != self.top.parent and self.top in (folder, *folder.parents):
                try:
                    folder.rmdir()
                except OSError:
                    break
                folder = folder.parent
            return
        hydra_dir = self.run_dir / ".hydra"
        for path in (p for p in hydra_dir.glob("*") if p.is_file() and p.name not in self.hydra):
            path.unlink()
        for name, content in self.hydra.items():
            (hydra_dir / name).write_bytes(content)
        if not self.hydra and hydra_dir.is_dir() and not any(hydra_dir.iterdir()):
            hydra_dir.rmdir()
        log_file = self.run_dir / "train.log"
        if self.log_size is None:
            log_file.unlink(missing_ok=True)
        elif log_file.is_file():
            os.truncate(log_file, self.log_size)


STARTS: dict[Path, Before] = {}  # run directories this process claimed, as they were before


def withdraw(run_dir: Path) -> None:
    """Undo this process's start in `run_dir` (refused before training): a directory made for it is removed, one
    that existed (a resumed run's) gets back its `.hydra/` files and `train.log` as they were. Nothing happens to
    a directory this process did not claim (a DDP worker's, a sweep job's)."""
    before = STARTS.pop(Path(run_dir).resolve(), None)
    if before is not None:
        if before.existed:  # a directory made for the start goes silently: the refusal stays one line
            log.info(f"{run_dir} is left as it was")
        before.restore()


def take_rank0_directory(config: DictConfig, run_dir: str, rank: int) -> None:
    """A torchrun rank other than 0: work in rank 0's run directory, log to train_ddp_process_<rank>.log (Lightning's
    name for its own workers' logs) and leave `.hydra/` to rank 0."""
    with read_write(config), open_dict(config):
        config.hydra.run.dir = run_dir
        config.hydra.job.name = f"train_ddp_process_{rank}"
        config.hydra.output_subdir = None


class RunDirectory(Callback):
    """Hydra callback (conf/train.yaml: hydra.callbacks): claims a single run's directory before Hydra writes
    anything into it (`.hydra/`), so a refused directory is left exactly as it was."""

    lock: DirectoryLock | None = None
    trace_dir: Path | None = None  # trace_shapes=true: the run directory Hydra makes for it, removed at the end

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from archsweep.core.train.launch import torchrun

        if torchrun.under_torchrun() and torchrun.rank() != 0:
            take_rank0_directory(config, torchrun.agree_run_dir(""), torchrun.rank())
        if config.get("trace_shapes") and not is_worker_process():
            run_dir = Path(str(config.hydra.run.dir))
            self.trace_dir = None if run_dir.exists() else run_dir
        if is_worker_process():
            return
        if config.get("trace_shapes"):
            if torchrun.under_torchrun():
                torchrun.agree_run_dir(str(config.hydra.run.dir))
            return
        run_dir = Path(str(config.hydra.run.dir))
        before = Before(run_dir)
        try:
            self.lock = claim_run_dir(config, run_dir, list(config.hydra.overrides.task))
        except (ValueError, DirectoryInUse) as e:
            if not before.existed:
                before.restore()  # e.g. the directory was made but cannot be written
            raise SystemExit(f"error: {e}") from None
        before.lock = self.lock
        STARTS[run_dir.resolve()] = before
        if torchrun.under_torchrun():  # claimed: the other ranks may work in it now
            torchrun.agree_run_dir(str(run_dir))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
        trace = self.trace_dir
        if trace is not None and trace.is_dir() and {p.name for p in trace.iterdir()} <= {".hydra", "train.log"}:
            import shutil

            shutil.rmtree(trace, ignore_errors=True)  # a shape trace trains nothing: no run directory is left
