"""train.py's last line: the metrics that fit the task, named so that no two read alike.

Language models: loss, perplexity and bits per UTF-8 byte (`bpb`: the loss in bits over the bytes of the text
the evaluated tokens stand for, which compares tokenizers fairly); no exact match, which says nothing of a
language model. Translation: BLEU from real decoding, and perplexity. Synthetic sequence tasks: exact match
(decoded, when validation decodes; and teacher-forced, where each position sees the true prefix) and token
accuracy. Classification (digits, images, is_sorted): accuracy.
"""

from __future__ import annotations

from typing import Any


def family(task: Any) -> str:
    """"lm", "translation", "classification" or "synthetic": the metrics the summary shows, as the task declares
    (`Task.family`)."""
    from archsweep.core.data.tasks.base import FAMILIES

    declared = getattr(task, "family", None)
    if declared not in FAMILIES:
        raise ValueError(f"task {type(task).__name__} declares no family (family={declared!r}): set the class "
                         f"attribute family to one of {', '.join(FAMILIES)}")
    return declared


def validation_keys(task: Any) -> tuple[str, ...]:
    """The validation metrics the console line shows: a language model's exact match over a window says nothing."""
    return {"lm": ("loss", "ppl", "bpb"), "classification": ("loss", "acc")}.get(family(task), ("loss", "ppl", "acc",
                                                                                       "exact_match"))


def bits_parts(split: str, metrics: dict[str, Any]) -> list[str]:
    """A language model's bits per byte in a split's metrics, as the summary shows it (none for a masked language
    model, whose loss covers only the masked tokens)."""
    return [f"{split} bits per byte {metrics['bpb']:.3f}"] if "bpb" in metrics else []


def metric_parts(kind: str, val: dict[str, float], test: dict[str, float]) -> list[str]:
    """The summary's metrics of a task `kind` (see `family`), from results.json's `val` and `test`."""
    def f(x: Any, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    if kind == "lm":
        parts = []
        for split, metrics in (("test", test), ("val", val)):
            parts += [f"{split} loss {f(metrics.get('loss'), '.4f')}",
                      f"{split} perplexity {f(metrics.get('ppl'), '.3f')}", *bits_parts(split, metrics)]
        return parts
    if kind == "translation":
        return [f"val BLEU {f(val.get('bleu'), '.2f')} (decoded)", f"test perplexity {f(test.get('ppl'), '.3f')}",
                f"val perplexity {f(val.get('ppl'), '.3f')}"]
    if kind == "classification":
        parts = [f"test accuracy {f(test.get('acc'), '.4f')}"]
        if "top5_acc" in test:
            parts.append(f"test top-5 accuracy {f(test['top5_acc'], '.4f')}")
        return parts + [f"val accuracy {f(val.get('acc'), '.4f')}"]
    parts = []
    if "decoded_exact_match" in val:
        parts.append(f"val exact match {f(val['decoded_exact_match'], '.4f')} (decoded)")
    return parts + [f"test exact match {f(test.get('exact_match'), '.4f')} (teacher-forced)",
                    f"test token accuracy {f(test.get('acc'), '.4f')}"]


def summary_line(task: Any, results: dict[str, Any], results_path: Any) -> str:
    parts = metric_parts(family(task), results.get("val") or {}, results.get("test") or {})
    rate, unit = results.get("tokens_per_s") or 0.0, getattr(task, "rate_unit", "tok/s")
    return (f"done in {results['wall_time_s']:.0f} s{time_parts(results)}: {', '.join(parts)}, {rate:,.0f} {unit}; "
            f"results in {results_path}")


def time_parts(results: dict[str, Any]) -> str:
    """Where the job's time went: start-up to the first step, training, its validations, the final evaluation."""
    parts = [(name, results.get(key)) for name, key in (("first step at", "time_to_first_step_s"),
                                                        ("training", "train_time_s"), ("validation", "val_time_s"),
                                                        ("final evaluation", "eval_time_s"))]
    shown = [f"{name} {value:.0f} s" for name, value in parts if value is not None]
    return f" ({', '.join(shown)})" if shown else ""
