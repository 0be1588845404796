"""A sweep cell as a multi-process job of the submitit launchers (hydra/launcher=slurm or submitit_local), and its
requeue after preemption.

With `hydra.launcher.tasks_per_node=N` submitit starts the cell N times, once per task, all running this same job.
Under SLURM, Lightning's SLURMEnvironment reads each task's rank from SLURM's variables; submitit's local executor
sets only its own (SUBMITIT_LOCAL_*), which `join_tasks` exports as torch's (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT: submitit's TorchDistributedEnvironment) so that Lightning's default environment finds
processes started outside it. Either way task 0 is rank 0: it locks the cell's directory and writes its results;
the others are workers (`rundir.is_worker_process`) and log to `train_ddp_process_<rank>.log`.

Preemption: SLURM signals the job (`--signal`, submitit's USR2 by default, before a time-out; SIGTERM when it
preempts). StopOnSignal stops every task at the next step boundary with `checkpoints/last.ckpt` and `status:
interrupted`; then `requeue` hands the signal to submitit's own handler, which submitit installed when the job
started and Lightning restored after the fit: on rank 0 it resubmits the job (SLURM: `scontrol requeue`; local: the
executor restarts the tasks), and the restarted cell resumes from its checkpoint (job.py, skip_or_resume).
Light: submitit is imported only inside a submitit job.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any, NamedTuple

log = logging.getLogger("train")
EXECUTOR_ENV = "SUBMITIT_EXECUTOR"  # set by submitit in every job it starts: "slurm", "local", ...


class JobTasks(NamedTuple):
    executor: str
    rank: int
    count: int


def job_tasks() -> JobTasks | None:
    """This process's task within a submitit job; None outside one."""
    executor = os.environ.get(EXECUTOR_ENV)
    if not executor:
        return None
    from submitit import JobEnvironment

    env = JobEnvironment()
    return JobTasks(executor, env.global_rank, env.num_tasks)


def task_log_name(name: str) -> str:
    """The log file name of a task: `name` for rank 0 (and outside a submitit job), Lightning's worker log name
    `train_ddp_process_<rank>` for the others (conf/hydra/job_logging/archsweep.yaml: `${task_log:...}`)."""
    tasks = job_tasks()
    return name if tasks is None or tasks.rank == 0 else f"train_ddp_process_{tasks.rank}"


def join_tasks(processes: int | None) -> JobTasks | None:
    """In a submitit job of several tasks, check that they are the run's `processes` (trainer.devices x
    trainer.num_nodes of a ddp/fsdp trainer) and, under the local executor, export torch's rank variables. Returns
    the tasks (None outside a multi-task job). ValueError naming the settings when the counts differ."""
    tasks = job_tasks()
    if tasks is None or tasks.count == 1:
        return None
    if processes != tasks.count:
        what = f"{processes} processes" if processes else "no data-parallel processes"
        raise ValueError(f"hydra.launcher.tasks_per_node x nodes starts {tasks.count} tasks for this job, but the "
                         f"trainer runs {what}; use trainer=ddp or trainer=fsdp with trainer.devices={tasks.count} "
                         f"(conf/hydra/launcher/slurm.yaml follows trainer.devices), or "
                         f"hydra.launcher.tasks_per_node=1")
    if "SLURM_PROCID" not in os.environ:  # SLURM's own variables are Lightning's SLURMEnvironment's
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return tasks


def preempt_signal() -> int:
    """The signal submitit takes as its notice of preemption or time-out (USR2, or $SUBMITIT_PREEMPT_SIGNAL)."""
    from submitit import JobEnvironment

    return int(getattr(signal, "SIG" + JobEnvironment.USR_SIG))


def requeue(signal_name: str, handler_before: Callable[[int], Any]) -> None:
    """After an interrupted run in a submitit job: a stop by submitit's preemption signal is passed on to its
    handler (`handler_before(signum)`: the one the process's stop handler took over), which requeues the job from
    rank 0 and exits. Other signals
    (SIGTERM: SLURM requeues a preempted job itself when its partition says so) and other processes: nothing."""
    if job_tasks() is None:
        return
    signum = preempt_signal()
    if signal.Signals(signum).name != signal_name:
        return
    handler = handler_before(signum)  # submitit's, which the process's stop handler took over at the job's start
    if callable(handler):
        log.info(f"{signal_name}: asking submitit to requeue this job; it resumes from the checkpoint")
        handler(signum, None)
