"""Throughput of `archsweep-prepare` on every core: a >= 100 MB text corpus (Tiny Shakespeare's speeches shuffled
with a seed and repeated) tokenized with a byte-level BPE of 8192 tokens trained once on Tiny Shakespeare, with
--workers 1 and 2. Prints tokens, seconds, tokens/s, the 2-vs-1 ratio, CPU seconds of the main process and of the
workers (tokens per worker CPU second does not depend on what else the machine runs) and the main process's peak
RSS (most of it is `datasets`' import and first read; it does not grow with the corpus).

    python bench/prepare.py            # 100 MB
    python bench/prepare.py --mb 20    # a quicker look
    python bench/prepare.py --check    # also: the shards against a direct tokenization, and a kill and re-run

`--check` then tokenizes every document of the corpus directly (one process, the same tokenizer) and compares the
token, document and byte counts and the tokens themselves with the shards; and it starts the command again into a
new folder, kills it (SIGKILL) once its first shard exists, runs it again, and reports whether the shards written
before the kill were left untouched (inode and modification time) and the folder equals the uninterrupted one's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from archsweep.core.data import paths, prepare

# runs the command in a child process and reports that process's own peak RSS (its workers are its children)
CHILD = ("import resource, sys\nfrom archsweep.core.data.prepare import prepare\nprepare(sys.argv[1:])\n"
         "me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
         "print('peak_rss_kb', me.ru_maxrss, 'main_cpu', me.ru_utime + me.ru_stime, 'workers_cpu', "
         "kids.ru_utime + kids.ru_stime)")


def corpus(folder: Path, source: Path, mb: int, seed: int) -> Path:
    speeches = [p for p in source.read_text().split("\n\n") if p.strip()]
    rng, path, size = random.Random(seed), folder / "corpus.txt", 0
    with open(path, "w") as f:
        while size < mb * 10**6:
            rng.shuffle(speeches)
            block = "\n\n".join(speeches) + "\n\n"
            f.write(block)
            size += len(block.encode())
    return path


def run(text: Path, tokenizer: Path, out: Path, workers: int, shard_tokens: int) -> tuple[int, float, dict]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(text), "--out", str(out), "--tokenizer", str(tokenizer),
                           "--workers", str(workers), "--shard-tokens", str(shard_tokens)],
                          check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print("   ", done.stdout.splitlines()[0])
    words = done.stdout.split("peak_rss_kb")[1].split()
    usage = {"peak_rss_kb": int(words[0]), words[1]: float(words[2]), words[3]: float(words[4])}
    meta = json.loads((out / "meta.json").read_text())
    tokens = sum(s["tokens"] for shards in meta["splits"].values() for s in shards)
    return tokens, seconds, usage


def direct_check(text: Path, tokenizer: Path, out: Path) -> None:
    """The shards in `out` against every document of `text` (blank-line paragraphs) encoded directly."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    docs = [d for d in text.read_text().split("\n\n") if d.strip()]
    meta = json.loads((out / "meta.json").read_text())
    shards = np.concatenate([np.load(out / s["file"]) for split in ("val", "train") for s in meta["splits"][split]])
    start, ok, tokens, nbytes = 0, True, 0, 0
    for i in range(0, len(docs), 10_000):
        for enc, doc in zip(tok.encode_batch(docs[i:i + 10_000], add_special_tokens=False), docs[i:i + 10_000],
                            strict=True):
            ids = np.append(np.asarray(enc.ids, dtype=shards.dtype), eos)
            ok = ok and np.array_equal(shards[start:start + len(ids)], ids)
            start, tokens, nbytes = start + len(ids), tokens + len(ids), nbytes + len(doc.encode())
    counted = {k: sum(s[k] for split in meta["splits"].values() for s in split) for k in ("tokens", "documents",
                                                                                        "bytes")}
    print(f"direct tokenization: {tokens:,} tokens, {len(docs):,} documents, {nbytes:,} bytes; shards: "
          f"{counted['tokens']:,}, {counted['documents']:,}, {counted['bytes']:,}; every token equal: "
          f"{ok and start == len(shards)}")


def kill_and_rerun(text: Path, tokenizer: Path, out: Path, reference: Path, shard_tokens: int) -> None:
    args = [sys.executable, "-m", "archsweep.core.data.prepare", str(text), "--out", str(out), "--tokenizer",
            str(tokenizer), "--workers", "2", "--shard-tokens", str(shard_tokens)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not list(out.glob("train_000000.npy")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in out.glob("*.npy")}
    start = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    after = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in out.glob("*.npy")}
    kept = all(after.get(name) == stamp for name, stamp in before.items())
    same = sorted(after) == sorted(f.name for f in reference.glob("*.npy")) and all(
        (out / name).read_bytes() == (reference / name).read_bytes() for name in after)
    print(f"killed after its first shard: {len(before)} shard(s) on disk; the re-run took "
          f"{time.perf_counter() - start:.1f} s, wrote {len(set(after) - set(before))} more, left the earlier ones "
          f"untouched: {kept}; the folder equals the uninterrupted run's: {same}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--shard-tokens", type=int, default=10_000_000)
    p.add_argument("--check", action="store_true", help="compare with a direct tokenization; kill and re-run")
    args = p.parse_args()
    source = next((d / "tinyshakespeare.txt" for d in paths.data_dirs() if (d / "tinyshakespeare.txt").is_file()),
                  None)
    if source is None:
        sys.exit("tinyshakespeare.txt not found in the data folders (../shared/data or $ARCHSWEEP_DATA_DIR)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = corpus(tmp, source, args.mb, seed=0)
        tokenizer = tmp / "tokenizer.json"
        speeches = [s for s in source.read_text().split("\n\n") if s.strip()]
        prepare.train_tokenizer(iter(speeches), args.vocab, "<|endoftext|>", tokenizer)
        print(f"corpus {text.stat().st_size / 1e6:.1f} MB, byte-level BPE {args.vocab}, "
              f"--shard-tokens {args.shard_tokens}")
        rates = {}
        for workers in (1, 2):
            load = os.getloadavg()[0]
            tokens, seconds, use = run(text, tokenizer, tmp / f"out{workers}", workers, args.shard_tokens)
            rates[workers] = tokens / seconds
            print(f"workers {workers}: {tokens:,} tokens in {seconds:.1f} s = {rates[workers]:,.0f} tokens/s "
                  f"(load average before: {load:.1f}); CPU s: main {use['main_cpu']:.1f}, workers "
                  f"{use['workers_cpu']:.1f} ({tokens / use['workers_cpu']:,.0f} tokens per worker CPU s); "
                  f"main process peak RSS {use['peak_rss_kb'] / 1024:.0f} MiB")
        same = all((tmp / "out1" / f.name).read_bytes() == f.read_bytes() for f in (tmp / "out2").glob("*.npy"))
        print(f"2 vs 1 workers: {rates[2] / rates[1]:.2f}x; shards identical: {same}")
        if args.check:
            direct_check(text, tokenizer, tmp / "out2")
            kill_and_rerun(text, tokenizer, tmp / "killed", tmp / "out2", args.shard_tokens)


if __name__ == "__main__":
    main()
