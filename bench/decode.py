"""Decoding throughput: 256 new tokens, greedy, with and without the KV cache, against Hugging Face `generate`.

    python bench/decode.py [--batch 1] [--new 256] [--rounds 5]

Our model has the sizes of `conf/model/decoder_only.yaml` (d_model 64, 4 layers, 4 heads, d_ff 256) with GPT-2's
choices (pre-norm, learned positions, tanh GELU, tied embeddings) so that Hugging Face GPT-2 of the same sizes
is the same computation. The end token is set to one that never appears, so every run generates exactly `--new`
tokens. Rounds interleave the contenders; figures are medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from archsweep.core.eval.generation import DecodingConfig, generate
from archsweep.core.model.build import ModelConfig, build_model

V, D, H, L, FF, PROMPT = 65, 64, 4, 4, 256, 16


def ours(max_len: int) -> torch.nn.Module:
    return build_model(ModelConfig(kind="decoder_only", vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=FF,
                                   max_seq_len=max_len, dropout=0.0, norm="pre", pos="learned",
                                   ffn={"name": "gelu", "approximate": "tanh"}, scale_embedding=False,
                                   init="gpt2")).eval()


def hf(max_len: int):
    try:
        import transformers
    except ImportError:
        return None
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=max_len, n_embd=D, n_layer=L, n_head=H, n_inner=FF,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(cfg).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=256, help="new tokens per sequence")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    max_len = PROMPT + args.new
    prompt = torch.randint(1, V, (args.batch, PROMPT))
    never = V + 1  # an end token outside the vocabulary: generation always runs to --new tokens
    model = ours(max_len)
    contenders = {
        "archsweep cache": lambda: generate(model, prompt, None, DecodingConfig(max_new_tokens=args.new),
                                            eos_id=never, pad_id=0),
        "archsweep no cache": lambda: generate(model, prompt, None,
                                               DecodingConfig(max_new_tokens=args.new, use_cache=False),
                                               eos_id=never, pad_id=0),
    }
    reference = hf(max_len)
    if reference is None:
        print("(transformers not installed: pip install -e '.[bench]')")
    else:
        def run_hf():
            with torch.no_grad():
                return reference.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                          max_new_tokens=args.new, min_new_tokens=args.new, eos_token_id=None,
                                          pad_token_id=0)
        contenders["hf generate"] = run_hf
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}, prompt {PROMPT}, "
          f"{args.new} new tokens; D={D} L={L} H={H} FF={FF} V={V}")
    for fn in contenders.values():  # warm-up
        fn()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        for name, fn in (list(contenders.items())[::-1] if r % 2 else contenders.items()):
            start = time.perf_counter()
            fn()
            rates[name].append(args.batch * args.new / (time.perf_counter() - start))
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {rates[n][-1]:,.0f}" for n in rates), flush=True)
    median = {name: statistics.median(v) for name, v in rates.items()}
    base = median["archsweep cache"]
    print(f"\n{'decoder':<22}{'tokens/s':>12}{'ms/token':>10}{'archsweep cache / it':>22}")
    for name, rate in median.items():
        print(f"{name:<22}{rate:>12,.0f}{1e3 * args.batch / rate:>10.2f}{base / rate:>22.2f}")
    print(f"\ncache speed-up: {base / median['archsweep no cache']:.2f}x (target >= 3x)")
    if "hf generate" in median:
        print(f"ours / HF greedy: {base / median['hf generate']:.2f}x (target >= 2.5)")


if __name__ == "__main__":
    main()
