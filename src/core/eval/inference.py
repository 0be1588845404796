"""What generate.py and evaluate.py do with a train.py checkpoint: rebuild the model and the task's codec from the
checkpoint alone, decode prompts, and evaluate test splits with teacher-forced and decoded metrics, overall and
by source-length bucket (which is where length generalisation shows). A language model (a text task) has no
sources and no whole sequences: its print-out is loss, perplexity and bits per byte per split."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn

from archsweep.core.data.codec import Codec, codec_from_state, codec_state_for
from archsweep.core.data.tasks.base import Task
from archsweep.core.data.tasks.known import check_task_target
from archsweep.core.eval.evaluation import IGNORE_INDEX, DecodeResults, decode_batch, decode_sample, strip
from archsweep.core.eval.generation import DecodingConfig, generate
from archsweep.core.eval.metrics import LengthTable, SplitMetrics, length_buckets, row_stats
from archsweep.core.model.checkpoint import model_from_checkpoint, read_checkpoint, resolve_checkpoint
from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, IMAGE, SOURCE_TARGET, form_of


@dataclass
class Loaded:
    path: Path
    model: nn.Module
    kind: str
    codec: Codec
    codec_state: dict[str, Any]
    config: dict[str, Any]  # the resolved train.py config of the run


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def decoding_config(cfg: DictConfig) -> DecodingConfig:
    """The composed `decoding` group as a DecodingConfig, its rules run (its schema checked the types when the
    config was composed; a plain node, e.g. a user's option that names no schema, is typed here)."""
    if OmegaConf.get_type(cfg) in (dict, None):
        cfg = OmegaConf.merge(OmegaConf.structured(DecodingConfig), cfg)
    return OmegaConf.to_object(cfg)


def refuse_images(loaded: Loaded, entry: str) -> None:
    """generate.py and evaluate.py read token-sequence checkpoints; an image classifier is refused with where its
    test metrics are instead of failing on a missing batch key."""
    if form_of(loaded.kind) == IMAGE:
        raise ValueError(f"ckpt={loaded.path}: kind={loaded.kind} classifies images; {entry}.py reads token-sequence "
                         f"models only. Its test metrics are in the run's results.json and "
                         f"confusion_matrix_test.json")


def load(value: str | Path, device: torch.device) -> Loaded:
    path = resolve_checkpoint(value, "evaluate")
    ckpt = read_checkpoint(path)
    model = model_from_checkpoint(ckpt, path)
    meta = ckpt["archsweep"]
    state = meta.get("codec") or codec_state_for(task_from_config(meta["config"]["task"], where=str(path)))
    return Loaded(path, model.to(device).eval(), model.config.kind, codec_from_state(state), state, meta["config"])


def task_from_config(task_cfg: dict[str, Any], where: str):
    """The task a checkpoint's stored task config describes. Its `_target_` must be one of the framework's tasks
    (`archsweep.core.data.tasks.known`): a file never chooses what is called. Nested `_target_`s are not built."""
    from hydra.utils import instantiate

    check_task_target(task_cfg, where)
    try:
        task = instantiate(OmegaConf.create(task_cfg), _recursive_=False)
    except Exception as e:  # Hydra wraps the constructor's TypeError / ValueError (a task.<field> it does not take)
        raise ValueError(f"task: {e.__cause__ or e}") from None
    if not isinstance(task, Task):
        raise ValueError(f"{where}: task._target_={task_cfg['_target_']} does not build a task")
    return task


def encode_prompts(loaded: Loaded, texts: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, L) inputs and mask; a prefix LM gets the separator after a sequence-to-sequence source."""
    state = loaded.codec_state
    rows = [loaded.codec.encode(t, "src") for t in texts]
    if form_of(loaded.kind) == CAUSAL and state["seq2seq"]:
        rows = [r + [state["sep_id"]] for r in rows]
    empty = [t for t, r in zip(texts, rows, strict=True) if not r]
    if empty:
        raise ValueError(f"prompt {empty[0]!r} encodes to no tokens; give at least one symbol")
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), max(state["pad_id"], 0), dtype=torch.long)  # -1: no pad id; masked
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in rows])
    return tokens.to(device), (torch.arange(width)[None, :] < lengths[:, None]).to(device)


ENTRY_KEYS = {"evaluate": ("ckpt", "task", "splits", "decode_limit", "buckets", "seed", "device", "output", "decoding",
                           "eval", "lm_eval"),
              "generate": ("ckpt", "prompt", "prompts", "device", "decoding")}  # conf/<entry>.yaml


def check_entry_keys(cfg: DictConfig, entry: str) -> None:
    """Refuse settings added with `+` that the entry point does not read (they would be ignored silently)."""
    extra = [k for k in cfg if k not in ENTRY_KEYS[entry]]
    if not extra:
        return
    key = extra[0]
    if key == "model":
        fields = ", ".join(f"model.{k}" for k in cfg.model) if isinstance(cfg.model, DictConfig) else "model"
        raise ValueError(f"{fields}: model settings do not apply in {entry}.py; the model is rebuilt from the "
                         f"checkpoint exactly as it was trained. Remove the +model... override (task.<field>=... "
                         f"changes the data{' it is evaluated on' if entry == 'evaluate' else ''})")
    raise ValueError(f"{key}: {entry}.py has no such setting, so it would be ignored; its settings are "
                     f"{', '.join(ENTRY_KEYS[entry])} (see {entry}.py --help)")


def run_generate(cfg: DictConfig) -> list[list[tuple[str, float]]]:
    check_entry_keys(cfg, "generate")
    texts = list(cfg.prompts) or ([cfg.prompt] if cfg.prompt is not None else [])
    if not texts:
        raise ValueError("give prompt=\"...\" or prompts='[\"...\", \"...\"]' to decode from")
    decoding = decoding_config(cfg.decoding)
    device = pick_device(cfg.device)
    loaded = load(cfg.ckpt, device)
    refuse_images(loaded, "generate")
    if form_of(loaded.kind) == BIDIRECTIONAL:
        raise ValueError(f"{loaded.path} holds an {loaded.kind} model, which is bidirectional and does not "
                         f"generate; use evaluate.py for its metrics")
    state = loaded.codec_state
    inputs, mask = encode_prompts(loaded, texts, device)
    out = generate(loaded.model, inputs, mask, decoding, eos_id=state["eos_id"], pad_id=state["pad_id"],
                   bos_id=state["bos_id"])
    results = []
    for i, text in enumerate(texts):
        print(f"> {text}")
        hyps = []
        for j in range(out.tokens.shape[1]):
            ids = strip(out.tokens[i, j].tolist(), state["eos_id"], state["pad_id"])
            decoded = loaded.codec.decode(ids, "tgt")
            shown = decoded if state["seq2seq"] else text + decoded  # a language model continues the prompt
            hyps.append((shown, float(out.scores[i, j])))
            print(f"  {shown}" + (f"    (score {out.scores[i, j]:.3f})" if out.tokens.shape[1] > 1 else ""))
        results.append(hyps)
    return results


def source_lengths(batch: dict[str, Any], kind: str) -> torch.Tensor:
    """(B,) source length of each row of a batch without `src_len` (which the tasks' batches carry, and which
    training's by-length table reads): real source tokens, or a prefix LM's tokens before the separator."""
    labels = batch["labels"]
    if form_of(kind) == SOURCE_TARGET:
        src = batch["src"]
        return batch["src_mask"].sum(1) if batch["src_mask"] is not None else torch.full_like(src[:, 0], src.shape[1])
    if form_of(kind) == CAUSAL:
        labelled = labels != IGNORE_INDEX
        return labelled.float().argmax(1).long()  # the separator's position = source length
    tokens = batch["tokens"]
    return batch["pad_mask"].sum(1) if batch["pad_mask"] is not None else torch.full_like(tokens[:, 0],
                                                                                         tokens.shape[1])


def evaluate_split(loaded: Loaded, task, split: str, decoding: DecodingConfig, decode_limit: int | None,
                   seed: int, device: torch.device) -> tuple[dict[str, Any], LengthTable, DecodeResults | None]:
    """(summary, counts by source length, decoded examples) of one split. The teacher-forced metrics are
    train.py's (`archsweep.core.eval.metrics`), over every row: loss, ppl, acc, exact_match_teacher_forced. Decoded:
    `decoded` rows (all, or the `decode_limit` sample), exact_match_decoded and (text tasks) bleu. `exact_match` is
    the decoded one where the split decodes, else the teacher-forced one. The length table counts a decoded row's
    decoded exact match when every row is decoded, else the teacher-forced one (one kind per table)."""
    state, kind = loaded.codec_state, loaded.kind
    forward = task.forward_fn(kind)
    decodes = state["seq2seq"] and form_of(kind) != BIDIRECTIONAL
    results = DecodeResults(keep_examples=3) if decodes else None
    metrics, lengths = SplitMetrics(task.token_bytes(kind)).to(device), LengthTable(task.max_input_len(kind)).to(device)
    forced_lengths = LengthTable(task.max_input_len(kind)).to(device)  # the table when only a sample is decoded
    sample = decode_sample(task.dataloader(split, kind, seed), decode_limit) if decodes else None
    with torch.no_grad():
        for index, batch in enumerate(task.dataloader(split, kind, seed)):
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            stats = row_stats(forward(loaded.model, batch), batch["labels"])
            metrics.update(stats, batch["labels"])
            if sample is not None and sample[index]:
                rows = sample[index]
                decoded = decode_batch(loaded.model, batch, kind, decoding, pad_id=state["pad_id"],
                                       bos_id=state["bos_id"], eos_id=state["eos_id"], to_text=loaded.codec.decode,
                                       results=results, rows=rows)
            src_len = batch["src_len"] if "src_len" in batch else source_lengths(batch, kind)
            forced_lengths.update(stats, src_len)
            if sample is not None and sample[index]:
                exact = stats.exact.clone()
                exact[rows] = torch.tensor(decoded, dtype=torch.bool, device=exact.device)
                stats = dataclasses.replace(stats, exact=exact)
            lengths.update(stats, src_len)
    summary = {"n": int(metrics.exact_match.rows), **{k: float(v) for k, v in metrics.compute().items()}}
    every_row = results is not None and results.total == summary["n"]
    if not every_row:
        lengths = forced_lengths
    summary["exact_match_teacher_forced"] = summary["exact_match"]
    if results is not None and results.total:
        summary["decoded"] = results.total
        summary["exact_match_decoded"] = summary["exact_match"] = results.exact_match()
        if state["type"] == "tokenizer":
            summary["bleu"] = results.bleu()
    summary["length_table_exact_match"] = "decoded" if every_row else "teacher_forced"
    return summary, lengths, results



def length_table(split: str, lengths: LengthTable, buckets: int) -> list[dict[str, Any]]:
    """Rows grouped into `buckets` equal-width ranges of source length."""
    return [{"split": split, "lengths": [first, last], **summary}
            for first, last, summary in length_buckets(lengths.compute(), buckets)]


def run_evaluate(cfg: DictConfig) -> dict[str, Any]:
    check_entry_keys(cfg, "evaluate")
    if cfg.get("lm_eval") is not None and cfg.lm_eval.tasks is not None:
        return run_lm_eval(cfg)
    decoding = decoding_config(cfg.decoding)
    device = pick_device(cfg.device)
    loaded = load(cfg.ckpt, device)
    refuse_images(loaded, "evaluate")
    task_cfg = OmegaConf.merge(OmegaConf.create(loaded.config["task"]), cfg.task)
    task = task_from_config(OmegaConf.to_container(task_cfg, resolve=True), where=str(loaded.path))
    splits = list(cfg.splits) if cfg.splits is not None else list(task.test_splits)
    report: dict[str, Any] = {"checkpoint": str(loaded.path), "kind": loaded.kind,
                              "decoding": OmegaConf.to_container(cfg.decoding), "splits": {}, "by_length": []}
    setting = setting_name(OmegaConf.to_container(cfg.decoding, resolve=True), cfg.decode_limit)
    report["setting"] = setting
    language_model = task.family == "lm"
    for split in splits:
        start = time.time()
        print(f"evaluating {split} ...", flush=True)
        summary, lengths, results = evaluate_split(loaded, task, split, decoding, cfg.decode_limit, cfg.seed,
                                                   device)
        if language_model:  # windows of running text: no sources to bucket, no whole sequence to match
            report["splits"][split] = lm_summary(summary)
        else:
            report["splits"][split] = summary
            report["by_length"] += length_table(split, lengths, cfg.buckets)
        for source, reference, prediction in (results.examples if results else []):
            print(f"  src: {source}\n  ref: {reference}\n  out: {prediction}")
        print(f"  {summary['n']} windows in {time.time() - start:.1f}s" if language_model else
              f"  {summary['n']} examples in {time.time() - start:.1f}s", flush=True)
    if language_model:
        print_lm_table(report["splits"])
    else:
        print_split_table(report["splits"], decoding.strategy)
        print_length_table(report["by_length"], report["splits"])
    if cfg.eval.context_lengths is not None:
        from archsweep.core.eval.context import evaluate_contexts

        lengths = OmegaConf.to_container(cfg.eval.context_lengths) if isinstance(cfg.eval.context_lengths, ListConfig) \
            else cfg.eval.context_lengths
        report["by_context"] = evaluate_contexts(loaded.model, task, cfg.eval.context_split, lengths, cfg.eval.stride,
                                                 cfg.eval.context_tokens)
    output = Path(cfg.output) if cfg.output else loaded.path.with_suffix(f".eval.{setting}.json")
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(output)
    print(f"results written to {output}")
    return report


def run_lm_eval(cfg: DictConfig) -> dict[str, Any]:
    """evaluate.py lm_eval.tasks=[...]: lm-evaluation-harness's tasks on the checkpoint (the `archsweep` model of
    `archsweep.core.eval.harness`), its table printed, its results written beside the checkpoint."""
    try:
        from archsweep.core.eval.harness import evaluate_tasks
    except ImportError as e:
        raise ValueError(f"lm_eval.tasks needs lm-evaluation-harness ({e}); pip install -e \".[eval]\"") from None
    path = resolve_checkpoint(cfg.ckpt, "evaluate")
    lm = cfg.lm_eval
    tasks = [lm.tasks] if isinstance(lm.tasks, str) else list(lm.tasks)
    report, table = evaluate_tasks(path, tasks, lm.include_path, lm.batch_size, lm.limit, str(cfg.device))
    print(table)
    output = Path(cfg.output) if cfg.output else path.with_suffix(".lm_eval.json")
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    tmp.replace(output)
    print(f"results written to {output}")
    return report


def setting_name(decoding: dict[str, Any], decode_limit: int | None) -> str:
    """The decoding setting in a file name: the strategy, each field that differs from its conf/decoding yaml
    (`beam-beam_size8`, `sample-temperature0.7-top_k50`), and `-limit<N>` with a decode_limit."""
    from archsweep import conf_dir

    strategy = str(decoding.get("strategy", "greedy"))
    defaults_file = conf_dir() / "decoding" / f"{strategy}.yaml"
    given = OmegaConf.to_container(OmegaConf.load(defaults_file)) if defaults_file.is_file() else {}
    defaults = {**dataclasses.asdict(DecodingConfig()), **given}  # as composed: the schema's defaults, the yaml's
    parts = [strategy] + [f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in decoding.items()
                          if k not in ("strategy", "use_cache", "n_best") and defaults.get(k) != v]
    if decode_limit is not None:
        parts.append(f"limit{decode_limit}")
    return "-".join(parts)


def lm_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A language model's split metrics: loss, perplexity, token accuracy and bits per byte (not for a masked
    language model, whose loss covers only the masked tokens)."""
    return {k: summary[k] for k in ("n", "loss", "ppl", "acc", "bpb") if k in summary}


def print_lm_table(splits: dict[str, dict[str, Any]]) -> None:
    """One row per split of a language model: windows, loss (nats per token), perplexity, next-token accuracy and
    bits per byte."""
    bpb = any("bpb" in s for s in splits.values())
    print(f"\n{'split':<12}{'windows':>8}{'loss':>9}{'ppl':>10}{'acc':>7}" + (f"{'bpb':>8}" if bpb else ""))
    for split, s in splits.items():
        bits = (f"{s['bpb']:>8.3f}" if "bpb" in s else f"{'-':>8}") if bpb else ""
        print(f"{split:<12}{s['n']:>8}{s['loss']:>9.4f}{s['ppl']:>10.3f}{s['acc']:>7.3f}{bits}")


def print_split_table(splits: dict[str, dict[str, Any]], strategy: str) -> None:
    """One row per split: teacher-forced metrics over every example, then the decoded ones over those decoded."""
    print(f"\n{'':<12}{'teacher-forced (every example)':^40}  {f'decoded ({strategy})':^32}")
    print(f"{'split':<12}{'n':>6}{'loss':>9}{'ppl':>9}{'acc':>7}{'exact':>9}  {'decoded':>9}{'exact':>9}{'BLEU':>9}")
    for split, s in splits.items():
        dec = (f"{s['decoded']:>9}{s['exact_match_decoded']:>9.3f}"
               + (f"{s['bleu']:>9.2f}" if "bleu" in s else f"{'-':>9}")) if "decoded" in s else f"{'not decoded':>27}"
        print(f"{split:<12}{s['n']:>6}{s['loss']:>9.4f}{s['ppl']:>9.3f}{s['acc']:>7.3f}"
              f"{s['exact_match_teacher_forced']:>9.3f}  {dec}")
    partial = {k: s for k, s in splits.items() if "decoded" in s and s["decoded"] < s["n"]}
    for split, s in partial.items():
        print(f"{split}: {s['decoded']} of {s['n']} examples decoded (decode_limit); teacher-forced metrics use all")


def print_length_table(table: list[dict[str, Any]], splits: dict[str, dict[str, Any]] | None = None) -> None:
    kinds = {s.get("length_table_exact_match") for s in (splits or {}).values()}
    label = "exact (decoded)" if kinds == {"decoded"} else "exact (t-forced)" if kinds == {"teacher_forced"} \
        else "exact match"
    print(f"\n{'split':<12}{'source length':>15}{'n':>7}{'loss':>9}{'acc':>8}{label:>17}")
    for row in table:
        a, b = row["lengths"]
        span = f"{a}" if a == b else f"{a}-{b}"
        print(f"{row['split']:<12}{span:>15}{row['n']:>7}{row['loss']:>9.4f}{row['acc']:>8.3f}"
              f"{row['exact_match']:>17.3f}")
