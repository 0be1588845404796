"""An lm-evaluation-harness model backed by a train.py checkpoint, without conversion (Gao et al., "The Language
Model Evaluation Harness", EleutherAI): registered as `archsweep`, it answers lm-eval's three request kinds
(loglikelihood, rolling loglikelihood, generate-until) with the run's own model, tokenizer and KV-cache decoding,
tokenizing and windowing as lm-eval's Hugging Face backend does, so both give the same scores on an exported
model. Needs the `eval` extra (`pip install -e ".[eval]"`).

    python -m archsweep.core.eval.harness --model archsweep --model_args ckpt=outputs/runs/<time> \\
        --tasks hellaswag,arc_easy --batch_size 16
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import lm_eval.models  # noqa: F401  (lm-eval fills its registry with its own models only while it is empty)
import torch
import torch.nn.functional as F
from lm_eval import utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from archsweep.core.data.codec import TokenizerCodec, codec_from_state
from archsweep.core.eval.generation import DecodingConfig, generate
from archsweep.core.model.checkpoint import model_from_checkpoint, read_checkpoint, resolve_checkpoint
from archsweep.variants.model import CAUSAL, form_of, kinds_of


@register_model("archsweep")
class ArchsweepLM(TemplateLM):
    backend = "causal"

    def __init__(self, ckpt: str, batch_size: int | str = 8, device: str = "auto",
                 max_batch_size: int | None = None) -> None:  # max_batch_size: lm-eval passes it; batch_size=auto is 8
        super().__init__()
        path = resolve_checkpoint(ckpt, "evaluate")
        state = read_checkpoint(path)
        if str(device).startswith("cuda") and not torch.cuda.is_available():  # lm-eval's default is cuda:0
            logging.getLogger(__name__).warning(f"device={device}, but there is no CUDA device: on the CPU")
            device = "cpu"
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        self.model = model_from_checkpoint(state, path).to(self._device).eval()
        cfg = self.model.config
        if form_of(cfg.kind) != CAUSAL:
            raise ValueError(f"ckpt={path}: lm-eval scores causal language models; this one is kind={cfg.kind} "
                             f"(train with model={' or '.join(kinds_of((CAUSAL,)))})")
        codec = state["archsweep"].get("codec") or {}
        text = codec_from_state(codec) if codec.get("type") == "tokenizer" else None
        if not isinstance(text, TokenizerCodec) or codec.get("seq2seq"):
            raise ValueError(f"ckpt={path}: lm-eval tasks are text, and this run has no text tokenizer (its task "
                             f"codec is {codec.get('type')!r}); train on a text task (task=text or task=tokens with "
                             f"a tokenizer.json)")
        self.tokenizer = text.tokenizers["tgt"]
        self.codec = codec
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 8
        self.max_length = cfg.max_seq_len

    @property
    def eot_token_id(self) -> int:
        return self.codec["eos_id"]

    @property
    def prefix_token_id(self) -> int:
        bos = self.codec.get("bos_id")
        return bos if isinstance(bos, int) and bos >= 0 else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    @torch.no_grad()
    def score(self, rows: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Sum of log-probabilities of each row's continuation after its context, and whether greedy decoding
        gives it; inputs are the last max_length + 1 tokens, as lm-eval's Hugging Face backend cuts them."""
        out = []
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start:start + self.batch_size]
            inputs = [(c + x)[-(self.max_length + 1):][:-1] for c, x in batch]
            width = max(len(i) for i in inputs)
            tokens = torch.zeros(len(inputs), width, dtype=torch.long)
            for row, ids in enumerate(inputs):
                tokens[row, :len(ids)] = torch.tensor(ids)  # right-padded: a causal model's earlier logits ignore it
            logp = F.log_softmax(self.model(tokens.to(self._device)).float(), dim=-1)  # (B, T, V)
            for row, ((_, cont), ids) in enumerate(zip(batch, inputs, strict=True)):
                pick = logp[row, len(ids) - len(cont):len(ids)]  # (len(cont), V)
                target = torch.tensor(cont, device=pick.device)
                out.append((float(pick.gather(-1, target[:, None]).sum()), bool((pick.argmax(-1) == target).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self.score([(context, continuation) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in (r.args for r in requests):
            windows = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            out.append(sum(logp for logp, _ in self.score(windows)))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding with the KV cache, in batches of prompts left-padded; each text cut at the first of
        its `until` strings (the end token stops it too)."""
        out: dict[int, str] = {}
        groups: dict[str, list[int]] = {}  # requests with the same generation settings decode together
        for i, r in enumerate(requests):
            groups.setdefault(repr(sorted(r.args[1].items())), []).append(i)
        for members in groups.values():
            for start in range(0, len(members), self.batch_size):
                index = members[start:start + self.batch_size]
                out.update(zip(index, self.decode_batch([requests[i].args for i in index]), strict=True))
        return [out[i] for i in range(len(requests))]

    @torch.no_grad()
    def decode_batch(self, batch: list[tuple[str, dict]]) -> list[str]:
        kwargs = batch[0][1]
        max_new = int(kwargs.get("max_gen_toks", 256))
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        prompts = [self.tok_encode(context)[-(self.max_length - max_new):] for context, _ in batch]
        out = []
        width = max(len(p) for p in prompts)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.bool)
        for row, ids in enumerate(prompts):
            tokens[row, width - len(ids):], mask[row, width - len(ids):] = torch.tensor(ids), True
        decoded = generate(self.model, tokens.to(self._device), mask.to(self._device),
                           DecodingConfig(strategy="greedy", max_new_tokens=max_new), eos_id=self.eot_token_id,
                           pad_id=self.codec.get("pad_id", 0))
        for row in range(len(prompts)):
            ids = decoded.tokens[row, 0, :int(decoded.lengths[row, 0])].tolist()
            text = self.tokenizer.decode([i for i in ids if i != self.eot_token_id])
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


HUB = "https://huggingface.co"  # huggingface_hub's endpoint, unless $HF_ENDPOINT names a mirror
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
LOCAL_COPY = ("lm-eval's benchmarks download their datasets from the Hub. Offline, give it a copy: one an earlier run "
              "with a network cached (~/.cache/huggingface), or a task YAML over local files (dataset_path: json, "
              "dataset_kwargs: {data_files: ...}) in a folder passed as --include_path (evaluate.py: "
              "lm_eval.include_path=); docs/interop.md shows one")


def hub_answers(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether the Hub's host accepts a TCP connection within `timeout` seconds, its name lookup included."""
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    answered: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            answered.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)  # a name lookup ignores the socket's timeout
    probe.start()
    probe.join(timeout)
    return bool(answered)


def offline_unless_the_hub_answers() -> None:
    """Without a network, lm-eval's dataset downloads retry for about 40 s and end in a traceback. When the Hub does
    not answer, set HF_DATASETS_OFFLINE and HF_HUB_OFFLINE, which `datasets` (and `huggingface_hub`, unless imported
    already: torchmetrics imports it through transformers) read once, when imported: a cached dataset then loads and
    any other fails at once. Offline variables the user set are kept."""
    if any(v in os.environ for v in OFFLINE_VARS) or "datasets" in sys.modules:
        return
    if not hub_answers(os.environ.get("HF_ENDPOINT") or HUB):
        os.environ.update(dict.fromkeys(OFFLINE_VARS, "1"))


def unreachable(e: ConnectionError) -> str:
    """The one line for a dataset lm-eval could not fetch."""
    offline = any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARS)
    return f"a task's dataset could not be reached{' offline' if offline else ''} ({e}). {LOCAL_COPY}"


def evaluate_tasks(ckpt: str | Path, tasks: list[str], include_path: str | None = None, batch_size: int = 8,
                   limit: int | None = None, device: str = "auto") -> tuple[dict, str]:
    """lm-eval's `tasks` on a checkpoint: its results (per task: metrics; the versions and n-shot) and its table."""
    offline_unless_the_hub_answers()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    manager = TaskManager(include_path=str(include_path) if include_path is not None else None)
    try:
        result = simple_evaluate(model=ArchsweepLM(str(ckpt), batch_size=batch_size, device=device), tasks=tasks,
                                 task_manager=manager, limit=limit)
    except ConnectionError as e:
        raise ValueError(unreachable(e)) from None
    report = {k: result[k] for k in ("results", "versions", "n-shot") if k in result}
    return {"checkpoint": str(ckpt), **report}, make_table(result)


def main() -> None:
    """lm-eval's own command line, with `archsweep` among its models."""
    offline_unless_the_hub_answers()
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "archsweep-lm-eval"
    try:
        cli_evaluate()
    except ConnectionError as e:
        raise SystemExit(f"archsweep-lm-eval: error: {unreachable(e)}") from None


if __name__ == "__main__":
    main()
