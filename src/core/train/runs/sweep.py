"""Sweep bookkeeping: every job appends its outcome to <sweep dir>/summary.jsonl; when the sweep ends, a table
of all jobs is printed, and the process exits non-zero if any job failed (after all of them ran).

A failed job prints its error in full only when no other job of the same launch has printed it (the jobs, in
whatever processes the launcher runs them, see each other's lines in summary.jsonl); the end of the sweep lists
each distinct error once, with the jobs it hit and where their results.json hold it.

Re-running a sweep into its own directory (`hydra.sweep.dir=<dir>`; experiment presets use a fixed one) skips
the cells already completed or diverged there (and those paused at or beyond the `pause_at` asked), resumes
interrupted ones (and paused ones asked to go further) from their last checkpoint, and runs the rest. A directory
holding a sweep launched with other overrides is refused before any job starts, so no finished run is ever
overwritten, and a directory another live launcher holds is refused (an exclusive lock,
`archsweep.core.train.runs.rundir`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from archsweep.core.model.checkpoint import CKPT_DIR
from archsweep.core.train.monitoring.console import set_job
from archsweep.core.train.runs.results import RESULTS, Results, paused_beyond
from archsweep.core.train.runs.rundir import (
    DirectoryInUse,
    DirectoryLock,
    is_worker_process,
    setting_of,
    writable_directory,
)
from archsweep.core.train.runs.runinfo import is_setting, override_key

log = logging.getLogger("train")
SUMMARY = "summary.jsonl"
FINISHED = ("completed", "diverged")  # outcomes a re-run keeps; a failed or interrupted cell runs again
ENDED = (*FINISHED, "paused")  # no failure at the sweep's end (a paused job is continued by a later pause_at)
LAUNCH_ENV = "ARCHSWEEP_SWEEP_LAUNCH"  # an id of this launch of the sweep, set by SweepSummary in the launching
# process before any job starts; jobs in other processes (joblib, submitit) inherit it with the environment


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
    run of the same config or one paused at or beyond the config's pause_at, ("resume", results) for an
    interrupted, failed or paused one with a last checkpoint (results None where none read). A run of a different
    config raises ValueError (the caller must not touch it)."""
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
    if results and (results.get("status") in FINISHED or paused_beyond(results, config.get("pause_at"))):
        return "finished", results
    return ("resume", results) if (run_dir / CKPT_DIR / "last.ckpt").is_file() else ("new", None)


def append_summary(info: Any, results: dict[str, Any], skipped: bool = False) -> None:
    line = {"job": info.job_num, "name": info.name, "status": results.get("status"), "error": results.get("error"),
            "run_dir": str(info.run_dir), "overrides": info.overrides, "skipped": skipped,
            "task_family": results.get("task_family"), "launch": os.environ.get(LAUNCH_ENV),
            "val": results.get("val"), "test": results.get("test")}
    with open(Path(info.sweep_dir) / SUMMARY, "a") as f:  # one short append per job
        f.write(json.dumps(line) + "\n")


