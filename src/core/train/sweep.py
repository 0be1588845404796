"""Sweep bookkeeping: every job appends its outcome to <sweep dir>/summary.jsonl; when the sweep ends, a table
of all jobs is printed, and the process exits non-zero if any job failed (after all of them ran).

Re-running a sweep into its own directory (`hydra.sweep.dir=<dir>`; experiment presets use a fixed one) skips
the cells already completed or diverged there, resumes interrupted ones from their last checkpoint, and runs
the rest. A directory holding a sweep launched with other overrides is refused before any job starts, so no
finished run is ever overwritten, and a directory another live launcher holds is refused (an exclusive lock,
`archsweep.core.train.rundir`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from archsweep.core.model.checkpoint import CKPT_DIR
from archsweep.core.train.console import set_job
from archsweep.core.train.results import RESULTS, Results
from archsweep.core.train.rundir import DirectoryInUse, DirectoryLock, is_worker_process, setting_of, writable_directory
from archsweep.core.train.runinfo import is_setting, override_key

log = logging.getLogger("train")
SUMMARY = "summary.jsonl"
FINISHED = ("completed", "diverged")  # outcomes a re-run keeps; a failed or interrupted cell runs again


def _sweep_overrides(cfg: DictConfig) -> list[str]:
    return sorted(o for o in cfg.hydra.overrides.task if not is_setting(override_key(o)))


def check_sweep_dir(config: DictConfig) -> None:
    """Refuse to reuse a sweep directory that holds a sweep of other overrides (its runs would be overwritten)."""
    sweep_dir = Path(config.hydra.sweep.dir)
    saved = sweep_dir / "multirun.yaml"
    if not saved.is_file():
        return
    before, now = _sweep_overrides(OmegaConf.load(saved)), _sweep_overrides(config)
    if before != now:
        raise SystemExit(
            f"error: {sweep_dir} holds a sweep launched with other overrides ({' '.join(before) or 'none'}; now "
            f"{' '.join(now) or 'none'}); its runs are kept. Start a new sweep with hydra.sweep.dir=<new directory>, "
            f"or re-run with the same overrides to finish that one")


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if not is_setting(k)}


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Settings that differ between an earlier run's config `a` and this job's `b`. A key `a` lacks is a setting
    added to the framework since that run (the same sweep's overrides cannot add one), so it is not a difference:
    a sweep stays re-runnable after an update that adds an option with a default."""
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in a:
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}: {x!r} -> {y!r}")
    return out


