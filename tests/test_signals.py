"""A stop signal is never lost (real train.py processes): SIGTERM or SIGINT at each moment of a run (training,
a validation, the decoding of examples after one, the final evaluation's validation, decoding and test, and the gap
between two jobs of a sweep) ends the process within seconds with 128 + the signal's number, the run recorded
`interrupted`; a sweep launches no further job; an interrupted run resumes to completion.

A pause callback (or, between jobs, a Hydra callback) writes a marker at the chosen moment and waits there until
the process has received the signal, so each moment is hit exactly, however fast the machine."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from test_run_safety import LONG, QUICK, finish, launch, results, train

pytestmark = pytest.mark.slow  # train.py subprocesses
PAUSE = '''
import os
import time

import lightning as L
from hydra.experimental.callback import Callback as HydraCallback

from archsweep.core.train.lifecycle.stops import STOPS

MARKER = os.environ["ARCHSWEEP_TEST_MARKER"]


def wait_for_the_signal(moment):
    """Tell the test where the run is, then wait until the process has noted a stop signal (at most 60 s): a
    handler that stops at once raises inside the sleep; one that notes it lets the run go on from here."""
    with open(MARKER, "a") as f:
        f.write(moment + "\\n")
    deadline = time.time() + 60
    while STOPS.signum is None and time.time() < deadline:
        time.sleep(0.02)


class Pause(L.Callback):
    """Pauses once at `at`: train_step (after a training step), validation (a validation batch during the fit),
    decoding (the end of a validation during the fit, where examples are decoded), final_validation,
    final_decoding (the same in the final evaluation) or final_test (a batch of the test split)."""

    def __init__(self, at: str) -> None:
        self.at, self.done = at, False

    def pause(self, moment, trainer):
        in_fit = trainer.state.fn == "fit"
        if not self.done and moment == self.at and (in_fit != moment.startswith("final")):
            if moment != "train_step" or trainer.global_step >= 6:
                self.done = True
                wait_for_the_signal(moment)

    def on_train_batch_end(self, trainer, *args, **kwargs):
        self.pause("train_step", trainer)

    def on_validation_batch_end(self, trainer, *args, **kwargs):
        if not trainer.sanity_checking:
            self.pause("validation" if trainer.state.fn == "fit" else "final_validation", trainer)

    def on_validation_epoch_end(self, trainer, *args, **kwargs):
        if not trainer.sanity_checking:
            self.pause("decoding" if trainer.state.fn == "fit" else "final_decoding", trainer)

    def on_test_batch_end(self, trainer, *args, **kwargs):
        self.pause("final_test", trainer)


class BetweenJobs(HydraCallback):
    """After the sweep's first job has returned, before the next starts."""

    def on_job_end(self, config, job_return, **kwargs):
        if config.hydra.job.num == 0:
            wait_for_the_signal("between_jobs")
'''


def signal_at(proc, marker: Path, moment: str, signum: int, timeout: float = 180) -> float:
    """Send `signum` once the run has reached `moment`; the time it was sent."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if marker.is_file() and moment in marker.read_text().split():
            proc.send_signal(signum)
            return time.time()
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {moment}:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"the run never reached {moment}")


def start(tmp_path: Path, *args: str):
    (tmp_path / "pause.py").write_text(PAUSE)
    marker = tmp_path / "marker.txt"
    import os

    os.environ["ARCHSWEEP_TEST_MARKER"] = str(marker)  # launch() copies os.environ into the run's
    try:
        return launch(tmp_path, *args), marker
    finally:
        del os.environ["ARCHSWEEP_TEST_MARKER"]


MOMENTS = ["train_step", "validation", "decoding", "final_validation", "final_decoding", "final_test"]
SIGNALS = {"train_step": signal.SIGINT, "final_decoding": signal.SIGINT}  # the others: SIGTERM


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_signal_at_any_moment_of_a_run_stops_it_within_seconds_as_interrupted(tmp_path, moment):
    signum = SIGNALS.get(moment, signal.SIGTERM)
    run_dir = tmp_path / "run"
    proc, marker = start(tmp_path, *LONG, "eval.decode_samples=8", f"hydra.run.dir={run_dir}",
                         "+callbacks.pause._target_=pause.Pause", f"+callbacks.pause.at={moment}")
    sent = signal_at(proc, marker, moment, signum)
    code, out = finish(proc)
    took = time.time() - sent
    assert code == 128 + signum, out[-3000:]
    assert took < 10, f"stopped {took:.1f} s after the signal"
    res = results(run_dir)
    assert res["status"] == "interrupted" and res["interrupted"]["signal"] == signal.Signals(signum).name, res
    assert res["interrupted"]["exit_code"] == 128 + signum
    checkpoint = Path(res["last_checkpoint"])
    assert checkpoint.is_file()
    if moment.startswith("final"):  # the training had finished: its last step is kept
        assert res["steps"] == 40
    if moment == "final_decoding":  # the resumed run evaluates and completes
        code, out = train(tmp_path, *LONG, "eval.decode_samples=8", f"hydra.run.dir={run_dir}",
                          f"ckpt_path={run_dir}")
        assert code == 0, out[-3000:]
        res = results(run_dir)
        assert res["status"] == "completed" and res["steps"] == 40 and "loss" in res["test"], res


def test_a_signal_between_the_jobs_of_a_sweep_stops_it_before_the_next_job_which_a_rerun_completes(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *QUICK, "seed=0,1,2", f"hydra.sweep.dir={sweep}", "+hydra.callbacks.pause._target_=pause.BetweenJobs"]
    proc, marker = start(tmp_path, *args)
    sent = signal_at(proc, marker, "between_jobs", signal.SIGTERM)
    code, out = finish(proc)
    took = time.time() - sent
    assert code == 143, out[-3000:]
    assert took < 10, f"stopped {took:.1f} s after the signal"
    assert results(sweep / "0")["status"] == "completed"
    stopped = results(sweep / "1")
    assert stopped["status"] == "interrupted" and stopped["steps"] == 0
    assert stopped["interrupted"]["signal"] == "SIGTERM"
    assert not (sweep / "2").exists()  # no job launched after the signal
    summary = [json.loads(line) for line in (sweep / "summary.jsonl").read_text().splitlines()]
    assert [s["status"] for s in summary] == ["completed", "interrupted"]
    code, out = train(tmp_path, "-m", *QUICK, "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    assert code == 0, out[-3000:]
    assert [results(sweep / str(i))["status"] for i in range(3)] == ["completed"] * 3
