"""What training needs from a data source, independent of the model architecture.

A `Task` says how large its vocabulary is, which token ids are special, which data forms it can feed (a model
kind reads one form: `SOURCE_TARGET`, `CAUSAL` or `BIDIRECTIONAL`, see `archsweep.variants.model`), and how
long their inputs get; it checks a `ModelConfig` against that before anything heavy is imported. It then hands
out dataloaders whose batches are already in the form one model kind takes (decided on the CPU, so the training
step never inspects device tensors), plus the function that runs a model on such a batch.

Constructing a task must stay cheap and import no torch: train.py validates a config with it in well under a
second. Data (torch) is only touched in `dataloader`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from archsweep.core.model.config import ModelConfig
from archsweep.variants.flops import Shape
from archsweep.variants.model import FORMS, IMAGE, SOURCE_TARGET, form_of, kinds_of

if TYPE_CHECKING:
    from pathlib import Path

    from torch import Tensor, nn

SPLITS = ("train", "val", "test")
# What a task's runs report (the console summary, results.json's task_family, compare.py's default columns):
# lm: loss, perplexity, bits per byte; translation: BLEU and perplexity; classification: accuracy; synthetic:
# exact match and token accuracy. A task declares its family; nothing infers it from the task's class.
FAMILIES = ("lm", "translation", "classification", "synthetic")
IGNORE_INDEX = -100  # label value ignored by the loss and the metrics


class Task:
    """Base class. Subclasses set the attributes below and implement `max_input_len` and `dataloader`."""

    name: str = "task"
    forms: tuple[str, ...] = FORMS  # data forms (of model kinds) this task can feed
    vocab_size: int
    src_vocab_size: int | None = None  # source vocabulary if different (encoder_decoder only)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    sep_id: int = 3
    batch_size: int = 1
    test_splits: tuple[str, ...] = ("test",)  # evaluated after training, each reported as `<split>/...` metrics
    family: str  # one of FAMILIES: which metrics the task's runs report
    rate_unit: str = "tok/s"  # what the throughput counts

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("family")
        if declared is not None and declared not in FAMILIES:
            raise TypeError(f"task class {cls.__name__} declares family={declared!r}; choose one of "
                            f"{', '.join(FAMILIES)}")

    def max_input_len(self, kind: str) -> int:
        """Longest sequence a model of `kind` receives from this task (source or target, or packed)."""
        raise NotImplementedError

    def model_fields(self) -> dict[str, Any]:
        """ModelConfig fields the task dictates."""
        return {"vocab_size": self.vocab_size, "src_vocab_size": self.src_vocab_size}

    def check_kind(self, kind: str) -> None:
        """Raise ValueError if this task cannot feed a model of `kind` (checked before the model's own fields,
        which the task would otherwise fill for a kind it cannot serve)."""
        form = form_of(kind)
        if form not in self.forms:
            why = f"kind={kind} reads images, and this task feeds token sequences" if form == IMAGE else \
                self.why_not(kind)
            raise ValueError(f"task={self.name} cannot feed model kind={kind}: {why}; "
                             f"choose model= one of {', '.join(self.kinds())}")

    def check_model(self, cfg: ModelConfig) -> None:
        """Raise ValueError if a model built from `cfg` cannot be trained on this task."""
        self.check_kind(cfg.kind)
        if cfg.vocab_size < self.vocab_size:
            raise ValueError(f"model.vocab_size={cfg.vocab_size} is smaller than task={self.name}'s vocabulary "
                             f"({self.vocab_size}); leave model.vocab_size=null to take it from the task")
        longest = self.max_input_len(cfg.kind)
        limit = cfg.position_limit()
        if limit is not None and longest > limit:
            raise ValueError(f"model.max_seq_len={cfg.max_seq_len} is shorter than the longest input of "
                             f"task={self.name} for kind={cfg.kind} ({longest} tokens) and pos={cfg.choice('pos')} has "
                             f"a table of max_seq_len positions; set model.max_seq_len>={longest}")

    def kinds(self) -> list[str]:
        """The model kinds this task can feed."""
        return kinds_of(self.forms)

    def why_not(self, kind: str) -> str:
        return f"it serves only {', '.join(self.kinds())}"

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        """Batches for `split` in the form `kind` takes. `start` is the number of batches this process has
        already consumed (resuming); `rank`/`world_size` shard the data across data-parallel processes."""
        raise NotImplementedError

    def flop_shape(self, kind: str) -> Shape:
        """The batch shape FLOP matching and budgets plan with: a training batch at the longest input (exact for
        fixed-length tasks such as the language models; an upper bound where lengths vary). The logged figures
        count every batch at its own shape."""
        longest, form = self.max_input_len(kind), form_of(kind)
        if form == IMAGE:
            return Shape(self.batch_size, 0)
        if form == SOURCE_TARGET:
            return Shape(self.batch_size, longest, memory=longest)
        return Shape(self.batch_size, longest)

    def save(self, run_dir: str | Path) -> None:
        """Write what a run needs to read its outputs back (a tokenizer) into the run directory (str or Path)."""

    def token_stream(self, split: str) -> Any:
        """The split as one running text of token ids (a 1-D array), for evaluation at any context length; None
        for tasks made of separate examples."""
        return None

    def token_bytes(self, kind: str) -> Tensor | None:
        """(vocab_size,) UTF-8 bytes of the text each id stands for, where a model of `kind` predicts every token
        of a running text: the denominator of bits per byte (`<split>/bpb`). None (the default) logs no bpb."""
        return None

    def forward_fn(self, kind: str) -> Callable[[nn.Module, dict[str, Any]], Tensor]:
        """The function running a model of `kind` on one of this task's batches, returning logits (B, T, V)
        aligned with batch["labels"] (B, T)."""
        from archsweep.core.data.tasks.forward import FORWARD

        return FORWARD[form_of(kind)]