def read_summary(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The latest line of each job (a re-run sweep appends again for the jobs it ran or skipped)."""
    path = Path(sweep_dir) / SUMMARY
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return list({row["run_dir"]: row for row in lines}.values())


def error_key(row: dict[str, Any]) -> str:
    """A failed row's error with its own job directory written as `<job dir>`: jobs that failed alike match."""
    error, run_dir = row.get("error") or "", row.get("run_dir")
    return error.replace(str(run_dir), "<job dir>") if run_dir else error


def failure_line(info: Any, error: str) -> str:
    """What a failed job prints (before it appends its own summary line): the error in full, or, when a job of
    this launch has printed the same error already, a short line naming that job."""
    details = Path(info.run_dir) / "error.txt"
    launch, key = os.environ.get(LAUNCH_ENV), error_key({"error": error, "run_dir": str(info.run_dir)})
    path = Path(info.sweep_dir) / SUMMARY
    try:  # in the order written: the first line of this launch with this error is the job that printed it
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if launch and path.is_file() else []
    except (OSError, ValueError):  # a line another process is writing: print the error in full
        rows = []
    earlier = [r["job"] for r in rows if r.get("launch") == launch and r.get("status") == "failed"
               and r.get("run_dir") != str(info.run_dir) and error_key(r) == key]
    if not earlier:
        return f"failed: {error} (details: {details})"
    return (f"failed with the error job {earlier[0]} printed (details: {details}); the sweep's end lists each "
            f"error once")


def job_ranges(jobs: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    spans: list[list[int]] = []
    for job in sorted(jobs):
        if spans and job == spans[-1][1] + 1:
            spans[-1][1] = job
        else:
            spans.append([job, job])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def distinct_errors(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Failed rows grouped by their error (`error_key`), in the order of their first job."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["job"] if r["job"] is not None else -1):
        if row.get("error"):
            groups.setdefault(error_key(row), []).append(row)
    return groups


def format_errors(rows: list[dict[str, Any]]) -> str:
    """Each distinct error of the sweep once: `error K (N of M jobs: <jobs>)`, where the jobs' results.json hold
    it, and the error (with `<job dir>` for each job's own directory when it names it)."""
    out = []
    for k, (key, group) in enumerate(distinct_errors(rows).items(), 1):
        jobs = [r["job"] for r in group if r["job"] is not None]
        first = Path(group[0]["run_dir"])
        if (first / RESULTS).is_file():
            where = (f"in the results.json of {'each' if len(group) > 1 else 'the'} job "
                     f"(e.g. {first / RESULTS}; details in error.txt beside it)")
        else:  # a job refused because its directory holds another run records nothing there
            where = "in summary.jsonl only (the job directories were left untouched)"
        error = group[0]["error"] if len(group) == 1 else key
        out.append(f"error {k} ({len(group)} of {len(rows)} jobs: {job_ranges(jobs)}), {where}:\n  {error}")
    return "\n".join(out)


# The sweep table's figures per task family (results.json's task_family): (header, split, key). Every exact match
# says how it was measured; a language model shows loss, perplexity and bits per byte instead.
COLUMNS = {
    "lm": [("val loss", "val", "loss"), ("val ppl", "val", "ppl"), ("val bpb", "val", "bpb"),
           ("test ppl", "test", "ppl"), ("test bpb", "test", "bpb")],
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
    labels = {key: f"error {k}" for k, key in enumerate(distinct_errors(rows), 1)}
    families = list(dict.fromkeys(r.get("task_family") or "synthetic" for r in rows if r.get("val")))
    families = families or ["synthetic"]
    tables = []
    for i, name in enumerate(families):
        last = i == len(families) - 1
        members = [r for r in rows if ((r.get("task_family") or "synthetic") == name and r.get("val"))
                   or (last and not r.get("val"))]
        tables.append(family_table(members, name, labels))
    return "\n\n".join(tables)


def family_table(rows: list[dict[str, Any]], name: str, labels: dict[str, str]) -> str:
    """The rows' table; a failed row names its error by label (`labels`: error_key -> "error K")."""

    def num(r: dict[str, Any], split: str, key: str) -> Any:
        value = (r.get(split) or {}).get(key)
        return f"{value:.4f}" if isinstance(value, (int, float)) else "-"

    columns = [c for c in COLUMNS[name] if any(num(r, c[1], c[2]) != "-" for r in rows)] or COLUMNS[name][:1]
    lines = [f"{'job':>4}  {'status':<9}  " + "  ".join(f"{c[0]:>{max(len(c[0]), 6)}}" for c in columns)
             + "  name / error"]
    for r in rows:
        tail = f"{r['name']}: {labels[error_key(r)]}" if r.get("error") else r["name"]
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
        os.environ[LAUNCH_ENV] = secrets.token_hex(4)  # before any job starts, so every job's process has it
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
        failed = [r for r in rows if r["status"] not in ENDED]
        paused = sum(r["status"] == "paused" for r in rows)
        log.info(f"sweep {sweep_dir}: {len(rows) - len(failed) - paused} of {len(rows)} jobs completed"
                 + (f", {paused} paused" if paused else "") + "\n" + format_table(rows))
        errors = format_errors(rows)
        if errors:
            log.info(errors)
        if failed:
            distinct = len(distinct_errors(rows))
            listed = f" ({distinct} distinct error(s), listed above)" if distinct else ""
            raise SystemExit(f"error: {len(failed)} of {len(rows)} sweep jobs failed{listed}; see "
                             f"{sweep_dir / SUMMARY} and error.txt in each failed job's directory")
