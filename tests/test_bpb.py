"""Bits per byte: the tokenizers' bytes-per-id tables against the text they encode (spaces, newlines and multi-byte
characters, BPE tokens that hold part of a character), and SplitMetrics' `bpb` against the hand computation: the
labelled tokens' NLL in bits over the UTF-8 bytes of exactly the text they cover."""

from __future__ import annotations

import json
import math

import pytest
import scripts
import torch

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.data.tasks.text import TextTask
from archsweep.core.data.tokenizer import BOS, SPECIALS, UNK, BpeTokenizer, CharTokenizer, load_tokenizer
from archsweep.core.eval.metrics import SplitMetrics, row_stats

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n  All:  Speak, speak — café, naïve.\n"
        "Ünïcödé — “quoted” élan\tand\ttabs; 3 spaces:   end.\n") * 4
TEXTS = ["café — naïve", " leading space", "line one\nline two\n\n", "——éé  x", "Ü\n é —"]
CORPUS = TEXT + "".join(TEXTS)  # what the tokenizers are trained on


@pytest.fixture(scope="module")
def bpe() -> BpeTokenizer:
    return BpeTokenizer.train([CORPUS], vocab_size=300)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.train([CORPUS])


def n_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_the_table_counts_the_utf8_bytes_of_every_text_the_tokens_decode_to(name, request):
    tok = request.getfixturevalue(name)
    table = tok.token_bytes()
    assert len(table) == tok.vocab_size
    for text in [TEXT, *TEXTS]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert sum(table[i] for i in ids) == n_bytes(text) == n_bytes(tok.decode(ids))
    ids = tok.encode(TEXT)
    checked = 0
    for start in range(0, len(ids), 7):  # any run of tokens that decodes to whole characters
        piece = tok.decode(ids[start:start + 11])
        if "\ufffd" not in piece:
            assert sum(table[i] for i in ids[start:start + 11]) == n_bytes(piece)
            checked += 1
    assert checked >= len(ids) // 7 // 2


def test_special_ids_count_no_bytes_and_unknown_characters_count_what_they_decode_to(char, bpe):
    assert bpe.token_bytes()[:len(SPECIALS)] == [0] * len(SPECIALS)
    table = char.token_bytes()
    assert [table[i] for i in range(len(SPECIALS)) if i != UNK] == [0] * (len(SPECIALS) - 1)
    ids = char.encode("a\u20acb")  # the euro sign is not in the corpus: [UNK], decoded as U+FFFD (3 bytes)
    assert ids[1] == UNK and sum(table[i] for i in ids) == n_bytes(char.decode(ids)) == 5
    exact = CharTokenizer.train([TEXT], specials=False)  # nanoGPT's vocabulary: every id is a character
    assert sum(exact.token_bytes()[i] for i in exact.encode(TEXT)) == n_bytes(TEXT)


def test_a_bpe_token_holding_part_of_a_character_counts_its_own_bytes(bpe):
    """Decoding such a token alone gives U+FFFD (3 bytes); the table counts the bytes it really holds, so a window
    that starts or ends inside a character is counted by what it covers."""
    table = bpe.token_bytes()
    used = set(bpe.encode(TEXT))
    partial = [i for i in used if "\ufffd" in bpe.decode([i])]
    assert partial, "the text should split some multi-byte character across tokens at this vocabulary size"
    assert all(0 < table[i] < n_bytes(bpe.decode([i])) for i in partial)
    whole = [i for i in used if "\ufffd" not in bpe.decode([i])]  # a leading space is its own byte, in any context
    assert any(bpe.decode([i]).startswith(" ") for i in whole)
    assert all(table[i] == n_bytes(bpe.decode([i])) for i in whole)


def test_a_saved_bpe_tokenizer_has_the_same_table(bpe, tmp_path):
    bpe.save(tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path / "tokenizer.json").token_bytes() == bpe.token_bytes()


def test_a_tokenizer_that_is_not_byte_level_is_refused(tmp_path):
    from tokenizers import Tokenizer, decoders, models

    tok = BpeTokenizer(Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[])))
    tok.tok.decoder = decoders.Metaspace()
    with pytest.raises(ValueError, match="not byte-level; bytes per token are known only for byte-level BPE"):
        tok.token_bytes()


