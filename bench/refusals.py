"""How long train.py and evaluate.py take to refuse each bad input of issue 15, of the config schemas and each of
the model's rules across axes (wall time of the whole process, from launch to exit, and the CPU time it used, which a
busy machine does not inflate), with the first line of each message: `error: ...` from train.py (a value of the
wrong type is refused while composing, in one line naming the argument: src/composition.py).

    python bench/refusals.py            # each case once, after one warm-up launch
    python bench/refusals.py --repeat 3 # the best of three
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN_CASES = [
    ["seed=abc"], ["seed=-1"], ["seed=1.5"], ["trainer.accumulate_grad_batches=0"], ["optim.betas=[0.9]"],
    ["optim.weight_decay=-1"], ["trainer.gradient_clip_val=-1"], ["trainer.devices=0"], ["trainer=gpu"],
    ["trainer=ddp", "trainer.devices=4", "task.val_batches=2"],
    ["trainer.max_steps=100", "schedule.warmup_steps=500", "trainer.precision=8-mixed"],  # warning, then a refusal
    ["output_root={tmp}/a-file"], ["ckpt_path={tmp}/not-a.ckpt"], ["hydra.run.dir={tmp}/finished"],
    # the model's rules across axes, checked on the variants' classes (so after torch is imported)
    ["attention=performer", "pos=alibi"], ["model=decoder_only", "pos=sincos2d"],
    ["attention=linear", "model.attn_softcap=50"],
    ["optim.lr=abc"], ["schedule.warmup_steps=-1"], ["decoding.beam_size=x"],  # the config schemas
]


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, exit code, message) of one launch."""
    start, cpu = time.perf_counter(), cpu_of_children()
    out = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    lines = [line.strip() for line in out.stderr.splitlines() if line.startswith(("error:", "Error merging"))
             or "WARNING" in line or "full_key:" in line or "could not be converted" in line]
    return time.perf_counter() - start, cpu_of_children() - cpu, out.returncode, " / ".join(lines)[:150]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    env = {**os.environ, "WANDB_MODE": "disabled", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "a-file").write_text("")
        (tmp_path / "not-a.ckpt").write_text("text")
        (tmp_path / "finished" / "checkpoints").mkdir(parents=True)
        (tmp_path / "finished" / "checkpoints" / "last.ckpt").write_bytes(b"PK")
        timed([str(ROOT / "train.py"), "--help"], tmp_path, env)  # warm the file cache
        print(f"{'seconds':>8}  {'cpu s':>6}  {'exit':>4}  case: message")
        for case in TRAIN_CASES:
            argv = [a.format(tmp=tmp) for a in case]
            argv += [] if any(a.startswith("output_root=") for a in argv) else [f"output_root={tmp}/out"]
            best = min((timed([str(ROOT / "train.py"), *argv], tmp_path, env)
                        for _ in range(args.repeat)), key=lambda r: r[0])
            print(f"{best[0]:8.2f}  {best[1]:6.2f}  {best[2]:>4}  {' '.join(case)}: {best[3]}")
        best = min((timed([str(ROOT / "evaluate.py"), f"ckpt={tmp}/not-a.ckpt"], tmp_path, env)
                    for _ in range(args.repeat)), key=lambda r: r[0])
        print(f"{best[0]:8.2f}  {best[1]:6.2f}  {best[2]:>4}  evaluate.py ckpt=<text file>: {best[3]}")


if __name__ == "__main__":
    main()
