"""<run dir>/metrics.csv, written by a small Lightning logger of our own: Lightning's CSVLogger replaces the file
when it starts, and a resumed run must keep the history it continues."""

from __future__ import annotations

import csv
import os
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only


class MetricsCSV(Logger):
    """<run_dir>/metrics.csv: one row per logged step (`step`, `epoch` and the metrics logged at it), the columns
    sorted and the header rewritten when a new metric appears. Rows are written at every `save` (Lightning calls it
    after each logging step), so the file is readable during training. With `keep_before` (a run resumed in its
    own directory from the checkpoint of that step), the rows logged before that step are kept and the new ones
    appended; later rows, which the resumed run logs again, are dropped, so no step appears twice. Without it, a
    new file replaces any earlier one."""

    FILE = "metrics.csv"

    def __init__(self, run_dir: str | Path, keep_before: int | None = None) -> None:
        super().__init__()
        self.path = Path(run_dir) / self.FILE
        self.rows: list[dict[str, Any]] = []  # every row of the file, the kept history first
        self.columns: list[str] = []
        self.written = 0  # rows already in the file
        self.kept = False  # the file holds rows a resumed run drops: the first save rewrites it whole
        if keep_before is not None and self.path.is_file():
            self.kept = True
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns = sorted(reader.fieldnames or [])
                self.rows = [r for r in reader if r.get("step", "").isdigit() and int(r["step"]) < keep_before]

    @property
    def name(self) -> str:
        return "csv"

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return str(self.path.parent)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        save_hparams_to_yaml(self.path.parent / "hparams.yaml", vars(params) if isinstance(params, Namespace)
                             else params)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        row = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        row["step"] = len(self.rows) if step is None else step
        self.rows.append(row)

    @rank_zero_only
    def save(self) -> None:
        if not self.rows:
            return  # nothing logged yet: an earlier run's file stays until this one has a row
        columns = sorted(set(self.columns).union(*self.rows))
        rewrite = columns != self.columns or not self.path.is_file() or self.kept
        if not rewrite and self.written == len(self.rows):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if rewrite:  # the whole file (a new column, or a resumed run's kept history) goes through a temporary
            # file renamed into place: a process killed midway leaves the previous file and the temporary one,
            # which the next start in the run directory removes (rundir.clean_stale_temp)
            tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
            try:
                with open(tmp, "w", newline="") as f:
                    writer = csv.DictWriter(f, fieldnames=columns)
                    writer.writeheader()
                    writer.writerows(self.rows)
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
        else:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=columns).writerows(self.rows[self.written:])
        self.columns = columns
        self.written = len(self.rows)
        self.kept = False

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()
