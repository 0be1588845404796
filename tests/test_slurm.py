"""A sweep cell as a multi-process submitit job (train/launch/submitit_job.py): the SLURM launcher asks for one task
and one GPU per device, a job's task count must be the trainer's processes, the local executor's tasks get torch's
rank variables, task 1 logs to its own file, and only submitit's preemption signal is handed on to its requeue.
End to end (slow): a submitit_local cell of two CPU processes over gloo, sent submitit's preemption signal
mid-run, stops at a step boundary with a checkpoint, is requeued by submitit's local executor, resumes at its
step and completes, every training step logged once."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_experiments import compose_train
from test_fsdp import RUN
from test_run_safety import finish, launch, results, rows

from archsweep.core.train.launch import submitit_job
from archsweep.core.train.launch.submitit_job import join_tasks, requeue, task_log_name

LOCAL_TASK = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_NTASKS": "2",
              "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NODEID": "0",
              "SUBMITIT_LOCAL_JOB_NUM_NODES": "1"}
TORCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")


@pytest.fixture
def task_one(monkeypatch):
    """This process posing as task 1 of a two-task submitit_local job."""
    for key in (*TORCH_ENV, "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in LOCAL_TASK.items():
        monkeypatch.setenv(key, value)
    yield
    for key in TORCH_ENV:  # join_tasks exports them with os.environ; monkeypatch did not set them
        os.environ.pop(key, None)


def test_the_slurm_launcher_asks_for_a_task_and_a_gpu_per_device():
    launcher = compose_train("hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", hydra=True).hydra.launcher
    assert launcher.tasks_per_node == launcher.gpus_per_node == 4 and launcher.nodes == 1


def test_a_local_task_gets_torch_rank_variables_and_its_own_log(task_one):
    tasks = join_tasks(2)
    assert (tasks.rank, tasks.count) == (1, 2)
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("1", "1", "2")
    port = os.environ["MASTER_PORT"]
    os.environ.pop("MASTER_PORT")
    join_tasks(2)
    assert os.environ["MASTER_PORT"] == port  # from the job id: every task of the job meets on the same port
    assert task_log_name("train") == "train_ddp_process_1"


def test_outside_a_submitit_job_nothing_changes(monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert join_tasks(None) is None and task_log_name("train") == "train"


@pytest.mark.parametrize("processes", [None, 4])
def test_tasks_that_are_not_the_trainers_processes_are_refused(task_one, processes):
    with pytest.raises(ValueError, match="starts 2 tasks for this job.*trainer.devices=2"):
        join_tasks(processes)


@pytest.mark.parametrize("signame, handed_on", [("SIGUSR2", True), ("SIGTERM", False)])
def test_only_submitits_preemption_signal_is_handed_to_its_requeue(task_one, signame, handed_on):
    """submitit's handler, in place when the job starts, is the one requeue hands the signal to, though the
    process's stop handler (`stops.STOPS`) took the signals over when the job started."""
    from archsweep.core.train.lifecycle.stops import STOP_SIGNALS, StopSignals

    seen = []
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))  # submitit's requeue handler
    stops = StopSignals()
    try:
        stops.install()
        assert signal.getsignal(signal.SIGUSR2) == stops.handle
        requeue(signame, stops.handler_before)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    assert seen == ([signal.SIGUSR2] if handed_on else [])
    assert submitit_job.preempt_signal() == signal.SIGUSR2


@pytest.mark.slow  # a sweep of one cell as two submitit_local tasks, run twice over (interrupted, requeued)
def test_a_two_process_cell_preempted_is_requeued_and_resumes_at_its_step(tmp_path):
    sweep_dir, steps = tmp_path / "sweep", 40
    args = ["-m", *RUN, f"trainer.max_steps={steps}", "trainer.val_check_interval=10", "trainer=ddp",
            "trainer.devices=2", "trainer.accelerator=cpu", "hydra/launcher=submitit_local",
            "hydra.launcher.tasks_per_node=2", f"hydra.sweep.dir={sweep_dir}", "seed=0",
            "+callbacks.slow._target_=slowdown.Slow"]
    proc = launch(tmp_path, *args)
    cell, deadline = sweep_dir / "0", time.time() + 240
    while not ((cell / "train.log").is_file() and "step 14/40" in (cell / "train.log").read_text()):
        assert proc.poll() is None and time.time() < deadline, "the cell never reached step 14"
        time.sleep(0.05)
    rank0 = int((cell / ".lock").read_text().split()[0])  # task 0 holds the cell's lock
    assert rank0 != proc.pid
    os.kill(rank0, signal.SIGUSR2)  # submitit's notice of a time-out or preemption
    code, out = finish(proc, timeout=400)
    log = (cell / "train.log").read_text()
    assert code == 0, out[-3000:] + log[-3000:]
    assert "interrupted by SIGUSR2 at step" in log and "resuming the interrupted run from" in log
    stopped = int(log.split("interrupted by SIGUSR2 at step ")[1].split(";")[0])
    assert 14 <= stopped < steps
    res = results(cell)
    assert res["status"] == "completed" and res["steps"] == steps and res["world_size"] == 2
    assert res["resumed_from"] == str(cell / "checkpoints" / "last.ckpt")
    logged = [int(r["step"]) for r in rows(cell) if r.get("train/loss")]
    assert logged == sorted(set(logged)) and logged[-1] == steps - 1  # each step once, the remaining ones after
    assert any(s > stopped for s in logged) and any(s < stopped for s in logged)
    assert "step 40/40" in (cell / "train_ddp_process_1.log").read_text()  # task 1's own log, both attempts
