"""Sweep bookkeeping: every job appends its outcome to <sweep dir>/summary.jsonl; when the sweep ends, a table
of all jobs is printed, and the process exits non-zero if any job failed (after all of them ran)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("train")
SUMMARY = "summary.jsonl"


def append_summary(info: Any, results: dict[str, Any]) -> None:
    line = {"job": info.job_num, "name": info.name, "status": results.get("status"), "error": results.get("error"),
            "run_dir": str(info.run_dir), "overrides": info.overrides,
            "val": results.get("val"), "test": results.get("test")}
    with open(Path(info.sweep_dir) / SUMMARY, "a") as f:  # one short append per job
        f.write(json.dumps(line) + "\n")


def read_summary(sweep_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(sweep_dir) / SUMMARY
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'job':>4}  {'status':<9}  {'val loss':>9}  {'val exact':>9}  {'test exact':>10}  name / error"]
    for r in sorted(rows, key=lambda r: r["job"] if r["job"] is not None else -1):
        val, test = r.get("val") or {}, r.get("test") or {}

        def num(d: dict[str, Any], k: str) -> str:
            return f"{d[k]:.4f}" if isinstance(d.get(k), (int, float)) else "-"

        tail = r["name"] if r["status"] == "completed" else f"{r['name']}: {r['error']}"
        lines.append(f"{r['job']:>4}  {r['status']:<9}  {num(val, 'loss'):>9}  {num(val, 'exact_match'):>9}  "
                     f"{num(test, 'exact_match'):>10}  {tail}")
    return "\n".join(lines)


class SweepSummary(Callback):
    """Hydra callback (conf/train.yaml: hydra.callbacks)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = read_summary(sweep_dir)
        if not rows:
            return
        failed = [r for r in rows if r["status"] != "completed"]
        log.info(f"sweep {sweep_dir}: {len(rows) - len(failed)} of {len(rows)} jobs completed\n"
                 + format_table(rows))
        if failed:
            raise SystemExit(f"error: {len(failed)} of {len(rows)} sweep jobs failed; see {sweep_dir / SUMMARY} "
                             f"and error.txt in each failed job's directory")
