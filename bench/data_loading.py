"""Is data loading ever the bottleneck of a training step? For each task and model kind: batches per second of
the task's dataloader (in the training process, as train.py reads it) against the time of one training step
(forward, backward, AdamW) of the default model of that kind (conf/model/*.yaml), and the share of the step the
loader would cost. Also: preparing a file-based task with a cold cache against a warm one.

    python bench/data_loading.py                  # all tasks, default sizes
    python bench/data_loading.py --batches 200 --steps 20
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.model.build import build_model
from archsweep.core.train.job import build_task, model_config

CONF = Path(__file__).resolve().parents[1] / "conf"
CASES = [("reverse", "encoder_decoder"), ("reverse", "decoder_only"), ("reverse", "encoder_only"),
         ("addition", "encoder_decoder"), ("recall", "decoder_only"), ("is_sorted", "encoder_only"),
         ("shakespeare_char", "decoder_only"), ("shakespeare_char", "encoder_only"), ("text", "decoder_only"),
         ("multi30k", "encoder_decoder"), ("multi30k", "decoder_only")]
# the measured configuration: 4 layers, 4 heads, d_model 128, context 64, batch 12
NANOGPT = ["model.d_model=128", "model.n_heads=4", "model.n_layers=4", "model.d_ff=512", "model.dropout=0.0",
           "norm=pre"]


def compose_cfg(task: str, kind: str, extra: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[f"task={task}", f"model={kind}", *extra])


def loader_rate(task, kind: str, n: int) -> float:
    it = iter(task.dataloader("train", kind, seed=0))
    next(it)
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    return n / (time.perf_counter() - start)


def step_time(task, model_cfg, n: int) -> float:
    torch.manual_seed(0)
    model = build_model(model_cfg)
    forward = task.forward_fn(model_cfg.kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [b for _, b in zip(range(n + 2), task.dataloader("train", model_cfg.kind, seed=0), strict=False)]
    times = []
    for batch in batches:
        start = time.perf_counter()
        logits = forward(model, batch)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return sorted(times[2:])[len(times[2:]) // 2]  # median after warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="batches read per loader measurement")
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per case")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    print(f"{'task':<18}{'kind':<17}{'model':<10}{'batch':>14}{'loader b/s':>12}{'load ms':>9}{'step ms':>9}"
          f"{'load/step':>10}")
    rows = [(t, k, "default", []) for t, k in CASES] + [("shakespeare_char", "decoder_only", "4L d128", NANOGPT)]
    for task_name, kind, label, extra in rows:
        cfg = compose_cfg(task_name, kind, extra)
        task = build_task(cfg)
        model_cfg = model_config(cfg, task)
        rate = loader_rate(task, kind, args.batches)
        step = step_time(task, model_cfg, args.steps)
        batch = next(iter(task.dataloader("train", kind, seed=0)))
        shape = "x".join(map(str, batch["labels"].shape))
        print(f"{task_name:<18}{kind:<17}{label:<10}{shape:>14}{rate:>12,.0f}{1e3 / rate:>9.2f}{1e3 * step:>9.1f}"
              f"{1 / rate / step:>10.1%}", flush=True)
    print("\npreparing a file-based task: cold cache (tokenise and write) vs warm cache (open the arrays)")
    for task_name in ("shakespeare_char", "text", "multi30k"):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = compose_cfg(task_name, "decoder_only", [f"task.cache_dir={tmp}"])
            start = time.perf_counter()
            build_task(cfg)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            build_task(cfg)
            warm = time.perf_counter() - start
        print(f"{task_name:<18} cold {cold:6.2f} s   warm {warm * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
