"""Peak memory of one training run, for results.json and compare.py.

On CUDA it is PyTorch's allocator peak (`torch.cuda.max_memory_allocated`). CPU PyTorch keeps no allocator
statistics, so on CPU it is the process's peak resident set (Linux `VmHWM`), reset when the run starts (writing
5 to /proc/self/clear_refs): parameters, optimizer state, activations, and the interpreter and libraries (a few
hundred MiB, the same for every run of one machine, so differences between cells are differences in what they
allocate). Elsewhere (no /proc) the CPU figure is None.
"""

from __future__ import annotations

from pathlib import Path

import torch

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak() -> None:
    """Start counting the peak from now, on the CPU and on the current CUDA device (if there is one)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass


def peak_mib(device: torch.device) -> float | None:
    """Peak memory since `reset_peak`, in MiB (None where the platform does not say)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
