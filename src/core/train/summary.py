"""train.py's last line: the metrics that fit the task, named so that no two read alike.

Language models: perplexity and bits per character (bits per token divided by the test text's characters per
token). Translation: BLEU from real decoding, and perplexity. Synthetic sequence tasks: exact match (decoded, when
validation decodes; and teacher-forced, where each position sees the true prefix) and token accuracy.
Classification (digits, images, is_sorted): accuracy.
"""

from __future__ import annotations

import math
from typing import Any


def family(task: Any) -> str:
    """"lm", "translation", "classification" or "synthetic": which metrics the summary shows."""
    from archsweep.core.data.tasks.images import ImageTask
    from archsweep.core.data.tasks.text import TextTask
    from archsweep.core.data.tasks.translation import TranslationTask

    if isinstance(task, TextTask):
        return "lm"
    if isinstance(task, TranslationTask):
        return "translation"
    if isinstance(task, ImageTask) or getattr(task, "n_classes", None):  # digits, images, is_sorted
        return "classification"
    return "synthetic"


def validation_keys(task: Any) -> tuple[str, ...]:
    """The validation metrics the console line shows: a language model's exact match over a window says nothing."""
    return {"lm": ("loss", "ppl"), "classification": ("loss", "acc")}.get(family(task), ("loss", "ppl", "acc",
                                                                                       "exact_match"))


def chars_per_token(task: Any, split: str = "test", limit: int = 100_000) -> float | None:
    """Characters per token of the first `limit` tokens of `split` (None without a running text)."""
    stream = task.token_stream(split)
    if stream is None or len(stream) == 0:
        return None
    ids = [int(i) for i in stream[:limit]]
    return len(task.decode(ids)) / len(ids)


def bits_per_char(loss: float, chars: float | None) -> float | None:
    if chars is None or chars <= 0 or not math.isfinite(loss):
        return None
    return loss / math.log(2) / chars


def metric_parts(kind: str, val: dict[str, float], test: dict[str, float], chars: float | None) -> list[str]:
    """The summary's metrics of a task `kind` (see `family`), from results.json's `val` and `test`."""
    def f(x: Any, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    if kind == "lm":
        bpc = bits_per_char(test.get("loss", math.nan), chars)
        return [f"test perplexity {f(test.get('ppl'), '.3f')}", f"bits per character {f(bpc, '.3f')}",
                f"val perplexity {f(val.get('ppl'), '.3f')}"]
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
    kind = family(task)
    chars = chars_per_token(task) if kind == "lm" else None
    parts = metric_parts(kind, results.get("val") or {}, results.get("test") or {}, chars)
    rate = results.get("tokens_per_s") or 0.0
    from archsweep.core.data.tasks.images import ImageTask

    unit = "images/s" if isinstance(task, ImageTask) else "tok/s"
    return (f"done in {results['wall_time_s']:.0f} s: {', '.join(parts)}, {rate:,.0f} {unit}; "
            f"results in {results_path}")
