"""Training-step time of `ffn=moe` against the dense model at equal active FLOPs per token, in one process, and the
grouped matmul of the experts against a per-expert loop.

    python bench/moe.py            # 5 interleaved rounds
    python bench/moe.py --rounds 9 --threads 2

Model: decoder-only, pre-norm, rotary, 4 layers, d_model 256, 4 heads, context 256, batch 8, vocabulary 65, fp32,
AdamW; dense: SwiGLU with d_ff 1024; MoE: 8 experts, top-2, SwiGLU experts, d_ff solved (`match_field`, as
`match_flops` does) so the training FLOPs per token equal the dense model's. One step is forward + cross-entropy
+ balancing and z losses + backward + AdamW step + the router's step update. Rounds interleave the models so the
machine's load affects both alike; the table gives medians.

Experts alone: 8 SwiGLU experts (d_model 256, hidden from the matched model) on 4,096 token slots routed at random,
forward + backward, in bfloat16 (the dtype whose grouped kernels torch provides on every device and under compile;
in float32 the MoE runs the loop), `grouped_mm` against one `F.linear` per expert.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from archsweep.core.model.build import ModelConfig, build_model, count_parameters, flops_per_token, match_field
from archsweep.variants.ffn.experts import Experts
from archsweep.variants.flops import Shape
from archsweep.variants.hooks import collect_aux_losses, step_updates

V, D, H, L, FF, T, B = 65, 256, 4, 4, 1024, 256, 8
MOE = {"name": "moe", "n_experts": 8, "top_k": 2}


def config(ffn: object, d_ff: int = FF) -> ModelConfig:
    return ModelConfig(kind="decoder_only", vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=d_ff, max_seq_len=T,
                       dropout=0.0, norm="pre", pos="rotary", ffn=ffn, bias=False, init="gpt2")


def train_step(cfg: ModelConfig) -> Callable[[], None]:
    torch.manual_seed(0)
    model = build_model(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))

    def step() -> None:
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        for weight, value in collect_aux_losses(model, y != -100).values():
            loss = loss + weight * value
        loss.backward()
        step_updates(model)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def experts_step(hidden: int, grouped: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    experts = Experts(8, D, hidden, F.silu, gated=True, dropout=0.0, bias=False).to(torch.bfloat16)
    experts.grouped = grouped
    slots = 4096
    counts = torch.bincount(torch.randint(0, 8, (slots,)), minlength=8)
    x = torch.randn(slots, D, dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        experts(x, counts).float().square().mean().backward()

    return step


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def race(steps: dict[str, Callable[[], None]], rounds: int, reps: int) -> dict[str, float]:
    for fn in steps.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            times[name].append(sum(timed(fn) for _ in range(reps)) / reps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    shape = Shape(B, T, causal=True)
    dense = config("swiglu")
    target = flops_per_token(dense, shape)
    sparse, found = match_field(config(MOE), target, lambda c: flops_per_token(c, shape), "match_flops")
    hidden = build_model(sparse).decoder.blocks[0].ffn.hidden_size
    print(f"torch {torch.__version__}, {args.threads} thread(s); B={B}, T={T}, d_model={D}, {L} layers")
    print(f"dense swiglu d_ff={FF}: {target / 1e6:.2f} MFLOPs/token (training), "
          f"{count_parameters(build_model(dense)):,} params")
    moe_model = build_model(sparse)
    print(f"moe 8x top-2 d_ff={sparse.d_ff} (expert hidden {hidden}): {found / 1e6:.2f} MFLOPs/token "
          f"({(found - target) / target:+.2%}), {count_parameters(moe_model):,} params, "
          f"{count_parameters(moe_model, count='active'):,} active")

    step = race({"dense": train_step(dense), "moe": train_step(sparse)}, args.rounds, reps=1)
    print(f"training step, fp32: dense {step['dense'] * 1e3:.0f} ms, moe {step['moe'] * 1e3:.0f} ms, "
          f"ratio {step['moe'] / step['dense']:.2f}x")

    exp = race({"grouped": experts_step(hidden, True), "loop": experts_step(hidden, False)}, args.rounds, reps=3)
    print(f"experts fwd+bwd, bf16, 4096 slots: grouped_mm {exp['grouped'] * 1e3:.1f} ms, per-expert loop "
          f"{exp['loop'] * 1e3:.1f} ms, loop / grouped {exp['loop'] / exp['grouped']:.2f}x")


if __name__ == "__main__":
    main()
