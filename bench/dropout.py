"""The default model's CPU training step with the package's dropout against `F.dropout`, interleaved in one process.

    python bench/dropout.py [--rounds 7] [--steps 5] [train.py overrides]

Both forms run the same model (train.py's default config unless overrides are given) on the same batches; "torch"
patches every dropout of the package (residual, FFN, embedding) back to `F.dropout` (one Bernoulli draw per
element), "archsweep" is the code as it is (archsweep.variants.dropout). Attention dropout is SDPA's `dropout_p` in
both. Prints the median tokens/s of each, dropout's share of the step (against the same model with every dropout
probability at 0) and the top operators of a profiled step of each form.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

import archsweep.variants.dropout as package_dropout
import archsweep.variants.ffn.base as ffn_base
import archsweep.variants.norm.base as norm_base
from archsweep.core.data.tasks.base import IGNORE_INDEX
from archsweep.core.model.build import build_model
from archsweep.core.train.lifecycle.checks import build_task, model_config

MODULES = (norm_base, ffn_base, package_dropout)  # where apply_dropout is called (package_dropout: its Dropout)


def torch_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p, training) if p > 0 else x


@contextlib.contextmanager
def form(name: str, model: torch.nn.Module):
    """'torch': F.dropout wherever the package drops out; 'archsweep': as the package is; 'off': every dropout
    probability set to 0 (the step without dropout, to price it)."""
    saved_fns = [(m, m.apply_dropout) for m in MODULES]
    saved_ps = [(m, attr, getattr(m, attr)) for m in model.modules() for attr in ("p", "dropout")
                if isinstance(getattr(m, attr, None), float)]
    if name == "torch":
        for m in MODULES:
            m.apply_dropout = torch_dropout
    if name == "off":
        for m, attr, _ in saved_ps:
            setattr(m, attr, 0.0)
    try:
        yield
    finally:
        for m, fn in saved_fns:
            m.apply_dropout = fn
        for m, attr, value in saved_ps:
            setattr(m, attr, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="training steps per form per round")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=args.overrides)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    torch.manual_seed(0)
    model = build_model(model_cfg).train()
    forward = task.forward_fn(model_cfg.kind)
    stream = iter(task.dataloader("train", model_cfg.kind, cfg.seed))
    batches = [next(stream) for _ in range(args.steps)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: dict) -> None:
        opt.zero_grad(set_to_none=True)
        logits = forward(model, batch)
        F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX).backward()
        opt.step()

    tokens = sum(b["n_tokens"] for b in batches)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {model_cfg.kind}, dropout "
          f"{model_cfg.dropout}, {len(batches)} batches of {tokens / len(batches):,.0f} tokens")
    rates: dict[str, list[float]] = {"torch": [], "archsweep": [], "off": []}
    for name in rates:  # warm-up
        with form(name, model):
            for b in batches[:2]:
                step(b)
    for r in range(args.rounds):
        for name in (list(rates)[::-1] if r % 2 else list(rates)):
            with form(name, model):
                start = time.perf_counter()
                for b in batches:
                    step(b)
                rates[name].append(tokens / (time.perf_counter() - start))
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items()), flush=True)
    median = {n: statistics.median(v) for n, v in rates.items()}
    print(f"\nmedian tokens/s: F.dropout {median['torch']:,.0f}, archsweep {median['archsweep']:,.0f}, no dropout "
          f"{median['off']:,.0f}; archsweep / F.dropout {median['archsweep'] / median['torch']:.3f}")
    for name in ("torch", "archsweep"):
        print(f"dropout's share of the step ({name}): {100 * (1 - median[name] / median['off']):.0f}% "
              f"(1 - tokens/s with it / without it)")
    for name in ("torch", "archsweep"):
        with form(name, model), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for b in batches:
                step(b)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        random = sum(e.self_cpu_time_total for e in events if e.key in ("aten::bernoulli_", "aten::random_"))
        print(f"profile ({name}): random draws {100 * random / total:.1f}% of the step's self CPU time; top ops: "
              + ", ".join(f"{e.key} {100 * e.self_cpu_time_total / total:.0f}%"
                          for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:6]))


if __name__ == "__main__":
    main()
