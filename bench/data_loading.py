"""Is data loading ever the bottleneck of a training step? For each task and model kind: batches per second of
the task's dataloader (in the training process, as train.py reads it) against the time of one training step
(forward, backward, AdamW) of the default model of that kind (conf/model/*.yaml), and the share of the step the
loader would cost. Also: preparing a file-based task with a cold cache against a warm one; and with `--shards`,
`task=tokens` on a token set of 1 GB against one 10x smaller: the loader's tokens/s at experiment=gpt2_124m's batch
(32 x 1024) for both samplings against the rate a GPU trains that model at, and the peak RSS of the loading process
(each set read in a fresh process, so the figures are the loader's own).

    python bench/data_loading.py                  # all tasks, default sizes
    python bench/data_loading.py --batches 200 --steps 20
    python bench/data_loading.py --shards         # only the shard sets: 1 GB and 100 MB of uint16 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.model.build import build_model
from archsweep.core.train.lifecycle.checks import build_task, model_config

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


# experiment=gpt2_124m on one GPU: training FLOPs per token (3 x the forward count of the preset's model at context
# 1024, which tests/test_tokens_train.py checks: 3 x 266,029,056), at 50% of an H100's dense bf16 peak
# (989 TFLOP/s): an upper bound on the tokens per second a single GPU consumes
GPT2_TRAIN_FLOPS_PER_TOKEN = 3 * 266_029_056
GPU_FLOPS = 0.5 * 989e12


def write_token_set(folder: Path, n_tokens: int, shard_tokens: int = 100_000_000, seed: int = 0) -> None:
    """An archsweep shard folder of random uint16 ids in documents of web-like lengths (log-normal, median ~400
    tokens), each ended by id 50256: the layout archsweep-prepare writes, without the tokenizing."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    splits: dict[str, list] = {"train": [], "val": []}
    for split, total in (("train", n_tokens), ("val", 2_000_000)):
        written = 0
        while written < total:
            n = min(shard_tokens, total - written)
            tokens = rng.integers(0, 50256, n, dtype=np.uint16)
            ends = np.cumsum(rng.lognormal(6.0, 1.0, n // 100).astype(np.int64) + 1)
            tokens[ends[ends < n]] = 50256
            tokens[-1] = 50256
            name = f"{split}_{len(splits[split]):06d}.npy"
            np.save(folder / name, tokens)
            docs = int((tokens == 50256).sum())
            splits[split].append({"file": name, "tokens": n, "documents": docs, "bytes": 4 * (n - docs)})
            written += n
    meta = {"format": "archsweep-tokens", "version": 1, "dtype": "uint16", "vocab_size": 50257, "eos_id": 50256,
            "tokenizer": {"name": "random ids", "sha256": "0" * 64}, "shard_tokens": shard_tokens, "settings": {},
            "splits": splits}
    (folder / "meta.json").write_text(json.dumps(meta))


def read_token_set(folder: str, sampling: str, batches: int) -> dict:
    """In this (fresh) process: open the set as experiment=gpt2_124m's task does, index it, read `batches`."""
    from archsweep.core.data.tasks.tokens import TokensTask

    imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux: torch, Hydra, Lightning
    start = time.perf_counter()
    task = TokensTask(folder, block_size=1024, batch_size=32, val_batches=1, test_batches=1, eval_seed=0,
                      sampling=sampling, cache_dir=str(Path(folder) / "cache"))
    task.indexes("train")  # the document index and largest id (a pass over the set; cached for later runs)
    opened = time.perf_counter() - start
    it = iter(task.dataloader("train", "decoder_only", seed=0))
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches * 32 * 1024 / (time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"opened_s": opened, "tokens_per_s": rate, "peak_rss_mib": peak, "loader_mib": peak - imports}


def bench_shards(batches: int) -> None:
    gpu = GPU_FLOPS / GPT2_TRAIN_FLOPS_PER_TOKEN
    print(f"task=tokens at experiment=gpt2_124m's batch (32 x 1024), one loading process; a GPU trains that model "
          f"at <= {gpu:,.0f} tokens/s (50% of 989 TFLOP/s)")
    print(f"{'set':>8}{'sampling':>13}{'open+index s':>14}{'again s':>9}{'tokens/s':>14}{'x GPU':>8}"
          f"{'peak RSS MiB':>14}{'above imports':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, n_tokens in (("1 GB", 500_000_000), ("100 MB", 50_000_000)):
            folder = Path(tmp) / label.replace(" ", "")
            write_token_set(folder, n_tokens)
            for sampling in ("random", "bos_aligned"):
                runs = []
                for _ in range(2):  # the second finds the document index in the cache
                    out = subprocess.run([sys.executable, __file__, "--read-set", str(folder), sampling, str(batches)],
                                         capture_output=True, text=True, check=True)
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                first, again = runs
                print(f"{label:>8}{sampling:>13}{first['opened_s']:>14.2f}{again['opened_s']:>9.3f}"
                      f"{again['tokens_per_s']:>14,.0f}{again['tokens_per_s'] / gpu:>8.1f}"
                      f"{max(first['peak_rss_mib'], again['peak_rss_mib']):>14.0f}"
                      f"{max(first['loader_mib'], again['loader_mib']):>15.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="batches read per loader measurement")
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per case")
    parser.add_argument("--shards", action="store_true", help="only the token shard sets (1 GB and 100 MB)")
    parser.add_argument("--read-set", nargs=3, help=argparse.SUPPRESS)  # FOLDER SAMPLING BATCHES: one measurement
    args = parser.parse_args()
    if args.read_set:
        folder, sampling, n = args.read_set
        print(json.dumps(read_token_set(folder, sampling, int(n))))
        return
    if args.shards:
        bench_shards(args.batches)
        return
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
