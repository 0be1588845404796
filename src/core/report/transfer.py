"""Width transfer of a tuned rate (`compare.transfer`, experiment=mup_transfer): within each group of cells that
differ only in the width key (e.g. model.d_model; a group per param=sp / param=mup), the smallest width's best value
of the tuned key is the transferred one. Per width: its own best value, the drift from the transferred one in grid
steps (positions in the sorted values tried; + means a higher value is best there), and the selection metric at the
transferred value against the width's own best (the loss a user pays for not tuning again)."""

from __future__ import annotations

from dataclasses import dataclass

from archsweep.core.report.cells import Cell
from archsweep.core.report.runs import CompareError
from archsweep.core.report.tuning import order_key


@dataclass
class TransferRow:
    group: str  # the other keys' values, e.g. "param=mup"
    width: str
    best: str  # this width's best value of the tuned key
    transferred: str  # the smallest width's best value
    drift: int | None  # grid steps from transferred to best; None: the transferred value was not tried here
    at_best: float | None  # the selection metric at the width's own best value (mean over seeds)
    at_transferred: float | None  # ... at the transferred value

    @property
    def gap(self) -> float | None:
        if self.at_best is None or self.at_transferred is None:
            return None
        return self.at_transferred - self.at_best


def transfer_rows(cells: list[Cell], width_key: str, tuned: list[str]) -> list[TransferRow]:
    """The rows of the transfer table (see the module docstring), groups in first-seen order, widths ascending."""
    if len(tuned) != 1:
        raise CompareError(f"compare.transfer={width_key} reads one tuned key (e.g. optim.lr); the runs tune "
                           f"{', '.join(tuned) or 'none'}: set compare.tune=[optim.lr] or --tune optim.lr")
    key = tuned[0]
    if not cells or width_key not in cells[0].values:
        keys = ", ".join(cells[0].values) if cells else "none"
        raise CompareError(f"--transfer {width_key}: not a key the cells vary (they vary {keys})")
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        label = " ".join(f"{k}={v}" for k, v in cell.values.items() if k != width_key) or "all runs"
        groups.setdefault(label, []).append(cell)
    rows = []
    for label, members in groups.items():
        members = [c for c in members if c.tuning is not None and c.tuning.chosen is not None]
        members.sort(key=lambda c: order_key(c.values[width_key]))
        if not members:
            continue
        transferred = members[0].tuning.chosen.values[key]
        for cell in members:
            grid = cell.tuning.grids[key]
            best = cell.tuning.chosen.values[key]
            point = next((p for p in cell.tuning.points if p.values[key] == transferred), None)
            drift = grid.index(best) - grid.index(transferred) if transferred in grid else None
            rows.append(TransferRow(label, cell.values[width_key], best, transferred, drift,
                                    cell.tuning.chosen.stat.mean, point.stat.mean if point is not None else None))
    return rows


def transfer_lines(rows: list[TransferRow], width_key: str, tuned: str, metric: str) -> list[str]:
    """The table as text lines (a header line, then one per width)."""
    if not rows:
        return []
    head = (f"{'':<20}{width_key:>14}{'best ' + tuned:>18}{'drift (steps)':>15}{metric + ' at best':>20}"
            f"{'at transferred':>16}{'gap':>9}")
    out = [f"Width transfer: the best {tuned} per width against the smallest width's (transferred); drift in steps "
           f"of the grid tried, + for a higher value; gap = {metric} at the transferred value minus at the best.",
           head]
    for r in rows:
        drift = "n/a" if r.drift is None else f"{r.drift:+d}"
        gap = "-" if r.gap is None else f"{r.gap:+.4f}"
        out.append(f"{r.group:<20}{r.width:>14}{r.best:>18}{drift:>15}{_num(r.at_best):>20}"
                   f"{_num(r.at_transferred):>16}{gap:>9}")
    for group in dict.fromkeys(r.group for r in rows):
        mine = [r for r in rows if r.group == group]
        drifts = [abs(r.drift) for r in mine if r.drift is not None]
        gaps = [r.gap for r in mine if r.gap is not None]
        if drifts and gaps:
            out.append(f"{group}: largest drift {max(drifts)} grid steps, largest gap {max(gaps):+.4f} "
                       f"(transferred from {width_key}={mine[0].width}, {tuned}={mine[0].transferred})")
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
