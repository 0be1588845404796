"""What train.py prints: a default run's console has no line twice, at most 3 lines from W&B and none of the
libraries' tips, says in plain words the speed behind MFU and gives an ETA; sweep jobs name themselves on every
line; the final summary shows the metrics that fit the task; short runs still validate several times."""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import scripts

from archsweep.core.train.monitoring.console import ConsoleFormatter, DropNoise, OneVoice, job_prefix, set_job
from archsweep.core.train.monitoring.summary import family, metric_parts
from archsweep.core.train.runs.sweep import format_table

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=20",
        "trainer.log_every_n_steps=5", "schedule.warmup_steps=5"]


@pytest.mark.slow
def test_default_run_console_has_no_duplicate_and_at_most_three_wandb_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}  # W&B as a user meets it
    env["WANDB_MODE"] = "offline"
    out = scripts.run([sys.executable, "train.py", *TINY, f"hydra.run.dir={tmp_path / 'run'}",
                          f"output_root={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    bodies = [line.split(" ", 1)[1] if line[:2].isdigit() else line for line in lines]  # without the time stamp
    twice = [line for line, n in Counter(bodies).items() if n > 1]
    assert not twice, "\n".join(lines)
    wandb = [line for line in lines if "wandb" in line.lower() or "W&B" in line]
    assert 1 <= len(wandb) <= 3, "\n".join(wandb)
    for noise in ("Tip:", "anonymous", "TPU available", "LeafSpec", "Warning:"):
        assert not any(noise in line for line in lines), noise
    (peak,) = [line for line in lines if "train/mfu" in line]  # what was measured, the figure, what MFU means
    assert "speed test: this CPU multiplies matrices at " in peak and " GFLOP/s (measured " in peak, peak
    assert peak.endswith("train/mfu in the logs is the share of that speed training reaches (an estimate)"), peak
    steps = [line for line in lines if " | eta " in line]
    assert len(steps) == 4 and steps[-1].endswith("eta 0s"), "\n".join(steps)  # 20 steps, logged every 5
    validations = [line for line in lines if "validation at step" in line]
    assert len(validations) >= 4 and "validation at step 20" in validations[-1]  # 20 steps < val_check_interval
    assert "teacher-forced exact match" in validations[-1]
    assert "done in" in lines[-1] and "(decoded)" in lines[-1] and "(teacher-forced)" in lines[-1]
    assert len(lines) < 100, "\n".join(lines)  # 5 validations, each with 3 decoded examples


def record(msg: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("train", level, __file__, 1, msg, None, None)


def test_sweep_jobs_prefix_every_line_with_their_number_and_cell():
    formatter = ConsoleFormatter()
    try:
        set_job(job_prefix(3, "norm=pre seed=1"))
        text = formatter.format(record("step 10/20 | loss 1.0\n  #0 src: a"))
        first, second = text.splitlines()
        assert first.split(" ", 1)[1] == "[job 3 norm=pre seed=1] step 10/20 | loss 1.0"
        assert second == "[job 3 norm=pre seed=1]   #0 src: a"
        set_job(job_prefix(0, "defaults"))
        assert formatter.format(record("x", logging.WARNING)).endswith("[job 0] warning: x")
    finally:
        set_job(None)
    assert formatter.format(record("step 1")).split(" ", 1)[1] == "step 1"


def test_library_noise_is_dropped():
    keep = DropNoise()
    assert not keep.filter(record("💡 Tip: For seamless cloud logging ..."))
    assert not keep.filter(record("TPU available: False, using: 0 TPU cores"))
    assert not keep.filter(record("`weights_only` was not set, defaulting to `False`."))
    assert not keep.filter(record("`Trainer.fit` stopped: `max_steps=20` reached."))
    assert keep.filter(record("`Trainer.fit` stopped: `max_epochs=1` reached."))  # fewer steps than asked for
    assert keep.filter(record("GPU available: False, used: False"))


def test_other_ranks_print_only_their_errors_naming_the_rank(monkeypatch):
    from lightning.pytorch.utilities import rank_zero_only

    voice, formatter = OneVoice(), ConsoleFormatter()
    step, error = record("step 90/400 | loss 1.0"), record("RuntimeError: gloo broke", logging.ERROR)
    warning = record("schedule.warmup_steps=200 exceeds trainer.max_steps=12", logging.WARNING)
    assert voice.filter(step) and voice.filter(warning) and voice.filter(error)  # rank 0: every line
    assert formatter.format(error).split(" ", 1)[1] == "error: RuntimeError: gloo broke"
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # what Lightning's strategy sets in the process of rank 1
    assert not voice.filter(step) and not voice.filter(warning)
    assert voice.filter(error)
    assert formatter.format(error).split(" ", 1)[1] == "[rank 1] error: RuntimeError: gloo broke"
    try:
        set_job(job_prefix(2, "norm=pre"))
        assert formatter.format(error).split(" ", 1)[1] == "[job 2 norm=pre] [rank 1] error: RuntimeError: gloo broke"
    finally:
        set_job(None)


def test_lightnings_sync_dist_advice_stays_off_the_console():
    """A captured warning (logging.captureWarnings: the text is an argument of the record)."""
    advice = ("lightning/pytorch/trainer/connectors/logger_connector/result.py:433: It is recommended to use "
              "`self.log('val/loss', ..., sync_dist=True)` when logging on epoch level in distributed setting to "
              "accumulate the metric across devices.\n")
    captured = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "%s", (advice,), None)
    assert not OneVoice().filter(captured)
    assert DropNoise().filter(captured)  # kept for the log file


# the summary per task family, from the metrics results.json holds
def test_language_model_summary_shows_loss_perplexity_and_bits_per_byte_and_no_exact_match():
    val = {"loss": 1.6094, "ppl": 5.0, "exact_match": 0.0, "bpb": 2.3219}
    test = {"loss": 1.3863, "ppl": 4.0, "exact_match": 0.0, "bpb": 2.0}
    line = ", ".join(metric_parts("lm", val, test))
    assert line == ("test loss 1.3863, test perplexity 4.000, test bits per byte 2.000, "
                    "val loss 1.6094, val perplexity 5.000, val bits per byte 2.322")
    assert "exact" not in line


def test_a_language_model_without_bpb_gets_no_bits_line():
    """A masked language model (its loss covers only the masked tokens) logs no bpb; nor did runs written before
    bpb existed, whose approximate bits_per_char / bits_per_byte are not shown."""
    val, test = {"loss": 2.0, "ppl": 7.389, "bits_per_char": 2.9}, {"loss": 2.1, "ppl": 8.166}
    line = ", ".join(metric_parts("lm", val, test))
    assert line == "test loss 2.1000, test perplexity 8.166, val loss 2.0000, val perplexity 7.389"


def test_translation_summary_shows_bleu():
    line = ", ".join(metric_parts("translation", {"bleu": 21.5, "ppl": 9.0, "exact_match": 0.0}, {"ppl": 9.5}))
    assert "val BLEU 21.50 (decoded)" in line and "exact match" not in line


def test_synthetic_summary_names_decoded_and_teacher_forced_exact_match_apart():
    line = ", ".join(metric_parts("synthetic", {"decoded_exact_match": 0.5, "exact_match": 0.7},
                                  {"exact_match": 0.75, "acc": 0.9}))
    assert "val exact match 0.5000 (decoded)" in line and "test exact match 0.7500 (teacher-forced)" in line
    assert "test token accuracy 0.9000" in line


def test_classification_summary_shows_accuracy():
    line = ", ".join(metric_parts("classification", {"acc": 0.9}, {"acc": 0.95, "top5_acc": 1.0}))
    assert "test accuracy 0.9500" in line and "top-5" in line and "exact match" not in line


# What each family's summary must name, and what it must not (a language model's exact match says nothing).
SHOWN = {"lm": (("test loss", "test perplexity", "test bits per byte", "val perplexity"), ("exact match",)),
         "translation": (("val BLEU", "test perplexity"), ("exact match",)),
         "classification": (("test accuracy", "val accuracy"), ("exact match", "perplexity")),
         "synthetic": (("test exact match", "test token accuracy"), ("perplexity", "bits per byte"))}


def task_classes() -> dict[str, type]:
    """{conf/task option: the class its `_target_` names}: every task a user can choose."""
    import importlib

    from omegaconf import OmegaConf

    classes = {}
    for path in sorted((ROOT / "conf" / "task").glob("*.yaml")):
        module, _, name = OmegaConf.load(path)["_target_"].rpartition(".")
        classes[path.stem] = getattr(importlib.import_module(module), name)
    return classes


@pytest.mark.parametrize("option", sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml")))
def test_every_task_declares_its_family_and_its_summary_shows_that_familys_metrics(option):
    """By what the task declares, not by its class: `tokens` (a TokensTask, no TextTask) is a language model."""
    from archsweep.core.train.monitoring.summary import summary_line

    cls = task_classes()[option]
    task = cls.__new__(cls)  # the declaration is the class's: no data needed to read it
    results = {"val": {"loss": 1.5, "ppl": 4.48, "bpb": 1.2, "acc": 0.6, "exact_match": 0.25, "bleu": 12.0,
                       "decoded_exact_match": 0.2},
               "test": {"loss": 1.6, "ppl": 4.95, "bpb": 1.3, "acc": 0.55, "exact_match": 0.2},
               "wall_time_s": 10.0, "tokens_per_s": 1000.0}
    line = summary_line(task, results, "results.json")
    shown, hidden = SHOWN[family(task)]
    assert all(name in line for name in shown), (option, line)
    assert not any(name in line for name in hidden), (option, line)
    expected = {"tokens": "lm", "text": "lm", "shakespeare_char": "lm", "translation": "translation",
                "multi30k": "translation", "digits": "classification", "images": "classification",
                "is_sorted": "classification"}.get(option, "synthetic")
    assert family(task) == expected
    assert line.endswith("images/s; results in results.json") == (expected == "classification" and
                                                                  option != "is_sorted")


def test_a_task_without_a_family_or_with_an_unknown_one_is_refused_by_name():
    from archsweep.core.data.tasks.base import Task

    class Undeclared(Task):
        pass

    with pytest.raises(ValueError, match="Undeclared declares no family"):
        family(Undeclared())
    with pytest.raises(TypeError, match="Misnamed declares family='language_model'"):
        type("Misnamed", (Task,), {"family": "language_model"})


def test_short_runs_validate_several_times_ending_at_the_last_step():
    from archsweep.core.train.lifecycle.trainer import validation_every

    assert validation_every(3000, 500) == 500
    assert validation_every(20, 500) == 5 and validation_every(300, 500) == 75 and validation_every(7, 500) == 1
    assert validation_every(4637, 10**6) == 580  # prime: 8 evenly spaced validations, not 4,637
    for steps in range(1, 5000):
        every = validation_every(steps, 10**6)
        count = steps // every
        assert count <= 20 and (count >= 4 or every == 1)
        assert steps % every == 0 or 4 <= count <= 8



@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_final_step_is_validated_when_the_interval_does_not_divide_the_run(tmp_path, accumulate):
    import lightning as L
    import torch

    from archsweep.core.train.monitoring.callbacks import ValidateAtEnd

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.validated: list[int] = []

        def training_step(self, batch, batch_idx):
            return self.layer(batch).square().mean()

        def validation_step(self, batch, batch_idx):
            if batch_idx == 0:
                self.validated.append(self.trainer.global_step)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.randn(400, 2), batch_size=4)
    tiny = Tiny()
    L.Trainer(max_steps=23, val_check_interval=10 * accumulate, check_val_every_n_epoch=None,
              accumulate_grad_batches=accumulate, callbacks=[ValidateAtEnd()], logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              num_sanity_val_steps=0, default_root_dir=tmp_path).fit(tiny, data, data)
    assert tiny.validated == [10, 20, 23]  # without ValidateAtEnd: [10, 20], steps 21-23 never validated

# the sweep-end table
def sweep_row(job, family, val, test, status="completed", error=None):
    return {"job": job, "name": f"seed={job}", "status": status, "error": error, "run_dir": f"runs/{job}",
            "skipped": False, "task_family": family, "val": val, "test": test}


def test_the_sweep_table_says_which_exact_match_each_column_is():
    rows = [sweep_row(0, "synthetic", {"loss": 0.9, "exact_match": 0.2559, "decoded_exact_match": 0.375},
                      {"exact_match": 0.25}),
            sweep_row(1, None, None, None, status="failed", error="ValueError: boom")]
    text = format_table(rows)
    header, first, failed = text.splitlines()
    assert "val exact (decoded)" in header and "val exact (teacher-forced)" in header
    assert "test exact (teacher-forced)" in header
    assert first.split()[2:6] == ["0.9000", "0.3750", "0.2559", "0.2500"]  # in the order of the header
    assert failed.split()[:3] == ["1", "failed", "-"] and failed.endswith("seed=1: error 1")  # listed once below
    undecoded = format_table([sweep_row(0, "synthetic", {"loss": 0.9, "exact_match": 0.5}, {"exact_match": 0.4})])
    assert "decoded" not in undecoded and "val exact (teacher-forced)" in undecoded


def test_language_model_sweep_rows_show_loss_perplexity_and_bits_per_byte_and_no_exact_match():
    lm = {"loss": 1.5, "ppl": 4.4817, "acc": 0.5, "exact_match": 0.0, "bpb": 2.1}
    text = format_table([sweep_row(0, "lm", lm, {**lm, "bpb": 2.2})])
    header, row = text.splitlines()
    assert "exact" not in header and "acc" not in header
    assert [c for c in ("val loss", "val ppl", "val bpb", "test ppl", "test bpb") if c in header] == \
        ["val loss", "val ppl", "val bpb", "test ppl", "test bpb"]
    assert row.split()[2:7] == ["1.5000", "4.4817", "2.1000", "4.4817", "2.2000"]


def test_a_sweep_over_task_families_prints_one_table_each():
    rows = [sweep_row(0, "synthetic", {"loss": 0.9, "exact_match": 0.5}, {"exact_match": 0.4}),
            sweep_row(1, "lm", {"loss": 1.5, "ppl": 4.5, "bpb": 1.1}, {"ppl": 4.6, "bpb": 1.2})]
    first, second = format_table(rows).split("\n\n")
    assert "exact (teacher-forced)" in first and "seed=0" in first and "seed=1" not in first
    assert "val bpb" in second and "exact" not in second and "seed=1" in second