def batch_of(tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal rows predicting each text from [BOS]: inputs [BOS] + ids[:-1], labels ids, padded with IGNORE."""
    rows = [tok.encode(t) for t in texts]
    width = max(map(len, rows))
    inputs = torch.full((len(rows), width), 0)
    labels = torch.full((len(rows), width), IGNORE_INDEX)
    for r, ids in enumerate(rows):
        inputs[r, :len(ids)] = torch.tensor([BOS, *ids[:-1]])
        labels[r, :len(ids)] = torch.tensor(ids)
    return inputs, labels


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_bpb_is_the_labelled_tokens_bits_over_the_bytes_of_the_text_they_cover(name, request):
    tok = request.getfixturevalue(name)
    texts = ["Speak, speak — café.\n", " naïve  élan\n\nend", "Ünïcödé"]  # rows of different lengths
    _, labels = batch_of(tok, texts)
    logits = torch.randn(*labels.shape, tok.vocab_size, generator=torch.Generator().manual_seed(0)) * 3
    metrics = SplitMetrics(torch.tensor(tok.token_bytes()))
    for rows in (slice(0, 2), slice(2, 3)):  # two batches
        metrics.update(row_stats(logits[rows], labels[rows]), labels[rows])
    got = metrics.compute()

    nats = 0.0
    for r, text in enumerate(texts):  # by hand: -log softmax of each labelled token, in float64
        for t, label in enumerate(tok.encode(text)):
            row = logits[r, t].double()
            nats += float(row.exp().sum().log() - row[label])
    expected = nats / math.log(2) / sum(n_bytes(t) for t in texts)
    assert float(got["bpb"]) == pytest.approx(expected, rel=1e-5)
    tokens = sum(len(tok.encode(t)) for t in texts)
    assert float(got["loss"]) == pytest.approx(nats / tokens, rel=1e-5)
    if name == "char":  # more bytes than tokens (é, —, ï, Ü, ö): bpb below bits per token
        assert float(got["bpb"]) < float(got["loss"]) / math.log(2)


def test_split_metrics_without_a_table_log_no_bpb_and_with_one_need_the_labels(char):
    _, labels = batch_of(char, ["abc"])
    logits = torch.zeros(*labels.shape, char.vocab_size)
    plain = SplitMetrics()
    plain.update(row_stats(logits, labels))
    assert "bpb" not in plain.compute()
    metrics = SplitMetrics(torch.tensor(char.token_bytes()))
    with pytest.raises(ValueError, match=r"pass the batch's labels to update\(stats, labels\)"):
        metrics.update(row_stats(logits, labels))
    metrics.update(row_stats(logits, labels), labels)
    assert float(metrics.compute()["bpb"]) == pytest.approx(3 * math.log(char.vocab_size) / math.log(2) / 3)
    assert not any("token_bytes" in k for k in metrics.state_dict())  # checkpoints stay as they were
    metrics.reset()
    assert int(metrics.bpb.bytes) == 0 and float(metrics.bpb.nll) == 0.0


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_the_text_task_supplies_the_table_of_its_tokenizer_for_next_token_models_only(tokenizer, tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT * 3, encoding="utf-8")
    task = TextTask(path=str(tmp_path / "corpus.txt"), data_dir=None, tokenizer=tokenizer, bpe_vocab_size=300,
                    block_size=16, batch_size=2, val_fraction=0.3, val_batches=1, test_batches=1, eval_seed=0,
                    cache_dir=str(tmp_path / "cache"))
    table = task.token_bytes("decoder_only")
    assert table.shape == (task.vocab_size,) and table.dtype == torch.long
    stream = torch.from_numpy(task.token_stream("val").astype("int64"))
    held_out = (TEXT * 3)[int(len(TEXT * 3) * 0.7):]  # the held-out part the val stream encodes
    assert int(table[stream].sum()) == n_bytes(held_out)
    assert torch.equal(task.token_bytes("encoder_decoder"), table)  # it predicts each target token in turn
    assert task.token_bytes("encoder_only") is None  # masked positions only: no bits per byte


def test_a_task_made_of_separate_examples_logs_no_bpb():
    from archsweep.core.data.tasks.synthetic import ReverseTask

    task = ReverseTask(n_symbols=8, min_len=2, max_len=6, batch_size=4, val_batches=1, test_batches=1, eval_seed=0)
    assert task.token_bytes("decoder_only") is None and task.token_bytes("encoder_decoder") is None


def lm_run(d, tokenizer: str, splits: dict) -> None:
    """A finished language-model run directory as compare.py reads it."""
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(f"- task=shakespeare_char\n- task.tokenizer={tokenizer}\n")
    (d / "metrics.csv").write_text("epoch,step,train/loss,val/loss\n0,9,,2.0\n")
    results = {"status": "completed", "error": None, "seed": 0, "params": 1000, "steps": 10, "task_family": "lm",
               "choices": {"model": "decoder_only", "task": "shakespeare_char"},
               "overrides": ["task=shakespeare_char", f"task.tokenizer={tokenizer}"], **splits}
    (d / "results.json").write_text(json.dumps(results))


def test_compare_shows_bpb_for_language_models_sorts_it_lower_first_and_reads_older_runs(tmp_path):
    from archsweep.core.report import compare

    # per token the BPE model's loss is higher (a token is ~3 bytes), per byte it is the better model
    lm_run(tmp_path / "s" / "0", "char", {"val": {"loss": 1.5, "ppl": 4.48, "bpb": 2.16},
                                          "test": {"loss": 1.6, "ppl": 4.95, "bpb": 2.31}})
    lm_run(tmp_path / "s" / "1", "bpe", {"val": {"loss": 4.0, "ppl": 54.6, "bpb": 1.92},
                                         "test": {"loss": 4.1, "ppl": 60.3, "bpb": 1.97}})
    report = compare([tmp_path / "s"], out=tmp_path / "out", sort="val/bpb")
    assert report.columns[:6] == ["val/loss", "val/ppl", "val/bpb", "test/loss", "test/ppl", "test/bpb"]
    assert [c.values["task.tokenizer"] for c in report.cells] == ["bpe", "char"]  # lower bpb first
    assert report.cells[0].stats["val/bpb"].mean == pytest.approx(1.92)
    # a run written before bpb existed has only the approximate bits_per_char: read, with no bpb column
    lm_run(tmp_path / "old" / "0", "char", {"val": {"loss": 1.5, "ppl": 4.48, "bits_per_char": 2.16},
                                            "test": {"loss": 1.6, "ppl": 4.95, "bits_per_char": 2.31}})
    old = compare([tmp_path / "old"], out=tmp_path / "out2")
    assert old.columns[:4] == ["val/loss", "val/ppl", "test/loss", "test/ppl"] and "val/bpb" not in old.columns


def test_a_bpe_run_logs_the_bpb_its_checkpoint_gives_by_hand(tmp_path):
    """train.py on an ASCII text with a BPE tokenizer: results.json's and metrics.csv's val/bpb equal the summed
    NLL of the validation windows' labels in bits over the bytes their decoded text has (ASCII: no token splits a
    character, so each row of labels decodes to exactly the text it covers)."""
    import random
    import sys
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from archsweep.core.model.checkpoint import load_model

    words = ["the", "king", "said", "to", "his", "son,", "and", "then", "we", "shall", "go.", "What?", "now"]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(1500)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="ascii")
    run_dir = tmp_path / "run"
    out = scripts.run(
        [sys.executable, "train.py", "task=text", f"task.path={tmp_path / 'corpus.txt'}", "task.tokenizer=bpe",
         "task.bpe_vocab_size=300", f"task.cache_dir={tmp_path / 'cache'}", "task.block_size=32",
         "task.batch_size=8", "task.val_batches=3", "task.test_batches=1", "model=decoder_only", "model.d_model=32",
         "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "trainer.max_steps=10", "logger=csv", "seed=0",
         f"hydra.run.dir={run_dir}", f"output_root={tmp_path}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    model = load_model(res["best_checkpoint"] or res["last_checkpoint"])
    task = instantiate(OmegaConf.load(run_dir / "config.yaml").task)
    nats, covered = 0.0, 0
    with torch.no_grad():
        for batch in task.dataloader("val", "decoder_only", seed=0):
            logits = task.forward_fn("decoder_only")(model, batch).double()  # (B, T, V)
            picked = logits.gather(-1, batch["labels"][..., None])[..., 0]
            nats += float((logits.exp().sum(-1).log() - picked).sum())
            texts = [task.decode(row.tolist()) for row in batch["labels"]]
            assert not any("\ufffd" in t for t in texts)  # whole characters only
            covered += sum(map(n_bytes, texts))
    assert res["val"]["bpb"] == pytest.approx(nats / math.log(2) / covered, rel=1e-4)
    header, *rows = (run_dir / "metrics.csv").read_text().splitlines()
    column = header.split(",").index("val/bpb")
    assert float([r for r in rows if r.split(",")[column]][-1].split(",")[column]) == pytest.approx(res["val"]["bpb"])

