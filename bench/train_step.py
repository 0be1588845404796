"""Training-step throughput of our models against peers, measured in one process, interleaved.

    python bench/train_step.py            # full table (several minutes on 2 CPU cores, compile included)
    python bench/train_step.py --quick    # fewer rounds
    python bench/train_step.py --no-compile --skip-pos --skip-encdec   # the decoder-only eager table only
    python bench/train_step.py --mfu-check model=decoder_only task=shakespeare_char   # train.py's MFU vs a bare loop

Configuration (GPT sized down, as in nanoGPT's shakespeare_char): decoder-only, pre-norm, learned positions,
GELU, 6 layers, d_model 384, 6 heads, d_ff 1536, context 256, batch 8, vocabulary 65, fp32, AdamW. One step is
forward + cross-entropy + backward + AdamW step. The guard is `ReferenceGPT`, written below the way the leanest
single-file GPTs write it (one fused q/k/v projection, `is_causal=True` SDPA, no biases, tied head, pre-norm,
learned positions, GELU): our model built with the same choices (`bias=false`, `norm_bias=false`) must reach
>= 1.00x its tokens/s. Other peers (optional `bench` extra): a model from torch.nn.TransformerEncoderLayer, Hugging
Face GPT-2 with SDPA, x-transformers; `torch.compile`d copies of ours and of the reference (their compile time is
the warm-up, printed). The encoder-decoder kind is measured against torch.nn.Transformer (3 + 3 layers, source and
target 128 tokens). Rounds interleave the models so machine load affects all alike; tables give the median.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model, count_parameters

V, D, H, L, FF, T, B = 65, 384, 6, 6, 1536, 256, 8


def ours(pos: str = "learned", bias: bool = True, sizes: tuple[int, ...] = (V, D, H, L, FF, T)) -> nn.Module:
    v, d, h, n, ff, t = sizes
    return build_model(ModelConfig(kind="decoder_only", vocab_size=v, d_model=d, n_heads=h, n_layers=n, d_ff=ff,
                                   max_seq_len=t, dropout=0.0, norm="pre", pos=pos, ffn="gelu", bias=bias,
                                   norm_bias=bias, scale_embedding=False, init="gpt2"))


class ReferenceBlock(nn.Module):
    def __init__(self, d: int, h: int, ff: int) -> None:
        super().__init__()
        self.n_heads = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, ff, bias=False), nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, Dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class ReferenceGPT(nn.Module):
    """The leanest GPT, written here: fused q/k/v, is_causal SDPA, no biases, tied head, pre-norm, learned
    positions, GELU (nanoGPT's model.py with bias=False and dropout 0, without its generation code)."""

    def __init__(self, vocab: int = V, d: int = D, h: int = H, n_layers: int = L, ff: int = FF, t: int = T) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList(ReferenceBlock(d, h, ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


ED_LAYERS, ED_LEN = 3, 128  # encoder-decoder comparison: 3 + 3 layers, source and target of 128 tokens


def ours_encdec() -> nn.Module:
    return build_model(ModelConfig(kind="encoder_decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=ED_LAYERS,
                                   d_ff=FF, max_seq_len=ED_LEN, dropout=0.0, norm="post", pos="learned",
                                   ffn="relu", scale_embedding=False))


class TorchTransformer(nn.Module):
    """torch.nn.Transformer (post-norm, ReLU, biases) with the same embeddings, learned positions and tied head."""

    def __init__(self) -> None:
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(V, D), nn.Embedding(V, D)
        self.src_pos, self.tgt_pos = nn.Embedding(ED_LEN, D), nn.Embedding(ED_LEN, D)
        self.core = nn.Transformer(D, H, ED_LAYERS, ED_LAYERS, FF, dropout=0.0, batch_first=True)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(ED_LEN), persistent=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ED_LEN, device=src.device)
        h = self.core(self.src_emb(src) + self.src_pos(positions), self.tgt_emb(tgt) + self.tgt_pos(positions),
                      tgt_mask=self.causal, tgt_is_causal=True)
        return F.linear(h, self.tgt_emb.weight)


class TorchNNModel(nn.Module):
    """The same architecture from torch.nn.TransformerEncoderLayer (norm_first, causal mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.layers = nn.TransformerEncoder(layer, L, norm=nn.LayerNorm(D), enable_nested_tensor=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(T), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        h = self.layers(h, mask=self.causal, is_causal=True)
        return F.linear(h, self.wte.weight)


def hf_gpt2() -> nn.Module | None:
    try:
        import transformers
    except ImportError:
        return None
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=D, n_layer=L, n_head=H, n_inner=FF,
                                  activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(cfg)
    return Logits(model)


def x_transformers() -> nn.Module | None:
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError:
        return None
    return TransformerWrapper(num_tokens=V, max_seq_len=T, attn_layers=Decoder(dim=D, depth=L, heads=H, ff_mult=4,
                                                                                attn_flash=True))


class Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def make_step(model: nn.Module) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()

    def step(inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(*inputs).view(-1, V), y.view(-1))
        loss.backward()
        opt.step()

    return step


def matmul_gflops(seconds: float = 2.0) -> float:
    """fp32 matmul rate at the shape of the FFN up-projection (B*T x D) @ (D x FF)."""
    a, w = torch.randn(B * T, D), torch.randn(D, FF)
    for _ in range(3):
        a @ w
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ w
        n += 1
    return 2 * B * T * D * FF * n / (time.perf_counter() - start) / 1e9


def measure(models: dict[str, nn.Module], rounds: int, steps: int, encdec: bool = False,
            warmup: dict[str, float] | None = None) -> dict[str, float]:
    """Median tokens/s per model over interleaved rounds of `steps` training steps each (target tokens count).
    `warmup`, when given, receives each model's seconds for its 3 warm-up steps (compilation, for compiled ones)."""
    g = torch.Generator().manual_seed(0)
    if encdec:
        src, tgt, y = (torch.randint(0, V, (B, ED_LEN), generator=g) for _ in range(3))
        inputs: tuple[torch.Tensor, ...] = (src, tgt)
    else:
        x, y = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
        inputs = (x,)
    tokens = y.numel()
    stepper = {name: make_step(m) for name, m in models.items()}
    for name, step in stepper.items():  # warm-up: allocator, kernels, optimizer state, compilation
        start = time.perf_counter()
        for _ in range(3):
            step(inputs, y)
        if warmup is not None:
            warmup[name] = time.perf_counter() - start
    rates: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds):
        order = list(stepper.items())
        if r % 2:
            order.reverse()
        for name, step in order:
            start = time.perf_counter()
            for _ in range(steps):
                step(inputs, y)
            rates[name].append(tokens * steps / (time.perf_counter() - start))
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {rates[n][-1]:,.0f}" for n in models), flush=True)
    return {name: statistics.median(values) for name, values in rates.items()}


def flops_per_token(model: nn.Module) -> float:
    """6 N (weights, forward + backward) + 6 L T D (attention scores and context, causal half counted fully)."""
    n = count_parameters(model) - (T * D)  # the position table is a lookup, not a matmul
    return 6 * n + 12 * L * T * D


def mfu_check(overrides: list[str], steps: int) -> None:
    """The MFU train.py reports for a config against a bare loop (forward, loss, backward, clipping, AdamW; the
    batches drawn beforehand) on the same model, batches and peak, in this process; then train.py itself for the
    same steps. Both use the analytic count (archsweep.variants.flops); the 6 N + 12 L T D rule of thumb is
    printed beside it."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from archsweep.core.data.paths import cache_dir
    from archsweep.core.data.tasks.base import IGNORE_INDEX
    from archsweep.core.data.tasks.forward import flop_shape
    from archsweep.core.train.lifecycle.checks import build_task, model_config
    from archsweep.core.train.monitoring.compute import peak_flops, remeasure
    from archsweep.core.train.optimisers.optim import make_optimizer
    from archsweep.variants.flops import TRAIN_FACTOR, forward_flops

    root = Path(__file__).resolve().parents[1]
    with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    model = build_model(model_cfg).train()
    forward = task.forward_fn(model_cfg.kind)
    stream = iter(task.dataloader("train", model_cfg.kind, cfg.seed))
    batches = [next(stream) for _ in range(steps + 5)]
    opt = make_optimizer(model, OmegaConf.to_container(cfg.optim, resolve=True))

    def step(batch: dict) -> None:
        opt.zero_grad(set_to_none=True)
        logits = forward(model, batch)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def bare_seconds() -> float:
        for batch in batches[:5]:
            step(batch)
        start = time.perf_counter()
        for batch in batches[5:]:
            step(batch)
        return time.perf_counter() - start

    flops = sum(TRAIN_FACTOR * forward_flops(model, flop_shape(b)) for b in batches[5:])
    tokens = sum(b["n_tokens"] for b in batches[5:])
    cache = cache_dir(cfg.task.get("cache_dir"))
    remeasure(torch.device("cpu"), str(cfg.trainer.precision), cache)  # a fresh probe; the cache keeps the best
    peak = peak_flops(torch.device("cpu"), str(cfg.trainer.precision), cfg.trainer.get("peak_flops"), cache)
    shape = flop_shape(batches[5])
    rule = 6 * (count_parameters(model) - model_cfg.vocab_size * model_cfg.d_model) + 12 * model_cfg.n_layers * \
        shape.length * model_cfg.d_model
    print(f"{' '.join(overrides)}: {count_parameters(model):,} parameters, {flops / tokens:,.0f} training FLOPs per "
          f"token (6 N + 12 L T D: {rule:,.0f}); {peak.line()}")
    before = bare_seconds()
    print(f"bare loop, before: {tokens / before:,.0f} tokens/s, MFU {100 * flops / before / peak.flops:.1f}%  ({steps} "
          f"steps)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [*overrides, f"trainer.max_steps={steps}", "logger=csv", f"hydra.run.dir={tmp}/run",
                f"output_root={tmp}"]
        out = subprocess.run([sys.executable, str(root / "train.py"), *args], cwd=root, capture_output=True,
                             text=True)
        if out.returncode != 0:
            print(out.stderr[-2000:])
            raise SystemExit(f"train.py failed (exit {out.returncode})")
        results = json.loads((Path(tmp) / "run" / "results.json").read_text())
    print(f"train.py:          {results['tokens_per_s']:,.0f} tokens/s, MFU {100 * results['mfu']:.1f}%  "
          f"(results.json; {steps} steps, validation excluded)", flush=True)
    after = bare_seconds()
    print(f"bare loop, after:  {tokens / after:,.0f} tokens/s, MFU {100 * flops / after / peak.flops:.1f}%")
    bare = flops / ((before + after) / 2) / peak.flops  # the mean of the runs either side: load drift cancels
    print(f"train.py MFU / bare-loop MFU: {results['mfu'] / bare:.3f} (target: within 15%, 0.85 to 1.15)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="training steps per model per round")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1 step")
    parser.add_argument("--skip-pos", action="store_true", help="skip the positional-encoding table")
    parser.add_argument("--skip-encdec", action="store_true", help="skip encoder-decoder vs torch.nn.Transformer")
    parser.add_argument("--skip-peers", action="store_true", help="skip torch.nn, HF GPT-2 and x-transformers")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd copies")
    parser.add_argument("--mfu-check", nargs="*", metavar="OVERRIDE",
                        help="compare train.py's MFU for these train.py overrides with a bare loop, then exit")
    parser.add_argument("--mfu-steps", type=int, default=300, help="training steps of --mfu-check")
    args = parser.parse_args()
    if args.mfu_check is not None:
        mfu_check(args.mfu_check or ["model=decoder_only", "task=shakespeare_char"], args.mfu_steps)
        return
    if args.quick:
        args.rounds, args.steps = 3, 1
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={B} T={T} D={D} H={H} L={L} FF={FF} V={V}")
    peak = matmul_gflops()
    print(f"fp32 matmul rate ({B * T}x{D} @ {D}x{FF}): {peak:,.1f} GFLOP/s\n")
    decoder_table(args, peak)
    if not args.skip_encdec:
        encdec_table(args)
    if not args.skip_pos:
        pos_table(args)


def decoder_table(args: argparse.Namespace, peak: float) -> None:
    models: dict[str, nn.Module] = {"archsweep bias=true": ours(bias=True), "archsweep bias=false": ours(bias=False),
                                    "reference-gpt": ReferenceGPT()}
    if not args.no_compile:  # compiled during warm-up (a minute or more on 2 cores)
        models["archsweep compile"] = torch.compile(ours(bias=False))
        models["reference compile"] = torch.compile(ReferenceGPT())
    if not args.skip_peers:
        models["torch.nn"] = TorchNNModel()
        for name, factory in (("hf-gpt2-sdpa", hf_gpt2), ("x-transformers", x_transformers)):
            model = factory()
            if model is None:
                print(f"({name} not installed: pip install -e '.[bench]')")
            else:
                models[name] = model
    print("Decoder-only training step throughput (interleaved rounds):")
    warmup: dict[str, float] = {}
    rates = measure(models, args.rounds, args.steps, warmup=warmup)
    ours_rate = rates["archsweep bias=false"]
    print(f"\n{'model':<22}{'params':>12}{'tokens/s':>11}{'ms/step':>9}{'GFLOP/s':>9}{'% matmul':>10}"
          f"{'bias=false / it':>17}{'warm-up s':>11}")
    for name, rate in rates.items():
        gflops = rate * flops_per_token(models[name]) / 1e9
        print(f"{name:<22}{count_parameters(models[name]):>12,}{rate:>11,.0f}{B * T / rate * 1e3:>9.1f}"
              f"{gflops:>9.1f}{100 * gflops / peak:>9.0f}%{ours_rate / rate:>17.3f}{warmup[name]:>11.1f}")
    print(f"\nours (bias=false) / reference-gpt: {ours_rate / rates['reference-gpt']:.3f} (target >= 1.00)")
    if "archsweep compile" in rates:
        print(f"compile / eager (ours, bias=false): {rates['archsweep compile'] / ours_rate:.3f} (aim >= 1.1); "
              f"reference: {rates['reference compile'] / rates['reference-gpt']:.3f}; compile time = warm-up "
              f"{warmup['archsweep compile']:.0f} s (ours), {warmup['reference compile']:.0f} s (reference)")


def encdec_table(args: argparse.Namespace) -> None:
    print(f"\nEncoder-decoder ({ED_LAYERS} + {ED_LAYERS} layers, source and target {ED_LEN} tokens, post-norm, ReLU, "
          f"biases) vs torch.nn.Transformer, interleaved:")
    models = {"archsweep enc-dec": ours_encdec(), "torch.nn.Transformer": TorchTransformer()}
    rates = measure(models, args.rounds, args.steps, encdec=True)
    print(f"\n{'model':<22}{'params':>12}{'tokens/s':>11}{'ms/step':>9}")
    for name, rate in rates.items():
        print(f"{name:<22}{count_parameters(models[name]):>12,}{rate:>11,.0f}{B * ED_LEN / rate * 1e3:>9.1f}")
    print(f"ours / torch.nn.Transformer: {rates['archsweep enc-dec'] / rates['torch.nn.Transformer']:.3f} "
          f"(target >= 1.00)")


def pos_table(args: argparse.Namespace) -> None:
    encodings = ["learned", "sinusoidal", "relative", "rotary", "alibi", "none"]
    print("\nPositional encodings (ours), interleaved:")
    pos_rates = measure({p: ours(p) for p in encodings}, args.rounds, args.steps)
    print(f"\n{'pos':<12}{'tokens/s':>12}{'ms/step':>10}{'time vs learned':>17}")
    for pos, rate in pos_rates.items():
        print(f"{pos:<12}{rate:>12,.0f}{B * T / rate * 1e3:>10.1f}{pos_rates['learned'] / rate:>16.3f}x")
    print("target: relative and alibi within 1.3x of learned")


if __name__ == "__main__":
    main()
