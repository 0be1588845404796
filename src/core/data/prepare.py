"""`archsweep-prepare`: tokenize a corpus into token shards (the format of `shards.py`, docs/shards.md) on every
core, resumably.

The main process streams documents (Hugging Face `datasets`: text, JSONL, Parquet or a hub dataset), sends batches
of them to a pool of tokenizing workers with a bounded number in flight, and appends the returned tokens to the
open shard in document order, closing it after the document that reaches `--shard-tokens`. Shards are therefore
the same whatever the number of workers, and a re-run skips the documents of the shards meta.json records.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from archsweep.core.data.paths import file_sha256
from archsweep.core.data.shards import FORMAT, META, TOKENIZER, VERSION, ShardWriter, dtype_for, write_json

KINDS = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
BATCH_BYTES = 1 << 18  # text per worker task: the unit of work, not of output (shards do not depend on it)
LOCK = ".archsweep-prepare.lock"


class BadInput(ValueError):
    """A document source that cannot be read as asked, named in the message."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser("archsweep-prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="*", type=Path, help="text / .jsonl / .parquet files or folders of them")
    p.add_argument("--out", type=Path, required=True, help="the shard folder to write (or finish)")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", help="a tokenizers JSON file, or tiktoken:<encoding> (e.g. tiktoken:gpt2)")
    tok.add_argument("--train-tokenizer", type=int, metavar="VOCAB", help="train a byte-level BPE of this size")
    p.add_argument("--eos", default="<|endoftext|>", help="the end-of-document token (default %(default)s)")
    p.add_argument("--val-docs", type=int, default=1000, help="the first N documents are val (%(default)s)")
    p.add_argument("--test-docs", type=int, default=0, help="the next N documents are test (%(default)s)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (%(default)s)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes (all cores)")
    p.add_argument("--text-field", default="text", help="the field of JSONL / Parquet / dataset rows (%(default)s)")
    p.add_argument("--split-docs", choices=("line", "paragraph", "document"), default="paragraph",
                   help="documents of a text file: one per line, per blank-line paragraph, or the whole file")
    p.add_argument("--dataset", help="a Hugging Face dataset name, streamed (instead of INPUT)")
    p.add_argument("--dataset-config", help="its configuration (e.g. sample-10BT)")
    p.add_argument("--dataset-split", default="train", help="its split (%(default)s)")
    p.add_argument("--overwrite", action="store_true", help="delete the shards --out holds and start again")
    return p.parse_args(argv)


def input_files(args: argparse.Namespace) -> list[tuple[Path, str]]:
    """Every input file in order (a folder's files sorted) with its `datasets` builder; refusals first."""
    if bool(args.inputs) == bool(args.dataset):
        raise ValueError("give INPUT files or folders, or --dataset NAME (one of the two)")
    for name, value, low in (("--val-docs", args.val_docs, 1), ("--test-docs", args.test_docs, 0),
                             ("--shard-tokens", args.shard_tokens, 1), ("--workers", args.workers, 1)):
        if value < low:
            raise ValueError(f"{name}={value} must be at least {low}")
    files = []
    for given in args.inputs:
        if not given.exists():
            raise FileNotFoundError(f"INPUT {given}: no such file or folder")
        found = sorted(p for p in given.rglob("*") if p.is_file() and not p.name.startswith(".")) \
            if given.is_dir() else [given]
        if not found:
            raise ValueError(f"INPUT {given}: an empty folder; name a folder with text, .jsonl or .parquet files")
        for path in found:
            if path.suffix.lower() not in KINDS:
                raise ValueError(f"INPUT {path}: unknown extension {path.suffix!r}; known: {', '.join(KINDS)} "
                                 f"(rename a plain text file to .txt)")
            files.append((path.resolve(), KINDS[path.suffix.lower()]))
    return files


