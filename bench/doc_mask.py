"""What document masking costs: a decoder_only training step (forward + backward) with doc_ids against the same
step without, interleaved in one process.

    python bench/doc_mask.py [--context 256] [--batch 8] [--doc-len 64] [--rounds 7] [--steps 3] [overrides]

The model is conf/model/decoder_only.yaml as composed (model.* overrides apply, e.g. attention=sliding_window),
with max_seq_len raised to the context. Rows are random tokens cut into documents of random lengths around
--doc-len. Without doc_ids the causal mask is SDPA's `is_causal`; with them it is a boolean (B, 1, T, T) mask,
so SDPA takes its masked kernel. Prints the median time of a step of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import archsweep.core.train.config.schemas  # noqa: F401  (registers the schemas train.yaml names)
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.config import check_doc_mask


def random_documents(batch: int, context: int, mean_len: int, generator: torch.Generator) -> torch.Tensor:
    """(B, T) non-decreasing doc ids: each row cut at random into documents of 1 .. 2 mean_len - 1 tokens."""
    lengths = torch.randint(1, 2 * mean_len, (batch, context), generator=generator)
    ends = lengths.cumsum(dim=1)  # (B, T) document ends; more than enough documents to fill a row
    return torch.searchsorted(ends, torch.arange(context).expand(batch, context).contiguous(), right=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--doc-len", type=int, default=64, help="mean document length in tokens")
    parser.add_argument("--vocab", type=int, default=65)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per form per round")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. attention=sliding_window")
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=decoder_only", *args.overrides])
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    fields.pop("init_from", None)  # a train.py setting (model.init_from), not a ModelConfig field
    fields.update(vocab_size=args.vocab, max_seq_len=max(args.context, fields["max_seq_len"]))
    model_cfg = ModelConfig.from_dict(fields)
    check_doc_mask(model_cfg)
    torch.manual_seed(0)
    model = build_model(model_cfg).train()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=gen)
    doc_ids = random_documents(args.batch, args.context, args.doc_len, gen)
    x, labels = tokens[:, :-1], tokens[:, 1:]

    def step(docs: torch.Tensor | None) -> None:
        model.zero_grad(set_to_none=True)
        logits = model(x, doc_ids=docs)
        F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()

    forms = {"without doc_ids": None, "with doc_ids": doc_ids}
    for docs in forms.values():  # warm-up
        step(docs)
    times: dict[str, list[float]] = {name: [] for name in forms}
    for r in range(args.rounds):
        for name, docs in forms.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step(docs)
            times[name].append((time.perf_counter() - start) / args.steps)
        print(f"round {r + 1}/{args.rounds}", flush=True)
    n_docs = float((doc_ids[:, 1:] != doc_ids[:, :-1]).sum(1).float().mean()) + 1
    print(f"decoder_only d_model={model_cfg.d_model} n_layers={model_cfg.n_layers} attention="
          f"{model_cfg.choice('attention')} pos={model_cfg.choice('pos')}, batch {args.batch} x {args.context} tokens, "
          f"{n_docs:.1f} documents per row, {torch.get_num_threads()} threads")
    base = statistics.median(times["without doc_ids"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>16}: {median * 1e3:8.2f} ms per step (median of {args.rounds}), ratio {median / base:.3f}")


if __name__ == "__main__":
    main()
