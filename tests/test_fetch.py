"""The data command and where data is found, without the network: downloads come from file:// URLs or from a
local socket that never answers; a fresh clone (no ../shared) is an empty search path."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import scripts

from archsweep.core.data import fetch, paths
from archsweep.core.data.fetch import CORPORA, Corpus, Download, FetchError

ROOT = Path(__file__).resolve().parents[1]
SHARED = paths.SHARED_DATA


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_measured_checksums_are_the_shared_copies():
    if not SHARED.is_dir():
        pytest.skip("no ../shared/data")
    for corpus in CORPORA.values():
        for rel, digest in corpus.measured.items():
            assert fetch.sha256_of(SHARED / rel) == digest, rel


def test_shakespeare_downloads_and_checks_its_checksum(tmp_path, monkeypatch):
    source = SHARED / "tinyshakespeare.txt"
    if not source.is_file():
        pytest.skip("no ../shared/data")
    item = CORPORA["shakespeare"].downloads[0]
    local = Download(urls=(source.as_uri(),), sha256=item.sha256, save_as=item.save_as)
    monkeypatch.setitem(CORPORA, "shakespeare", Corpus(**{**CORPORA["shakespeare"].__dict__, "downloads": (local,)}))
    said = []
    files = fetch.fetch("shakespeare", tmp_path / "data", say=said.append)
    assert files == [tmp_path / "data" / "tinyshakespeare.txt"]
    assert fetch.sha256_of(files[0]) == item.sha256 and not any("differs" in s for s in said)
    fetch.fetch("shakespeare", tmp_path / "data", say=said.append)  # again: kept, not downloaded
    assert said[-1].endswith("already in " + str(tmp_path / "data"))


def test_a_wrong_checksum_is_refused_and_nothing_kept(tmp_path, monkeypatch):
    (tmp_path / "input.txt").write_text("not shakespeare")
    bad = Download(urls=((tmp_path / "input.txt").as_uri(),), sha256="0" * 64, save_as="tinyshakespeare.txt")
    monkeypatch.setitem(CORPORA, "shakespeare", Corpus(**{**CORPORA["shakespeare"].__dict__, "downloads": (bad,)}))
    with pytest.raises(FetchError, match="is not the published 0000"):
        fetch.fetch("shakespeare", tmp_path / "data", say=lambda s: None)
    assert not (tmp_path / "data" / "tinyshakespeare.txt").exists()


def tarball(path: Path, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return sha(path.read_bytes())


def test_multi30k_unpacks_and_renames_the_test_files(tmp_path, monkeypatch):
    digest = tarball(tmp_path / "mmt16_task1_test.tar.gz", {"test.en": b"A dog.\n", "test.de": b"Ein Hund.\n"})
    item = Download(urls=("http://127.0.0.1:9/unreachable.tar.gz", (tmp_path / "mmt16_task1_test.tar.gz").as_uri()),
                    sha256=digest, members={"test.en": "multi30k/test2016.en", "test.de": "multi30k/test2016.de"})
    monkeypatch.setitem(CORPORA, "multi30k", Corpus(**{**CORPORA["multi30k"].__dict__, "downloads": (item,)}))
    said = []
    files = fetch.fetch("multi30k", tmp_path / "data", timeout=2, say=said.append)  # the first URL fails: the next
    assert sorted(p.relative_to(tmp_path / "data").as_posix() for p in files) == [
        "multi30k/test2016.de", "multi30k/test2016.en"]
    assert (tmp_path / "data/multi30k/test2016.en").read_text() == "A dog.\n"
    assert any("differs from the copy the README's figures were measured on" in s for s in said)


def test_no_network_fails_fast_with_what_to_do(tmp_path, monkeypatch):
    item = Download(urls=("http://127.0.0.1:9/input.txt",), sha256="0" * 64, save_as="tinyshakespeare.txt")
    monkeypatch.setitem(CORPORA, "shakespeare", Corpus(**{**CORPORA["shakespeare"].__dict__, "downloads": (item,)}))
    with pytest.raises(FetchError, match="Without a network: copy the files .* data_dir=<folder>"):
        fetch.fetch("shakespeare", tmp_path, timeout=2, say=lambda s: None)


def test_a_server_that_never_answers_times_out(tmp_path, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/input.txt"
    item = Download(urls=(url,), sha256="0" * 64, save_as="tinyshakespeare.txt")
    monkeypatch.setitem(CORPORA, "shakespeare", Corpus(**{**CORPORA["shakespeare"].__dict__, "downloads": (item,)}))
    start = time.monotonic()
    try:
        with pytest.raises(FetchError, match="timed out"):
            fetch.fetch("shakespeare", tmp_path, timeout=0.5, say=lambda s: None)
    finally:
        server.close()
    assert time.monotonic() - start < 10


def test_the_command_says_error_and_exits_1(tmp_path, monkeypatch, capsys):
    item = Download(urls=("http://127.0.0.1:9/input.txt",), sha256="0" * 64, save_as="tinyshakespeare.txt")
    monkeypatch.setitem(CORPORA, "shakespeare", Corpus(**{**CORPORA["shakespeare"].__dict__, "downloads": (item,)}))
    assert fetch.main(["shakespeare", "--dir", str(tmp_path), "--timeout", "2"]) == 1
    assert capsys.readouterr().err.startswith("error: could not download http://127.0.0.1:9/input.txt")


def fresh_clone(monkeypatch, tmp_path) -> None:
    """No ../shared, no $ARCHSWEEP_DATA_DIR, no downloaded data: an empty search path."""
    monkeypatch.setattr(paths, "SHARED_DATA", tmp_path / "no-shared")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    monkeypatch.chdir(tmp_path)


def test_fresh_clone_says_exactly_what_to_do(tmp_path, monkeypatch):
    from archsweep.core.data.tasks.text import TextTask
    from archsweep.core.data.tasks.translation import TranslationTask

    fresh_clone(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        TextTask(path="tinyshakespeare.txt", data_dir=None, tokenizer="char", bpe_vocab_size=300, block_size=16,
                 batch_size=4, val_fraction=0.1, val_batches=1, test_batches=1, eval_seed=0)
    message = str(e.value)
    assert "`python -m archsweep.core.data.fetch shakespeare`" in message and "data_dir=<folder>" in message
    assert "ARCHSWEEP_DATA_DIR" in message and str(tmp_path / "xdg" / "archsweep" / "data") in message
    with pytest.raises(FileNotFoundError, match=r"`python -m archsweep.core.data.fetch multi30k`"):
        TranslationTask(train=["multi30k/train.en", "multi30k/train.de"], val=["multi30k/val.en", "multi30k/val.de"],
                        test=None, data_dir=None,
                        vocab="joint", bpe_vocab_size=300, max_len=32, batch_size=4, bucket_pool=2)


def test_fetched_data_is_found_by_default_and_env_and_data_dir_point_elsewhere(tmp_path, monkeypatch):
    fresh_clone(monkeypatch, tmp_path)
    fetched = paths.user_data_dir() / "tinyshakespeare.txt"
    fetched.parent.mkdir(parents=True)
    fetched.write_text("x")
    assert paths.locate("tinyshakespeare.txt", None, "task.path", "") == fetched
    elsewhere = tmp_path / "copy"
    (elsewhere / "multi30k").mkdir(parents=True)
    monkeypatch.setenv(paths.DATA_ENV, str(elsewhere))
    assert paths.locate("multi30k", None, "task.train", "") == elsewhere / "multi30k"
    assert paths.locate("multi30k", str(elsewhere), "task.train", "") == elsewhere / "multi30k"


@pytest.mark.slow  # train.py subprocesses (a shape trace: the task is built, nothing is trained)
def test_train_py_data_dir_points_at_a_copy_and_an_empty_one_is_one_line_error(tmp_path):
    if not (SHARED / "tinyshakespeare.txt").is_file():
        pytest.skip("no ../shared/data")
    copy = tmp_path / "copy"
    copy.mkdir()
    os.symlink(SHARED / "tinyshakespeare.txt", copy / "tinyshakespeare.txt")
    env = {**os.environ, paths.DATA_ENV: str(tmp_path / "empty"), "ARCHSWEEP_CACHE_DIR": str(tmp_path / "cache")}
    base = [sys.executable, "train.py", "task=shakespeare_char", "model=decoder_only", "trace_shapes=true",
            "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    out = scripts.run([*base, f"data_dir={copy}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.lstrip().startswith("shape trace") or "shape trace" in out.stdout
    assert not (tmp_path / "run").exists()  # trace_shapes leaves no run directory
    out = scripts.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 1
    error = out.stderr.strip().splitlines()
    assert len(error) == 1 and "python -m archsweep.core.data.fetch shakespeare" in error[0], out.stderr
