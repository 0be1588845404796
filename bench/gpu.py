"""The GPU check in one command: the tests marked `gpu`, then a GPT-2 124M-shaped decoder trained with bf16 autocast
and torch.compile against the in-benchmark reference GPT (bench/train_step.py), then cached decoding at batch 1 and
32; one JSON and one markdown table in --out, written after every stage (a run cut short keeps what it finished).

    timeout 480 python bench/gpu.py --out gpu_check    # on a CUDA machine: under 8 minutes, most of it compiling
    python bench/gpu.py --tiny --out gpu_check_tiny     # the same stages on the CPU, tiny (fp32; benchmarks eager)

Stage 1, tests: `pytest -m gpu tests/test_gpu.py` (forward parity of every model kind and attention kind in fp32
and bf16 against float64 on the CPU, compiled FlexAttention with sliding-window and document block masks against
the dense mask, the KV cache under compile, two compiled train.py steps); on the CPU they run in tiny form.
Stage 2, training. Model: 12 layers, d_model 768, 12 heads, d_ff 3072, context 1024, vocabulary 50304, pre-norm,
learned positions, GELU, no biases, tied head (our model with bias=false; the reference is the same computation).
AdamW, batch --batch of full 1024-token rows, bf16 autocast (what trainer.precision=bf16-mixed does) and
torch.compile (compile=true), timed after --warmup steps. Rounds alternate the two models. MFU = tokens/s x
training FLOPs per token / the GPU's bf16 peak (archsweep.core.train.monitoring.compute.peak_flops); FLOPs per token
are the framework's count (archsweep.variants.flops.forward_flops x TRAIN_FACTOR) of our model, used for the reference
too (same architecture). Stage 3, decoding: greedy, 128 new tokens after a 16-token prompt, KV cache, bf16 autocast,
eager and (on a GPU) compiled with dynamic shapes.
Targets (GPU only): MFU >= 45% (ours, bf16, compiled), ours >= 0.95x the reference's tokens/s, compiled decoding at
batch 1 faster than eager."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
from archsweep.core.train.monitoring.compute import peak_flops  # noqa: E402
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


TARGETS = {"mfu": 0.45, "ours_over_reference": 0.95}  # on a GPU; compiled decoding at batch 1 must beat eager
ROOT = Path(__file__).resolve().parents[1]


class Report:
    """The check's JSON (figures, per stage) and its markdown table, rewritten in --out after every stage."""

    def __init__(self, out: Path, header: dict) -> None:
        self.out, self.data = out, {**header, "complete": False, "stages": {}, "targets": []}
        out.mkdir(parents=True, exist_ok=True)

    def stage(self, name: str, figures: dict) -> None:
        self.data["stages"][name] = figures
        self.write()

    def target(self, name: str, value: float | None, goal: str, met: bool | None) -> None:
        self.data["targets"].append({"target": name, "value": value, "goal": goal, "met": met})
        self.write()

    def write(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.data))


def markdown(d: dict) -> str:
    lines = [f"# GPU check: {d['device']}", "",
             f"torch {d['torch']}, {d['mode']} mode, {d['precision']}, compile={d['compile']}"
             + ("" if d["complete"] else " (incomplete: the run stopped before its last stage)"), "",
             "| stage | figure | value | target | met |", "| --- | --- | --- | --- | --- |"]
    for stage, figures in d["stages"].items():
        for key, value in flat(figures):
            lines.append(f"| {stage} | {key} | {fmt(value)} | | |")
    for t in d["targets"]:
        met = "n/a (not a GPU)" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| target | {t['target']} | {fmt(t['value'])} | {t['goal']} | {met} |")
    return "\n".join(lines) + "\n"


