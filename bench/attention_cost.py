"""Cost of each attention kind against sequence length: forward+backward time and peak memory of one causal
self-attention layer and of one training step of a small decoder, as ratios to `full` at the same length.

    python bench/attention_cost.py                          # 256 ... 8192, table + bench/attention_cost.png
    python bench/attention_cost.py --lengths 256 512 --repeats 2 --plot ''

Times are measured in this process, the kinds interleaved at each length (medians of --repeats). Peak memory is
measured in a fresh child process per kind, length and target (CPU PyTorch keeps no allocator statistics): after
a warm-up call the kernel's peak-RSS mark is reset, and the figure is how far one more call raises it above the
resident set before it; large allocations are forced to be mapped, so freed tensors leave the resident set.
FLOPs/token is the analytic forward count of the attention
core (`flops_per_token` of the kind: scores and values over the keys each query sees; feature maps and states
for the kernel kinds), the projections excluded (they are the same for every kind).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.base import AttnContext
from archsweep.variants.attention.layers import SelfAttention

BATCH, D_MODEL, HEADS, VOCAB = 2, 64, 4, 256
KINDS = {"full": {}, "sliding_window": {"window": 128}, "linear": {}, "performer": {}}


def spec(kind: str) -> dict:
    return {"name": kind, **KINDS[kind]}


def layer_task(kind: str, length: int):
    """One causal self-attention layer: forward and backward on random inputs."""
    torch.manual_seed(0)
    kernel = ATTENTION.build(spec(kind), {"layer": 0, "causal": True, "head_dim": D_MODEL // HEADS})
    layer = SelfAttention(D_MODEL, HEADS, HEADS, 0.0, False, layer=0, kernel=kernel)
    x = torch.randn(BATCH, length, D_MODEL, requires_grad=True)
    positions = torch.arange(length)[None]

    def step() -> None:
        ctx = AttnContext(None, True, length, length, positions, lambda q, k, p: (q, k), lambda *a: None, None,
                          x.device)
        layer(x, ctx).sum().backward()

    return step


def train_task(kind: str, length: int):
    """One training step (forward, backward, AdamW) of a two-layer decoder with this attention kind."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=VOCAB, d_model=D_MODEL, n_heads=HEADS,
                                    n_layers=2, d_ff=4 * D_MODEL, max_seq_len=length, dropout=0.0, norm="pre",
                                    pos="rotary", bias=False, attention=spec(kind))).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (BATCH, length + 1))

    def step() -> None:
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


TASKS = {"layer": layer_task, "step": train_task}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def child(kind: str, length: int, target: str) -> None:
    """Print the peak-RSS growth (MiB) of one call of the task over the resident set just before it, in this
    fresh process, after one warm-up call (optimizer state and one-off buffers excluded)."""
    run = TASKS[target](kind, length)
    run()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set size (VmHWM) to the current one
    before = _status_kib("VmRSS")
    run()
    print(json.dumps({"mib": (_status_kib("VmHWM") - before) / 1024}))


def peak_mib(kind: str, length: int, target: str, threads: int) -> float:
    # allocations of 64 KiB and more are mapped and unmapped, so the resident set follows the live tensors
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(length), target], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"memory child {kind} {length} {target} failed: {out.stderr[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["mib"]


def timed(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def flops(kind: str, length: int) -> float:
    kernel = ATTENTION.build(spec(kind), {"layer": 0, "causal": True, "head_dim": D_MODEL // HEADS})
    return kernel.flops_per_token(length, True, HEADS, D_MODEL // HEADS)


def measure(lengths: list[int], repeats: int, threads: int, memory: bool) -> list[dict]:
    rows = []
    for length in lengths:
        for target in TASKS:
            runs = {kind: TASKS[target](kind, length) for kind in KINDS}
            times = {kind: [] for kind in KINDS}
            for _ in range(repeats):  # interleaved, so drift in the machine hits every kind alike
                for kind, run in runs.items():
                    times[kind].append(timed(run, 1))
            for kind in KINDS:
                mib = peak_mib(kind, length, target, threads) if memory else float("nan")
                rows.append({"length": length, "target": target, "kind": kind,
                             "seconds": statistics.median(times[kind]), "mib": mib,
                             "flops_per_token": flops(kind, length)})
            done = [r for r in rows if r["length"] == length and r["target"] == target]
            print(f"  measured length {length} {target}: " + ", ".join(f"{r['kind']} {r['seconds'] * 1e3:.1f} ms"
                                                                         for r in done), flush=True)
    return rows


def report(rows: list[dict]) -> str:
    base = {(r["length"], r["target"]): r for r in rows if r["kind"] == "full"}
    lines = ["| target | T | kind | fwd+bwd ms | time / full | peak MiB | memory / full | attention FLOPs/token |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        b = base[(r["length"], r["target"])]
        mem_ratio = r["mib"] / b["mib"] if b["mib"] and b["mib"] == b["mib"] and b["mib"] > 0 else float("nan")
        lines.append(f"| {r['target']} | {r['length']} | {r['kind']} | {r['seconds'] * 1e3:.1f} | "
                     f"{r['seconds'] / b['seconds']:.2f} | {r['mib']:.0f} | {mem_ratio:.2f} | "
                     f"{r['flops_per_token'] / 1e6:.2f} M |")
    lines.append("")
    for target in TASKS:
        for kind in KINDS:
            if kind == "full":
                continue
            faster = [r["length"] for r in rows if r["target"] == target and r["kind"] == kind
                      and r["seconds"] < base[(r["length"], target)]["seconds"]]
            first = min(faster) if faster else None
            lines.append(f"{target}: {kind} first beats full at T = {first}" if first else
                         f"{target}: {kind} never beats full up to T = {max(r['length'] for r in rows)}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, target in enumerate(TASKS):
        for row, (key, label) in enumerate([("seconds", "forward+backward seconds"), ("mib", "peak memory, MiB")]):
            ax = axes[row][col]
            for kind in KINDS:
                pts = [(r["length"], r[key]) for r in rows if r["target"] == target and r["kind"] == kind]
                ax.plot(*zip(*pts, strict=True), marker="o", label=kind)
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label,
                   title=f"{'one attention layer' if target == 'layer' else 'one training step, 2-layer decoder'}")
            lengths = sorted({r["length"] for r in rows})
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.suptitle(f"attention cost on {os.cpu_count()} CPU cores (batch {BATCH}, d_model {D_MODEL}, {HEADS} heads)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    parser.add_argument("--plot", default="docs/attention_cost.png", help="PNG path ('' for none)")
    parser.add_argument("--json", default="", help="also write the rows here")
    parser.add_argument("--replot", default="", help="print the table and draw the plot of rows written by --json")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "LENGTH", "TARGET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
        child(args.child[0], int(args.child[1]), args.child[2])
        return
    if args.replot:
        with open(args.replot) as f:
            rows = json.load(f)
        print(report(rows))
        if args.plot:
            plot(rows, args.plot)
        return
    torch.set_num_threads(args.threads)
    print(f"attention cost: batch {BATCH}, d_model {D_MODEL}, {HEADS} heads, {args.threads} threads, torch "
          f"{torch.__version__}; kinds {', '.join(f'{k} {v}' if v else k for k, v in KINDS.items())}", flush=True)
    rows = measure(args.lengths, args.repeats, args.threads, not args.no_memory)
    print(report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
