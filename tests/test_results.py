"""results.json has one schema (archsweep.core.train.runs.results.Results, with a version): training writes it, the
report wing reads it, and files written before the schema had a version still read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from archsweep.core.report import compare
from archsweep.core.train.runs.results import VERSION, Results

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pre_rename" / "results.json"


def completed(**over) -> Results:
    fields = dict(status="completed", name="norm=pre", choices={"norm": "pre", "task": "reverse"},
                  overrides=["norm=pre", "seed=1"], seed=1, params=1234, steps=20, task_family="synthetic",
                  train={"loss": 1.5, "loss_spikes": 0.0},
                  splits={"val": {"loss": 2.0, "acc": 0.5}, "test": {"loss": 2.5}, "test_long": {"exact_match": 0.25}},
                  by_context={"ppl_ratio": 1.25}, tokens_per_s=1000.0, world_size=1)
    return Results(**{**fields, **over})


def test_the_file_holds_every_field_with_the_splits_at_the_top_level(tmp_path):
    results = completed()
    results.write(tmp_path / "results.json")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["version"] == VERSION and data["status"] == "completed"
    assert data["val"] == {"loss": 2.0, "acc": 0.5} and data["test_long"] == {"exact_match": 0.25}
    assert "splits" not in data and data["interrupted"] is None  # one key set, whatever the status
    assert set(completed(status="failed", splits={}).to_dict()) | {"val", "test", "test_long"} == set(data)
    assert Results.read(tmp_path / "results.json") == results
    assert not list(tmp_path.glob("*.tmp"))


def test_figures_are_found_by_key():
    results = completed()
    assert results.value("val/loss") == 2.0 and results.value("test_long/exact_match") == 0.25
    assert results.value("train/loss") == 1.5 and results.value("by_context/ppl_ratio") == 1.25
    assert results.value("tokens_per_s") == 1000.0 and results.value("params") == 1234
    assert results.value("val/bleu") is None and results.value("nothing") is None and results.value("val") is None


def test_a_file_from_before_the_schema_had_a_version_reads():
    results = Results.read(FIXTURE)
    raw = json.loads(FIXTURE.read_text())
    assert "version" not in raw and results.version == 1
    assert results.status == "completed" and set(results.splits) == {"val", "test", "test_long"}
    assert results.value("test/exact_match") == raw["test"]["exact_match"]
    assert results.task_family is None and results.interrupted is None  # fields it predates
    assert {k: v for k, v in results.to_dict().items() if k in raw} == raw  # nothing it held is lost


def test_a_version_2_file_from_before_the_peak_fields_reads():
    data = {k: v for k, v in completed(mfu=0.44, peak_flops=26.6e9).to_dict().items()
            if k not in ("peak_source", "peak_age_s", "mfu_estimate")}
    results = Results.from_dict(data)
    assert results.mfu == 0.44 and results.value("mfu") == 0.44 and results.peak_flops == 26.6e9
    assert results.peak_source is None and results.peak_age_s is None and results.mfu_estimate is None


def test_the_report_reads_a_run_of_each_version(tmp_path):
    old, new = tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"
    old.mkdir(parents=True)
    shutil.copy(FIXTURE, old / "results.json")
    new.mkdir()
    fixture = Results.read(FIXTURE)
    now = completed(overrides=fixture.overrides + ["seed=1"], choices=fixture.choices, seed=1)
    now.write(new / "results.json")
    report = compare([tmp_path / "sweep"])
    assert not report.skipped
    runs = [r for c in report.cells for r in c.runs]
    assert sorted(r.results.version for r in runs) == [1, VERSION]


@pytest.mark.parametrize("content, message", [
    ({"status": "finished"}, r"status='finished', expected one of completed, failed, diverged, interrupted"),
    ({"status": "completed", "version": VERSION + 1}, rf"version={VERSION + 1}: written by a newer archsweep"),
    ({"status": "completed", "choices": [1]}, r"'choices' is a list, expected an object"),
    ({"status": "completed", "test": 3}, r"'test' is a int, expected an object"),
    ([1, 2], r"expected a JSON object, found list"),
])
def test_a_bad_file_is_refused_saying_why(content, message):
    with pytest.raises(ValueError, match=message):
        Results.from_dict(content)