def flat(figures: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in figures.items():
        if isinstance(value, dict):
            out += flat(value, f"{prefix}{key} ")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return "" if value is None else str(value)


def run_tests(out: Path, timeout_s: float) -> dict:
    """Stage 1: the tests marked gpu in a pytest process; counts and the failures from its JUnit XML."""
    import xml.etree.ElementTree as ET

    xml = out / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests" / "test_gpu.py"),
           "-p", "no:cacheprovider", f"--junitxml={xml}"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "ARCHSWEEP_GPU_CHECK": "1"})  # tests/test_gpu.py runs on a CPU too
    except subprocess.TimeoutExpired:
        return {"status": f"stopped after {timeout_s:.0f} s", "seconds": time.perf_counter() - start}
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:], flush=True)
    if not xml.is_file():
        return {"status": f"pytest exited {proc.returncode} without a report: {proc.stderr[-500:]}",
                "seconds": time.perf_counter() - start}
    cases = ET.parse(xml).getroot().iter("testcase")
    outcome: dict[str, str] = {}
    times: dict[str, float] = {}
    for case in cases:
        name = case.get("name", "?")
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome[name] = "failed" if failed else "skipped" if case.find("skipped") is not None else "passed"
        times[name] = float(case.get("time", 0.0))
    counts = {k: sum(v == k for v in outcome.values()) for k in ("passed", "failed", "skipped")}
    return {"status": "passed" if proc.returncode == 0 else f"pytest exit status {proc.returncode}", **counts,
            "seconds": time.perf_counter() - start, "outcomes": outcome,
            "slowest_s": dict(sorted(times.items(), key=lambda kv: -kv[1])[:3])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny config on the CPU (fp32, benchmarks eager)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for gpu_check.json / .md")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-tests", action="store_true", help="skip stage 1 (the tests marked gpu)")
    parser.add_argument("--tests-timeout", type=float, default=None,
                        help="seconds for stage 1 (default 240 on a GPU, 1200 with --tiny)")
    parser.add_argument("--batch", type=int, help="training rows of full context (default 8; tiny 2)")
    args = parser.parse_args()
    c = dict(TINY if args.tiny else FULL)
    if args.batch:
        c["batch"] = args.batch
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type != "cuda" and not args.tiny:
        raise SystemExit("bench/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "run `python bench/gpu.py --tiny` to check the script on the CPU")
    began = time.perf_counter()
    dtype = torch.bfloat16 if device.type == "cuda" else None
    compile_ = device.type == "cuda" and not args.no_compile
    precision = "bf16-mixed" if dtype is not None else "32-true"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report = Report(args.out, {"device": name, "torch": torch.__version__, "mode": "tiny" if args.tiny else "full",
                               "precision": precision, "compile": compile_, "config": c})

    if not args.no_tests:
        print("Stage 1: the tests marked gpu", flush=True)
        report.stage("tests", run_tests(args.out, args.tests_timeout or (1200 if args.tiny else 240)))

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    sizes = (c["vocab"], c["d"], c["h"], c["layers"], c["ff"], c["t"])
    eager = {"archsweep": ours(bias=False, sizes=sizes).to(device),
             "reference-gpt": ReferenceGPT(*sizes).to(device)}
    models = {label: (torch.compile(m) if compile_ else m) for label, m in eager.items()}
    peak = peak_flops(device, precision, None, cache_dir(None))
    flops = TRAIN_FACTOR * forward_flops(eager["archsweep"], Shape(c["batch"], c["t"], causal=True))
    per_token = flops / (c["batch"] * c["t"])
    print(f"\nStage 2: training. torch {torch.__version__} on {name}; {precision}, compile={compile_}; "
          f"L={c['layers']} D={c['d']} H={c['h']} FF={c['ff']} T={c['t']} V={c['vocab']}, batch {c['batch']}; "
          f"{count_parameters(eager['archsweep']):,} parameters, {per_token / 1e6:,.2f} MFLOP per token (training); "
          f"{peak.line()}")
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, c["vocab"], (c["batch"], c["t"]), generator=g).to(device) for _ in range(2))
    print("Training (alternating rounds):")
    rates, warm = train_rates(models, x, y, dtype, c["steps"], c["warmup"], c["rounds"])
    print(f"\n{'model':<16}{'tokens/s':>12}{'MFU':>8}{'peak GiB':>10}{'warm-up s':>11}{'ours / it':>11}")
    training = {"parameters": count_parameters(eager["archsweep"]), "flops_per_token": per_token,
                "peak_flops": peak.flops, "peak_source": peak.source}
    for label, rate in rates.items():
        mem = peak_memory(models[label], x, y, dtype)
        mfu = rate * per_token / peak.flops
        training[label] = {"tokens_per_s": rate, "mfu": mfu, "peak_gib": mem, "warmup_s": warm[label]}
        print(f"{label:<16}{rate:>12,.0f}{100 * mfu:>7.1f}%{(f'{mem:.2f}' if mem is not None else 'n/a'):>10}"
              f"{warm[label]:>11.1f}{rates['archsweep'] / rate:>11.3f}")
    ratio = rates["archsweep"] / rates["reference-gpt"]
    training["ours_over_reference"] = ratio
    print(f"MFU target >= {TARGETS['mfu']:.0%} (ours), ours / reference >= {TARGETS['ours_over_reference']}: "
          f"{ratio:.3f}")
    report.stage("training", training)
    on_gpu = device.type == "cuda"
    report.target("MFU, ours (bf16, compiled)", training["archsweep"]["mfu"], f">= {TARGETS['mfu']}",
                  training["archsweep"]["mfu"] >= TARGETS["mfu"] if on_gpu and compile_ else None)
    report.target("tokens/s, ours / reference", ratio, f">= {TARGETS['ours_over_reference']}",
                  ratio >= TARGETS["ours_over_reference"] if on_gpu else None)

    print(f"\nStage 3: cached decoding (greedy, 16-token prompt, {c['new']} new tokens):")
    decoder = eager["archsweep"].eval()
    variants = {"eager": decoder}
    if compile_:
        variants["compiled"] = torch.compile(decoder, dynamic=True)
    decoding: dict[str, dict] = {}
    for label, model in variants.items():
        decoding[label] = {}
        for batch in (1, 32):
            try:
                rate = decode_rate(model, batch, c["new"], c["vocab"], device, dtype)
                decoding[label][f"batch {batch} tokens_per_s"] = rate
                print(f"  {label:<9} batch {batch:>2}: {rate:>10,.0f} tokens/s")
            except Exception as e:  # a compile failure is reported, not fatal: the eager figures stand
                decoding[label][f"batch {batch} error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(f"  {label:<9} batch {batch:>2}: failed ({type(e).__name__}: {str(e)[:200]})")
    report.stage("decoding", decoding)
    speedup = None
    if "compiled" in decoding and "batch 1 tokens_per_s" in decoding["compiled"]:
        speedup = decoding["compiled"]["batch 1 tokens_per_s"] / decoding["eager"]["batch 1 tokens_per_s"]
    report.target("decoding at batch 1, compiled / eager", speedup, "> 1",
                  speedup > 1 if speedup is not None else None)
    report.data["complete"], report.data["wall_s"] = True, time.perf_counter() - began
    report.write()
    print(f"\nwrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'} ({report.data['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
