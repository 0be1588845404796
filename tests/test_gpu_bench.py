"""bench/gpu.py --tiny runs on the CPU and prints every figure the GPU run prints (no timing is asserted)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_bench_tiny_runs_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "MFLOP per token (training)" in text and "peak" in text
    for row in ("archsweep", "reference-gpt"):
        assert any(line.startswith(row) and "%" in line for line in text.splitlines()), text
    assert "eager     batch  1:" in text and "eager     batch 32:" in text
    assert "failed" not in text