def earlier_run(run_dir: Path, config: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """What this job's directory already holds: ("new", None), ("finished", results) for a completed or diverged
    run of the same config, ("resume", None) for an interrupted or failed one with a last checkpoint. A run of a
    different config raises ValueError (the caller must not touch it)."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return "new", None
    before = OmegaConf.to_container(OmegaConf.load(saved), resolve=True)
    diff = _diff(_comparable(before), _comparable(config))
    if diff:
        raise ValueError(f"{run_dir} holds a run with other settings ({'; '.join(diff[:3])}); it is kept. Start a "
                         f"new sweep with hydra.sweep.dir=<new directory>")
    try:
        results = Results.read(run_dir / RESULTS).to_dict()
    except (OSError, UnicodeDecodeError, ValueError):
        results = None
    if results and results.get("status") in FINISHED:
        return "finished", results
    return ("resume", None) if (run_dir / CKPT_DIR / "last.ckpt").is_file() else ("new", None)


def append_summary(info: Any, results: dict[str, Any], skipped: bool = False) -> None:
    line = {"job": info.job_num, "name": info.name, "status": results.get("status"), "error": results.get("error"),
            "run_dir": str(info.run_dir), "overrides": info.overrides, "skipped": skipped,
            "task_family": results.get("task_family"),
            "val": results.get("val"), "test": results.get("test")}
    with open(Path(info.sweep_dir) / SUMMARY, "a") as f:  # one short append per job
        f.write(json.dumps(line) + "\n")


def read_summary(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The latest line of each job (a re-run sweep appends again for the jobs it ran or skipped)."""
    path = Path(sweep_dir) / SUMMARY
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return list({row["run_dir"]: row for row in lines}.values())


# The sweep table's figures per task family (results.json's task_family): (header, split, key). Every exact match
# says how it was measured; a language model shows loss, perplexity and bits per character or byte instead.
COLUMNS = {
    "lm": [("val loss", "val", "loss"), ("val ppl", "val", "ppl"), ("val bits/char", "val", "bits_per_char"),
           ("val bits/byte", "val", "bits_per_byte"), ("test ppl", "test", "ppl"),
           ("test bits/char", "test", "bits_per_char"), ("test bits/byte", "test", "bits_per_byte")],
    "synthetic": [("val loss", "val", "loss"), ("val exact (decoded)", "val", "decoded_exact_match"),
                  ("val exact (teacher-forced)", "val", "exact_match"),
                  ("test exact (teacher-forced)", "test", "exact_match")],
    "translation": [("val loss", "val", "loss"), ("val BLEU (decoded)", "val", "bleu"), ("val ppl", "val", "ppl"),
                    ("test ppl", "test", "ppl")],
    "classification": [("val loss", "val", "loss"), ("val acc", "val", "acc"), ("test acc", "test", "acc")],
}


def format_table(rows: list[dict[str, Any]]) -> str:
    """One table per task family among the rows (a sweep usually has one), each with the columns that fit it and
    that some row holds; a job without metrics (failed) goes in the last table. A row without a task_family
    (written before it was recorded) counts as synthetic."""
    rows = sorted(rows, key=lambda r: r["job"] if r["job"] is not None else -1)
    families = list(dict.fromkeys(r.get("task_family") or "synthetic" for r in rows if r.get("val")))
    families = families or ["synthetic"]
    tables = []
    for i, name in enumerate(families):
        last = i == len(families) - 1
        members = [r for r in rows if ((r.get("task_family") or "synthetic") == name and r.get("val"))
                   or (last and not r.get("val"))]
        tables.append(family_table(members, name))
    return "\n\n".join(tables)


def family_table(rows: list[dict[str, Any]], name: str) -> str:
    def num(r: dict[str, Any], split: str, key: str) -> Any:
        value = (r.get(split) or {}).get(key)
        return f"{value:.4f}" if isinstance(value, (int, float)) else "-"

    columns = [c for c in COLUMNS[name] if any(num(r, c[1], c[2]) != "-" for r in rows)] or COLUMNS[name][:1]
    lines = [f"{'job':>4}  {'status':<9}  " + "  ".join(f"{c[0]:>{max(len(c[0]), 6)}}" for c in columns)
             + "  name / error"]
    for r in rows:
        tail = f"{r['name']}: {r['error']}" if r.get("error") else r["name"]
        if r.get("skipped"):
            tail += " (finished earlier, skipped)"
        cells = "  ".join(f"{num(r, c[1], c[2]):>{max(len(c[0]), 6)}}" for c in columns)
        lines.append(f"{r['job']:>4}  {r['status']:<9}  {cells}  {tail}")
    return "\n".join(lines)


class SweepSummary(Callback):
    """Hydra callback (conf/train.yaml: hydra.callbacks): locks the sweep directory for the launcher's lifetime,
    refuses a directory of another sweep, and prints the table at the end."""

    lock: DirectoryLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if is_worker_process():
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            writable_directory(sweep_dir, setting_of(config, sweep_dir, "hydra.sweep.dir"))
            self.lock = DirectoryLock(sweep_dir, "sweep").acquire()
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        except DirectoryInUse as e:
            raise SystemExit(f"error: hydra.sweep.dir: {e}") from None
        try:
            check_sweep_dir(config)
        except BaseException:
            self.lock.release()
            raise
        log.info(f"sweep in {sweep_dir}")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        set_job(None)  # the basic launcher runs the jobs in this process: what follows a job is not that job's

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = read_summary(sweep_dir)
        if not rows:
            return
        failed = [r for r in rows if r["status"] not in FINISHED]
        log.info(f"sweep {sweep_dir}: {len(rows) - len(failed)} of {len(rows)} jobs completed\n"
                 + format_table(rows))
        if failed:
            raise SystemExit(f"error: {len(failed)} of {len(rows)} sweep jobs failed; see {sweep_dir / SUMMARY} "
                             f"and error.txt in each failed job's directory")
