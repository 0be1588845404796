"""`torchrun --nproc_per_node=N train.py trainer=ddp ...` (or trainer=fsdp): one run, started N times by torchrun.

Lightning's own launcher starts the other ranks with rank 0's command line and run directory; torchrun starts
every rank itself, and each would expand `resume=` and choose a default run directory (a time and random digits)
of its own. Rank 0 decides both and the others take them, through the key-value store torchrun already runs for
the process group (MASTER_ADDR:MASTER_PORT). The other ranks log to `train_ddp_process_<rank>.log` in the run
directory, as under Lightning's launcher, and write no `.hydra/` of their own. Light: torch only when under torchrun.
"""

from __future__ import annotations

import datetime
import os

STORE_TIMEOUT = datetime.timedelta(minutes=10)  # a rank waits this long for rank 0's answer (torchrun ends the
# whole group sooner if rank 0 fails)


def under_torchrun() -> bool:
    """Whether torchrun (torch.distributed.elastic) started this process as one of several."""
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _share(name: str, value: str | None) -> str:
    """Rank 0's `value` for `name`: rank 0 stores it, the others wait for it."""
    from torch.distributed import TCPStore

    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=STORE_TIMEOUT)
    key = f"archsweep/{os.environ['TORCHELASTIC_RUN_ID']}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"
    if rank() == 0:
        store.set(key, value or "")
        return value or ""
    return store.get(key).decode()


def agree_argv(argv: list[str]) -> list[str]:
    """Rank 0's command line (after it expanded `resume=`); `argv` itself on rank 0. Arguments are joined by NUL,
    which no command-line argument can hold."""
    shared = _share("argv", "\0".join(argv) if rank() == 0 else None)
    return shared.split("\0") if shared else []


def agree_run_dir(run_dir: str) -> str:
    """Rank 0's run directory (`run_dir` itself on rank 0)."""
    return _share("run_dir", run_dir)