def documents(args: argparse.Namespace, files: list[tuple[Path, str]]) -> Iterator[str]:
    """The corpus's documents in order, streamed; empty (whitespace-only) documents are skipped."""
    from datasets import load_dataset

    sources = [(args.dataset, lambda: load_dataset(args.dataset, args.dataset_config, split=args.dataset_split,
                                                   streaming=True))] if args.dataset else []
    for path, kind in files:
        extra = {"sample_by": args.split_docs} if kind == "text" else {}
        sources.append((path, lambda p=path, k=kind, e=extra: load_dataset(k, data_files=[str(p)], split="train",
                                                                          streaming=True, **e)))
    for where, load in sources:
        field = "text" if (isinstance(where, Path) and KINDS[where.suffix.lower()] == "text") else args.text_field
        try:
            for batch in load().iter(batch_size=1000):
                if field not in batch:
                    raise BadInput(f"{where}: rows have no field {field!r} (fields: {', '.join(batch)}); "
                                     f"name it with --text-field")
                for text in batch[field]:
                    if not isinstance(text, str):
                        raise BadInput(f"{where}: a row's {field!r} is {type(text).__name__}, not text (a row "
                                         f"without it, or another field); fix the row or name the field with "
                                         f"--text-field")
                    if text and not text.isspace():
                        yield text
        except BadInput:
            raise
        except Exception as err:  # datasets / pyarrow errors for malformed files: name the file
            raise BadInput(f"{where}: could not be read ({type(err).__name__}: {err}); fix or remove it") from err


def settings_of(args: argparse.Namespace, files: list[tuple[Path, str]]) -> dict:
    """What a re-run into the same folder must match."""
    if args.tokenizer and not args.tokenizer.startswith("tiktoken:"):
        path = Path(args.tokenizer).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"--tokenizer {path}: no such file; give a tokenizers JSON file, "
                                    f"tiktoken:<encoding>, or --train-tokenizer VOCAB")
        tokenizer = f"file:{file_sha256(path)}"
    else:
        tokenizer = args.tokenizer or f"train-byte-level-bpe:{args.train_tokenizer or 0}"
        if not args.tokenizer and not args.train_tokenizer:
            raise ValueError("no tokenizer: give --tokenizer PATH/tokenizer.json, --tokenizer tiktoken:gpt2, "
                             "or --train-tokenizer VOCAB")
    inputs = ([{"dataset": args.dataset, "config": args.dataset_config, "split": args.dataset_split}]
              if args.dataset else [{"file": str(p), "bytes": p.stat().st_size} for p, _ in files])
    return {"inputs": inputs, "tokenizer": tokenizer, "eos": args.eos, "val_docs": args.val_docs,
            "test_docs": args.test_docs, "shard_tokens": args.shard_tokens, "text_field": args.text_field,
            "split_docs": args.split_docs}


def our_files(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if p.name in (META, TOKENIZER) or p.suffix == ".npy" or ".tmp" in p.name]


