"""`archsweep-prepare` (archsweep.core.data.prepare) on Tiny Shakespeare and multi30k: shards equal a direct
tokenization, every input kind gives the same shards, runs are deterministic and resumable, refusals touch nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scripts

from archsweep.core.data import paths, prepare
from archsweep.core.data.shards import open_shards

DATA = next((d for d in paths.data_dirs() if (d / "tinyshakespeare.txt").is_file()), paths.SHARED_DATA)
SHAKESPEARE = DATA / "tinyshakespeare.txt"
pytestmark = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="no ../shared/data (tinyshakespeare.txt)")
EOS = "<|endoftext|>"


def speeches() -> list[str]:
    return [p for p in SHAKESPEARE.read_text().split("\n\n") if p.strip()]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    """A byte-level BPE of 512 tokens trained on Tiny Shakespeare, `<|endoftext|>` its id 0."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    prepare.train_tokenizer(iter(speeches()), 512, EOS, path)
    return path


def run(out: Path, *args: str | Path, tokenizer: Path | None = None) -> dict:
    tok = ["--tokenizer", str(tokenizer)] if tokenizer else []
    return prepare.prepare([*map(str, args), "--out", str(out), *tok])


def shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.npy"))}


def direct(tokenizer: Path, docs: list[str]) -> tuple[np.ndarray, list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id(EOS)
    ids = [e.ids + [eos] for e in tok.encode_batch(docs, add_special_tokens=False)]
    return np.concatenate([np.array(i, dtype=np.int64) for i in ids]), [len(i) for i in ids]


def test_shards_equal_a_direct_tokenization(tmp_path, tokenizer):
    meta = run(tmp_path, SHAKESPEARE, "--val-docs", 300, "--test-docs", 100, "--shard-tokens", 40000,
               "--workers", 2, tokenizer=tokenizer)
    docs = speeches()
    s = open_shards(tmp_path)
    assert s.layout == "archsweep" and s.dtype == np.uint16 and s.boundary_id == 0 and s.vocab_size == 512
    assert s.tokenizer_sha256 == meta["tokenizer"]["sha256"] and s.tokenizer_path.read_bytes() == tokenizer.read_bytes()
    for split, part in (("val", docs[:300]), ("test", docs[300:400]), ("train", docs[400:])):
        want, lengths = direct(tokenizer, part)
        got = np.concatenate(s.arrays(split)).astype(np.int64)
        np.testing.assert_array_equal(got, want)
        assert (s.tokens[split], s.documents[split]) == (len(want), len(part))
        assert s.bytes[split] == sum(len(d.encode()) for d in part)
        ends = list(np.cumsum(lengths))
        for shard, array in zip(meta["splits"][split], s.arrays(split), strict=True):
            assert array[-1] == 0 and shard["tokens"] == len(array)
        for shard in meta["splits"][split][:-1]:  # each closes after the document that reaches --shard-tokens
            assert shard["tokens"] >= 40000
        for i, cut in enumerate(np.cumsum([x["tokens"] for x in meta["splits"][split]])):
            assert cut in ends, f"{split} shard {i} ends inside a document"
    assert len(meta["splits"]["train"]) > 3


def test_jsonl_parquet_and_text_give_the_same_shards(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = speeches()
    args = ("--val-docs", 200, "--shard-tokens", 60000, "--workers", 2)
    run(tmp_path / "text", SHAKESPEARE, *args, tokenizer=tokenizer)
    jsonl = tmp_path / "in" / "corpus.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)))
    run(tmp_path / "jsonl", jsonl, "--text-field", "body", *args, tokenizer=tokenizer)
    half = len(docs) // 2  # a folder of two Parquet files, read in name order
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": docs[:half]}), tmp_path / "pq" / "a.parquet")
    pq.write_table(pa.table({"text": docs[half:]}), tmp_path / "pq" / "b.parquet")
    run(tmp_path / "parquet", tmp_path / "pq", *args, tokenizer=tokenizer)
    text = shard_bytes(tmp_path / "text")
    assert len(text) > 3 and shard_bytes(tmp_path / "jsonl") == text and shard_bytes(tmp_path / "parquet") == text


def test_lines_as_documents(tmp_path, tokenizer):
    source = (DATA / "multi30k" / "val.en").read_text()
    sentences = [s for s in source.splitlines() if s.strip()]
    (tmp_path / "val.en.txt").write_text(source)  # multi30k's files have no extension; plain text is .txt
    run(tmp_path / "out", tmp_path / "val.en.txt", "--split-docs", "line", "--val-docs", 100, "--workers", 1,
        tokenizer=tokenizer)
    s = open_shards(tmp_path / "out")
    assert s.documents == {"train": len(sentences) - 100, "val": 100}
    np.testing.assert_array_equal(np.concatenate(s.arrays("val")), direct(tokenizer, sentences[:100])[0])


def test_trained_tokenizer_and_determinism(tmp_path):
    args = (SHAKESPEARE, "--train-tokenizer", 300, "--val-docs", 100, "--shard-tokens", 100000)
    first = run(tmp_path / "a", *args, "--workers", 1)
    run(tmp_path / "b", *args, "--workers", 2)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "tokenizer.json" in files and len(first["splits"]["train"]) >= 2
    for name in files:  # byte-identical whatever the number of workers, meta.json and tokenizer.json included
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "a" / "tokenizer.json"))
    assert tok.get_vocab_size() == 300 and tok.token_to_id(EOS) == first["eos_id"] == 0
    assert first["tokenizer"]["name"] == "byte-level-bpe-300"


