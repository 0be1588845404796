"""compare.py's width transfer (`compare.transfer`, core/report/transfer.py): per param, each width's best learning
rate against the smallest width's, the drift in grid steps and the loss paid at the transferred rate, on a sweep
with planted losses."""

from __future__ import annotations

import json
import math

import pytest
from test_compare import done, write_run

from archsweep.core.report import CompareError, compare, terminal, write

RATES = ["0.0005", "0.001", "0.002", "0.004", "0.008"]
WIDTHS = [64, 128, 256, 512]
BEST = {"sp": {64: 3, 128: 2, 256: 1, 512: 0}, "mup": {64: 3, 128: 3, 256: 3, 512: 4}}  # index into RATES


def planted(param: str, width: int, rate: int) -> float:
    """A bowl in log2(rate) around each cell's planted best, lower the wider the model."""
    return 2.0 - 0.1 * math.log2(width / 64) + 0.05 * (rate - BEST[param][width]) ** 2


@pytest.fixture
def sweep(tmp_path):
    n = 0
    for param in BEST:
        for width in WIDTHS:
            for i, rate in enumerate(RATES):
                loss = planted(param, width, i)
                write_run(tmp_path / str(n), [f"param={param}", f"model.d_model={width}", f"optim.lr={rate}"],
                          done(loss, 0.0, 0.0))
                n += 1
    return tmp_path


def test_each_width_gets_its_best_rate_its_drift_and_the_loss_at_the_transferred_rate(sweep):
    report = compare([sweep], tune=["optim.lr"], transfer="model.d_model", target="none")
    rows = {(r.group, int(r.width)): r for r in report.transfer}
    assert len(rows) == 8
    for param, best in BEST.items():
        for width, index in best.items():
            row = rows[(f"param={param}", width)]
            assert row.transferred == RATES[3] and row.best == RATES[index]
            assert row.drift == index - 3
            assert row.at_best == pytest.approx(planted(param, width, index))
            assert row.gap == pytest.approx(0.05 * (3 - index) ** 2)
    text = terminal(report)
    assert "Width transfer" in text
    assert "param=sp: largest drift 3 grid steps, largest gap +0.4500" in text
    assert "param=mup: largest drift 1 grid steps, largest gap +0.0500" in text


def test_the_transfer_is_written_to_the_json_and_markdown(sweep, tmp_path):
    report = compare([sweep], tune=["optim.lr"], transfer="model.d_model", target="none", out=tmp_path / "out")
    write(report, plots=False)
    data = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert data["transfer"]["key"] == "model.d_model" and len(data["transfer"]["rows"]) == 8
    assert "## Width transfer" in (tmp_path / "out" / "comparison.md").read_text()


def test_transfer_needs_a_tuned_key_and_a_width_key_the_cells_vary(sweep):
    with pytest.raises(CompareError, match="nothing is tuned"):
        compare([sweep], tune=[], transfer="model.d_model", target="none")
    with pytest.raises(CompareError, match="--transfer model.n_layers: not a key the cells vary"):
        compare([sweep], tune=["optim.lr"], transfer="model.n_layers", target="none")


@pytest.mark.parametrize("param,says", [
    ("mup", "param=mup: one learning rate serves every width here, the rate tuned at the base width"),
    ("sp", "param=sp with one learning rate at every width: under a parametrisation that does not transfer"),
])
def test_a_ladder_at_one_rate_says_whether_the_rate_transfers(tmp_path, param, says):
    """experiment=scaling param=mup: the widths share the rate tuned at the base width, and compare.py says so."""
    for i, width in enumerate(WIDTHS):
        write_run(tmp_path / str(i), [f"param={param}", f"model.d_model={width}"], done(2.0 - i / 10, 0.0, 0.0))
    report = compare([tmp_path], target="none")
    assert any(note.startswith(says) for note in report.notes), report.notes