def check_folder(out: Path, settings: dict, overwrite: bool) -> dict | None:
    """The meta.json of a folder to finish, None to start afresh; refuses a folder of other settings."""
    if overwrite:
        return None  # deleted by `run` once the inputs and the tokenizer have passed their checks
    if not (out / META).is_file():
        shards = [p.name for p in out.iterdir() if p.suffix in (".npy", ".bin")]
        if shards:
            raise ValueError(f"--out {out} holds shards ({shards[0]}, ...) but no meta.json; give another --out "
                             f"or --overwrite")
        remove_stale(out)
        return None
    meta = json.loads((out / META).read_text())
    old = meta.get("settings", {})
    differ = [k for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if differ:
        said = "; ".join(f"{k}: {old.get(k)!r} there, {settings.get(k)!r} now" for k in differ)
        raise ValueError(f"--out {out} was prepared with other settings ({said}); give another --out or "
                         f"--overwrite")
    for shards in meta["splits"].values():
        for shard in shards:
            if not (out / shard["file"]).is_file():
                raise FileNotFoundError(f"{out / shard['file']}: recorded in meta.json but missing; --overwrite")
    remove_stale(out)
    return meta


def remove_stale(out: Path) -> None:
    """Temp files of a run that was killed (the lock is ours, so no run is writing them)."""
    for stale in (p for p in out.iterdir() if ".tmp" in p.name):
        stale.unlink()


def load_encoder(spec: str):
    """(encode_batch, vocab_size, token_to_id) for a tokenizers JSON path or tiktoken:<encoding>."""
    if spec.startswith("tiktoken:"):
        try:
            import tiktoken
        except ImportError:
            raise ValueError(f"--tokenizer {spec} needs tiktoken: pip install tiktoken") from None
        enc = tiktoken.get_encoding(spec.split(":", 1)[1])
        specials = {t: enc.encode_single_token(t) for t in enc.special_tokens_set}
        return enc.encode_ordinary_batch, enc.n_vocab, specials.get
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(spec)
    encode = lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    return encode, tok.get_vocab_size(with_added_tokens=True), tok.token_to_id


def eos_of(spec: str, eos: str) -> tuple[int, int]:
    """(vocabulary size, id of `eos`) of a tokenizer, refusing an `eos` it does not have."""
    _, vocab, to_id = load_encoder(spec)
    if to_id(eos) is None:
        raise ValueError(f"--eos {eos!r} is not in the tokenizer's vocabulary ({spec}); name its end-of-document "
                         f"token")
    return vocab, to_id(eos)


def tokenizer_sha256(spec: str) -> str:
    if not spec.startswith("tiktoken:"):
        return file_sha256(Path(spec))
    import hashlib

    import tiktoken

    enc = tiktoken.get_encoding(spec.split(":", 1)[1])
    digest, specials = hashlib.sha256(), {enc.encode_single_token(t) for t in enc.special_tokens_set}
    for rank in range(enc.n_vocab):  # its mergeable ranks, read through the public API: "rank hex-bytes" lines
        if rank not in specials:
            try:
                digest.update(b"%d %s\n" % (rank, enc.decode_single_token_bytes(rank).hex().encode()))
            except KeyError:  # an id no token has (some encodings have gaps)
                pass
    return digest.hexdigest()


def train_tokenizer(texts: Iterator[str], vocab_size: int, eos: str, path: Path) -> None:
    """A byte-level BPE (GPT-2's scheme) trained on `texts`, `eos` its one special token, saved atomically."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tmp = path.with_name(f".{path.name}.tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)


WORKER: dict = {}


def init_worker(spec: str, eos_id: int, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the pool is the parallelism
    os.environ["RAYON_NUM_THREADS"] = "1"
    encode, vocab, _ = load_encoder(spec)
    WORKER.update(encode=encode, eos=eos_id, dtype=np.dtype(dtype), limit=np.iinfo(dtype).max)


def tokenize(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's tokens (each document's, then EOS), tokens per document (EOS included), UTF-8 bytes per document."""
    flat: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for i, ids in enumerate(WORKER["encode"](texts)):
        flat.extend(ids)
        flat.append(WORKER["eos"])
        lengths[i] = len(ids) + 1
    tokens = np.array(flat, dtype=np.int64)
    if len(tokens) and tokens.max() > WORKER["limit"]:
        raise ValueError(f"token id {tokens.max()} does not fit {WORKER['dtype']}")
    return tokens.astype(WORKER["dtype"]), lengths, np.array([len(t.encode()) for t in texts], dtype=np.int64)


def batches(docs: Iterator[str], val: int, test: int, skip: dict[str, int], skipped: list[int]
            ) -> Iterator[tuple[str, list[str]]]:
    """(split, documents) batches of about BATCH_BYTES of one split, in corpus order, without the documents of
    shards already written (`skip` per split; their UTF-8 bytes are added to `skipped[0]`)."""
    split, batch, size = None, [], 0
    for i, text in enumerate(docs):
        now, j = ("val", i) if i < val else ("test", i - val) if i < val + test else ("train", i - val - test)
        if j < skip.get(now, 0):
            skipped[0] += len(text.encode())
            continue
        if batch and (now != split or size >= BATCH_BYTES):
            yield split, batch
            batch, size = [], 0
        split = now
        batch.append(text)
        size += len(text)
    if batch:
        yield split, batch


def prepare(argv: list[str] | None = None) -> dict:
    """Run the command (see `parse_args`); returns the folder's meta.json. Refusals raise ValueError or
    FileNotFoundError before anything is written."""
    from filelock import FileLock, Timeout

    args = parse_args(argv)
    files = input_files(args)
    settings = settings_of(args, files)
    out = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ValueError(f"--out {out}: another archsweep-prepare is writing it; wait for it or give another --out") \
            from None
    try:
        return run(args, files, settings, out)
    finally:
        lock.release()


def run(args: argparse.Namespace, files: list[tuple[Path, str]], settings: dict, out: Path) -> dict:
    meta = check_folder(out, settings, args.overwrite)
    val, test = args.val_docs, args.test_docs
    seen = sum(1 for _ in zip(range(val + test + 1), documents(args, files), strict=False))
    if seen <= val + test:
        raise ValueError(f"the inputs hold {seen} documents (--split-docs {args.split_docs}), not more than "
                         f"--val-docs {val} + --test-docs {test}: none would be left for train; lower --val-docs")
    if args.tokenizer:
        eos_of(args.tokenizer, args.eos)
    if args.overwrite:
        for path in our_files(out):
            path.unlink()
    spec, name = tokenizer_for(args, out, meta)
    vocab, eos_id = eos_of(spec, args.eos)
    if meta is None:
        splits = {"train": [], "val": [], **({"test": []} if test else {})}
        meta = {"format": FORMAT, "version": VERSION, "dtype": dtype_for(vocab).name, "vocab_size": vocab,
                "eos_id": eos_id, "tokenizer": {"name": name, "sha256": tokenizer_sha256(spec)},
                "shard_tokens": args.shard_tokens, "settings": settings, "splits": splits, "complete": False}
        write_json(out / META, meta)
    if meta.get("complete"):
        print(f"{out}: already complete ({summary(meta)}); nothing to do")
        return meta
    tokenize_all(args, files, out, meta, spec)
    meta["complete"] = True
    write_json(out / META, meta)
    return meta


def tokenizer_for(args: argparse.Namespace, out: Path, meta: dict | None) -> tuple[str, str]:
    """(spec for `load_encoder`, name for meta.json); copies or trains the folder's tokenizer.json."""
    if args.tokenizer and args.tokenizer.startswith("tiktoken:"):
        return args.tokenizer, args.tokenizer
    target = out / TOKENIZER
    if args.tokenizer:
        given = Path(args.tokenizer).expanduser()
        if not target.is_file() or file_sha256(target) != file_sha256(given):
            tmp = target.with_name(f".{target.name}.tmp")
            shutil.copyfile(given, tmp)
            os.replace(tmp, target)
        return str(target), given.name
    name = f"byte-level-bpe-{args.train_tokenizer}"
    if meta is None or not target.is_file() or file_sha256(target) != meta["tokenizer"]["sha256"]:
        print(f"training a byte-level BPE of {args.train_tokenizer} tokens on the train documents", file=sys.stderr)
        docs = documents(args, input_files(args))
        train = (t for i, t in enumerate(docs) if i >= args.val_docs + args.test_docs)
        train_tokenizer(train, args.train_tokenizer, args.eos, target)
    return str(target), name


def tokenize_all(args: argparse.Namespace, files: list[tuple[Path, str]], out: Path, meta: dict, spec: str) -> None:
    """Stream, tokenize on the pool (at most 2 batches per worker in flight), write; progress on stderr."""
    from tqdm import tqdm

    skip = {split: sum(s["documents"] for s in shards) for split, shards in meta["splits"].items()}
    total = sum(p.stat().st_size for p, k in files) if files and all(k != "parquet" for _, k in files) else None
    writer, skipped, new_tokens, start = ShardWriter(out, meta), [0], 0, time.perf_counter()
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"prepare {out.name}",
               file=sys.stderr, dynamic_ncols=True)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process whose threads (datasets, Rayon) may hold locks
    try:
        with ctx.Pool(args.workers, initializer=init_worker, initargs=(spec, meta["eos_id"], meta["dtype"])) as pool:
            pending: deque = deque()

            def consume() -> None:
                nonlocal new_tokens
                split, result = pending.popleft()
                tokens, lengths, nbytes = result.get()
                writer.add(split, tokens, lengths, nbytes)
                new_tokens += len(tokens)
                bar.update(int(nbytes.sum()) + skipped[0])
                skipped[0] = 0
                bar.set_postfix_str(f"{new_tokens / (time.perf_counter() - start):,.0f} tok/s", refresh=False)

            for split, texts in batches(documents(args, files), args.val_docs, args.test_docs, skip, skipped):
                pending.append((split, pool.apply_async(tokenize, (texts,))))
                if len(pending) >= 2 * args.workers:
                    consume()
            while pending:
                consume()
            if writer.file is not None:
                writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    print(f"{out}: {summary(meta)}; {new_tokens:,} new tokens in {seconds:.1f} s "
          f"({new_tokens / max(seconds, 1e-9):,.0f} tokens/s, {args.workers} workers)")


def summary(meta: dict) -> str:
    shards = [s for split in meta["splits"].values() for s in split]
    return (f"{sum(s['tokens'] for s in shards):,} tokens, {sum(s['documents'] for s in shards):,} documents, "
            f"{sum(s['bytes'] for s in shards):,} bytes, {len(shards)} shards")


def main(argv: list[str] | None = None) -> None:
    try:
        prepare(argv)
    except (ValueError, FileNotFoundError) as err:
        print(f"archsweep-prepare: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