def test_rerun_finishes_nothing_and_other_settings_are_refused(tmp_path, tokenizer):
    run(tmp_path, SHAKESPEARE, "--val-docs", 200, "--shard-tokens", 80000, "--workers", 1, tokenizer=tokenizer)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=r"other settings \(shard_tokens: 80000 there, 90000 now\).*--overwrite"):
        run(tmp_path, SHAKESPEARE, "--val-docs", 200, "--shard-tokens", 90000, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="val_docs: 200 there, 100 now"):
        run(tmp_path, SHAKESPEARE, "--val-docs", 100, "--shard-tokens", 80000, tokenizer=tokenizer)
    assert run(tmp_path, SHAKESPEARE, "--val-docs", 200, "--shard-tokens", 80000, tokenizer=tokenizer)["complete"]
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    with pytest.raises(ValueError, match="hold 7222 documents"):  # --overwrite deletes only once the checks pass
        run(tmp_path, SHAKESPEARE, "--val-docs", 9000, "--overwrite", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="--eos 'nope' is not in the tokenizer's vocabulary"):
        run(tmp_path, SHAKESPEARE, "--eos", "nope", "--overwrite", tokenizer=tokenizer)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    meta = run(tmp_path, SHAKESPEARE, "--val-docs", 100, "--shard-tokens", 80000, "--overwrite", tokenizer=tokenizer)
    assert open_shards(tmp_path).documents["val"] == 100 == sum(s["documents"] for s in meta["splits"]["val"])


def test_a_failed_run_leaves_its_finished_shards_valid(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(prepare, "BATCH_BYTES", 1 << 14)  # small batches: shards finish before the bad file is read
    corpus = tmp_path / "in"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in speeches()))
    (corpus / "b.jsonl").write_text('{"text": "fine"}\n{"text": "broken\n')
    with pytest.raises(ValueError, match=r"b.jsonl: could not be read"):
        run(tmp_path / "out", corpus, "--val-docs", 100, "--shard-tokens", 20000, "--workers", 1, tokenizer=tokenizer)
    out = tmp_path / "out"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] is False and len(meta["splits"]["train"]) >= 5
    for shard in meta["splits"]["train"] + meta["splits"]["val"]:
        assert len(np.load(out / shard["file"], mmap_mode="r")) == shard["tokens"]
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    with pytest.raises(ValueError, match="unfinished archsweep-prepare"):
        open_shards(out)


def test_refusals(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="hold 7222 documents .*--val-docs 8000.*lower --val-docs"):
        run(tmp_path / "a", SHAKESPEARE, "--val-docs", 8000, tokenizer=tokenizer)
    assert not list((tmp_path / "a").glob("*.json"))
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="hold 0 documents"):
        run(tmp_path / "b", tmp_path / "empty.txt", tokenizer=tokenizer)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"x.csv: unknown extension '.csv'"):
        run(tmp_path / "b", tmp_path / "x.csv", tokenizer=tokenizer)
    with pytest.raises(FileNotFoundError, match="INPUT .*nope.txt: no such file"):
        run(tmp_path / "b", tmp_path / "nope.txt", tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"--eos '</s>' is not in the tokenizer's vocabulary"):
        run(tmp_path / "c", SHAKESPEARE, "--eos", "</s>", "--val-docs", 10, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="no tokenizer: give --tokenizer"):
        run(tmp_path / "c", SHAKESPEARE)
    with pytest.raises(ValueError, match="--val-docs=0 must be at least 1"):
        run(tmp_path / "c", SHAKESPEARE, "--val-docs", 0, tokenizer=tokenizer)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.bin").write_bytes(b"\0\0")
    with pytest.raises(ValueError, match="holds shards .*but no meta.json"):
        run(tmp_path / "d", SHAKESPEARE, tokenizer=tokenizer)
    (tmp_path / "j.jsonl").write_text('{"body": "a"}\n')
    with pytest.raises(ValueError, match="j.jsonl: rows have no field 'text'.*--text-field"):
        run(tmp_path / "e", tmp_path / "j.jsonl", tokenizer=tokenizer)


def test_tiktoken_and_the_lock(tmp_path, tokenizer):
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs tiktoken: pip install tiktoken"):
            run(tmp_path, SHAKESPEARE, "--tokenizer", "tiktoken:gpt2")
    from filelock import FileLock

    tmp_path.mkdir(exist_ok=True)
    with FileLock(str(tmp_path / prepare.LOCK)):
        held = subprocess.run([sys.executable, "-m", "archsweep.core.data.prepare", str(SHAKESPEARE), "--out",
                               str(tmp_path), "--tokenizer", str(tokenizer)], capture_output=True, text=True)
    assert held.returncode == 2 and "another archsweep-prepare is writing it" in held.stderr


@pytest.mark.slow
def test_killed_and_resumed_equals_an_uninterrupted_run(tmp_path, tokenizer):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(speeches() * 8))
    args = [sys.executable, "-m", "archsweep.core.data.prepare", str(corpus), "--tokenizer", str(tokenizer),
            "--val-docs", "500", "--shard-tokens", "150000", "--workers", "1"]
    out, whole = tmp_path / "out", tmp_path / "whole"
    proc = subprocess.Popen([*args, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "train_000001.npy").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the command and its pool workers
    proc.wait()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] is False, "the run finished before it was killed: make the corpus larger"
    done = [s["file"] for shards in meta["splits"].values() for s in shards]
    assert done, "killed before any shard was recorded"
    stats = {f: ((out / f).stat().st_ino, (out / f).stat().st_mtime_ns) for f in done}
    scripts.run([*args, "--out", str(out)], check=True, capture_output=True)
    scripts.run([*args, "--out", str(whole)], check=True, capture_output=True)
    assert {f: ((out / f).stat().st_ino, (out / f).stat().st_mtime_ns) for f in done} == stats
    names = sorted(p.name for p in whole.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names and len(names) > len(done) + 2
    for name in names:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
