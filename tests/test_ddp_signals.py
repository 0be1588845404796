"""A stop signal at the moments of a data-parallel run (trainer=ddp: two CPU processes over gloo) where Lightning's
own SIGTERM handler used to have it, or where the run used to note it and train on to the end, stops both processes
within seconds, the run recorded `interrupted` and the exit 128 + the signal's number.

Lightning puts its SIGTERM handler in place at the start of every fit, validation and test. On several processes
it sends the signal on to the other process and broadcasts from inside the handler; the other process, waiting in
its own next collective (a barrier, a metric's gather), never joins that broadcast, and both waited until the test
gave up (a SIGTERM during the sanity check or the final test; `lifecycle/interrupts.py: OwnSignals`). A signal before
the training (the fit's `setup`, before Lightning's handler) was noted and acted on only after the fit's last step.

Rank 0 pauses at the moment, writes a marker and waits there until it has noted the signal, which the test sends to
rank 0 alone, as `kill` or a scheduler's notice to the main process would. The other process meanwhile runs on into
its next collective and waits in it for rank 0."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scripts
from test_run_safety import LONG, ROOT, env, results
from test_signals import signal_at

pytestmark = pytest.mark.slow  # train.py subprocesses
PAUSE = '''
import os
import time

import lightning as L

from archsweep.core.train.lifecycle.stops import STOPS

MARKER = os.environ["ARCHSWEEP_TEST_MARKER"]


class PauseRankZero(L.Callback):
    """Rank 0 pauses once at `at`: fit_setup (the fit's `setup` hook, before Lightning's handler is in place),
    sanity_check (the fit's sanity check, before its training) or final_test (a batch of the test after the fit).
    It writes the moment to the marker file, then waits until the process has noted a stop signal (at most 60 s)."""

    def __init__(self, at: str) -> None:
        self.at, self.done = at, False

    def pause(self, moment, trainer):
        if trainer.is_global_zero and not self.done and moment == self.at:
            self.done = True
            with open(MARKER, "a") as f:
                f.write(moment + "\\n")
            deadline = time.time() + 60
            while STOPS.signum is None and time.time() < deadline:
                time.sleep(0.02)

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            self.pause("fit_setup", trainer)

    def on_sanity_check_start(self, trainer, pl_module):
        self.pause("sanity_check", trainer)

    def on_test_batch_end(self, trainer, *args, **kwargs):
        self.pause("final_test", trainer)
'''


def stopped(tmp_path: Path, moment: str, signum: int, *args: str, timeout: float = 60) -> tuple[int, str, float]:
    """Run train.py (in a session of its own) until rank 0 pauses at `moment`, send `signum` to rank 0, and wait
    until both processes have ended (their shared output closes). The exit code, the output, and the seconds from
    the signal to the end; on a hang, every process of the run is killed and the test fails."""
    (tmp_path / "pause_rank_zero.py").write_text(PAUSE)
    marker = tmp_path / "marker.txt"
    proc = scripts.popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path,
                         env={**env(tmp_path), "ARCHSWEEP_TEST_MARKER": str(marker)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        sent = signal_at(proc, marker, moment, signum)
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running {timeout} s after the signal at {moment}:\n{out[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever a failure above left running
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, time.time() - sent


# the step the run stops at: before the training, its first (with that step's checkpoint); after it, its last
MOMENTS = {"sanity_check": (signal.SIGTERM, 1), "final_test": (signal.SIGTERM, 40), "fit_setup": (signal.SIGUSR2, 1)}


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_signal_to_rank_zero_before_or_after_the_training_stops_both_processes_within_seconds(tmp_path, moment):
    signum, step = MOMENTS[moment]
    run_dir = tmp_path / "run"
    pause = ["+callbacks.pause._target_=pause_rank_zero.PauseRankZero", f"+callbacks.pause.at={moment}"]
    code, out, took = stopped(tmp_path, moment, signum, *LONG, "trainer=ddp", "trainer.accelerator=cpu",
                              "trainer.num_sanity_val_steps=1", f"hydra.run.dir={run_dir}", *pause)
    assert code == 128 + signum, out[-3000:]
    assert took < 20, f"stopped {took:.1f} s after the signal"
    logs = "".join(log.read_text() for log in run_dir.glob("*.log"))  # train.log, train_ddp_process_1.log
    assert "Received SIGTERM" not in logs, logs[-3000:]  # Lightning's handler never ran, in either process
    assert "stopped by" not in out, out[-3000:]  # the other process adds no line of its own
    res = results(run_dir)
    assert res["status"] == "interrupted" and res["interrupted"]["signal"] == signal.Signals(signum).name, res
    assert res["steps"] == step and res["interrupted"]["step"] == step, res
    assert Path(res["last_checkpoint"]).is_file()
