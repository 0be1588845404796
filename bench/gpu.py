"""The GPU benchmark in one command: a GPT-2 124M-shaped decoder, bf16 autocast and torch.compile, against the
in-benchmark reference GPT (bench/train_step.py), then cached decoding at batch 1 and 32.

    python bench/gpu.py                 # on a CUDA machine (a few minutes, most of it compiling)
    python bench/gpu.py --tiny          # a tiny config on the CPU, fp32, eager: checks that the script runs

Model: 12 layers, d_model 768, 12 heads, d_ff 3072, context 1024, vocabulary 50304, pre-norm, learned positions,
GELU, no biases, tied head (our model with bias=false; the reference is the same computation). Training: AdamW,
batch --batch of full 1024-token rows, bf16 autocast (what trainer.precision=bf16-mixed does) and torch.compile
(compile=true), timed after --warmup steps. Rounds alternate the two models. MFU = tokens/s x training FLOPs per
token / the GPU's bf16 peak (archsweep.core.train.compute.peak_flops); FLOPs per token are the framework's count
(archsweep.variants.flops.forward_flops x TRAIN_FACTOR) of our model, used for the reference too (same
architecture). Decoding: greedy, 128 new tokens after a 16-token prompt, KV cache, bf16 autocast, eager and (on a
GPU) compiled with dynamic shapes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import ReferenceGPT, ours  # noqa: E402

from archsweep.core.data.paths import cache_dir  # noqa: E402
from archsweep.core.eval.generation import DecodingConfig, generate  # noqa: E402
from archsweep.core.model.build import count_parameters  # noqa: E402
from archsweep.core.train.compute import peak_flops  # noqa: E402
from archsweep.variants.flops import TRAIN_FACTOR, Shape, forward_flops  # noqa: E402

FULL = dict(vocab=50304, d=768, h=12, layers=12, ff=3072, t=1024, batch=8, steps=20, warmup=5, rounds=3, new=128)
TINY = dict(vocab=256, d=64, h=2, layers=2, ff=256, t=64, batch=2, steps=2, warmup=1, rounds=2, new=8)


def train_rates(models: dict[str, nn.Module], x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None,
                steps: int, warmup: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median tokens/s per model over alternating rounds, and each model's warm-up seconds (compilation)."""
    device = x.device

    def make(model: nn.Module):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=device.type == "cuda")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(x)
            F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)).backward()
            opt.step()
        return step

    steppers, warm = {name: make(m) for name, m in models.items()}, {}
    for name, step in steppers.items():
        start = time.perf_counter()
        for _ in range(warmup):
            step()
        sync(device)
        warm[name] = time.perf_counter() - start
    rates: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds):
        for name, step in (list(steppers.items())[::-1] if r % 2 else steppers.items()):
            sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            sync(device)
            rates[name].append(x.numel() * steps / (time.perf_counter() - start))
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items()), flush=True)
    return {name: statistics.median(v) for name, v in rates.items()}, warm


def peak_memory(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None) -> float | None:
    """Peak allocated GiB of one training step (forward, backward) of an already warmed-up model."""
    if x.device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        logits = model(x)
    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)).backward()
    model.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated() / 2**30


def decode_rate(model: nn.Module, batch: int, new: int, vocab: int, device: torch.device,
                dtype: torch.dtype | None) -> float:
    prompt = torch.randint(1, vocab, (batch, 16), device=device)
    cfg = DecodingConfig(max_new_tokens=new)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        generate(model, prompt, None, cfg, eos_id=vocab + 1, pad_id=0)  # warm-up (compilation)
        sync(device)
        start = time.perf_counter()
        generate(model, prompt, None, cfg, eos_id=vocab + 1, pad_id=0)
        sync(device)
    return batch * new / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny config on the CPU (fp32, no compile)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--batch", type=int, help="training rows of full context (default 8; tiny 2)")
    args = parser.parse_args()
    c = dict(TINY if args.tiny else FULL)
    if args.batch:
        c["batch"] = args.batch
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type != "cuda" and not args.tiny:
        raise SystemExit("bench/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "run `python bench/gpu.py --tiny` to check the script on the CPU")
    dtype = torch.bfloat16 if device.type == "cuda" else None
    compile_ = device.type == "cuda" and not args.no_compile
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    sizes = (c["vocab"], c["d"], c["h"], c["layers"], c["ff"], c["t"])
    eager = {"archsweep": ours(bias=False, sizes=sizes).to(device),
             "reference-gpt": ReferenceGPT(*sizes).to(device)}
    models = {name: (torch.compile(m) if compile_ else m) for name, m in eager.items()}
    precision = "bf16-mixed" if dtype is not None else "32-true"
    peak = peak_flops(device, precision, None, cache_dir(None))
    flops = TRAIN_FACTOR * forward_flops(eager["archsweep"], Shape(c["batch"], c["t"], causal=True))
    per_token = flops / (c["batch"] * c["t"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {name}; {precision}, compile={compile_}; L={c['layers']} D={c['d']} "
          f"H={c['h']} FF={c['ff']} T={c['t']} V={c['vocab']}, batch {c['batch']}; "
          f"{count_parameters(eager['archsweep']):,} parameters, {per_token / 1e6:,.2f} MFLOP per token (training); "
          f"{peak.line()}")
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, c["vocab"], (c["batch"], c["t"]), generator=g).to(device) for _ in range(2))
    print("Training (alternating rounds):")
    rates, warm = train_rates(models, x, y, dtype, c["steps"], c["warmup"], c["rounds"])
    print(f"\n{'model':<16}{'tokens/s':>12}{'MFU':>8}{'peak GiB':>10}{'warm-up s':>11}{'ours / it':>11}")
    for label, rate in rates.items():
        mem = peak_memory(models[label], x, y, dtype)
        print(f"{label:<16}{rate:>12,.0f}{100 * rate * per_token / peak.flops:>7.1f}%"
              f"{(f'{mem:.2f}' if mem is not None else 'n/a'):>10}{warm[label]:>11.1f}"
              f"{rates['archsweep'] / rate:>11.3f}")
    print(f"MFU target >= 45% (ours), ours / reference >= 1.0: {rates['archsweep'] / rates['reference-gpt']:.3f}")

    print(f"\nCached decoding (greedy, 16-token prompt, {c['new']} new tokens):")
    decoder = eager["archsweep"].eval()
    variants = {"eager": decoder}
    if compile_:
        variants["compiled"] = torch.compile(decoder, dynamic=True)
    for label, model in variants.items():
        for batch in (1, 32):
            try:
                rate = decode_rate(model, batch, c["new"], c["vocab"], device, dtype)
                print(f"  {label:<9} batch {batch:>2}: {rate:>10,.0f} tokens/s")
            except Exception as e:  # a compile failure is reported, not fatal: the eager figures stand
                print(f"  {label:<9} batch {batch:>2}: failed ({type(e).__name__}: {str(e)[:200]})")


if __name__ == "__main__":
    main()
