"""Download the public corpora of the built-in tasks into a data folder, checked against SHA-256 checksums.

    python -m archsweep.core.data.fetch shakespeare multi30k       # into ~/.local/share/archsweep/data
    python -m archsweep.core.data.fetch multi30k --dir /data/corpora

`shakespeare` (task=shakespeare_char): char-rnn's Tiny Shakespeare, saved as `tinyshakespeare.txt`.
`multi30k` (task=multi30k): the WMT16 multimodal task 1 archives (training, validation, test 2016), unpacked
into `multi30k/` with the test files renamed `test2016.*`. The checksums of what is downloaded (the text file, the
archives) are the ones published with the files elsewhere (torchtext records the archives'); each unpacked file
is then compared with the copy this project's figures were measured on, and a difference is reported, not
refused. Every request has a timeout; without a network the command says so and what to do instead, and ends.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from archsweep.core.data.paths import DATA_ENV, user_data_dir
from archsweep.core.data.paths import file_sha256 as sha256_of

TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Download:
    """One file to download (from the first of `urls` that answers) and check."""

    urls: tuple[str, ...]
    sha256: str
    save_as: str | None = None  # a plain file: its path in the data folder
    members: dict[str, str] = field(default_factory=dict)  # an archive: member file name -> path in the data folder


@dataclass(frozen=True)
class Corpus:
    name: str
    task: str
    licence: str
    downloads: tuple[Download, ...]
    measured: dict[str, str]  # path in the data folder -> SHA-256 of the copy the README's figures were measured on


QUEST = "http://www.quest.dcs.shef.ac.uk/wmt16_files_mmt/"
MIRROR = "https://raw.githubusercontent.com/neychev/small_DL_repo/master/datasets/Multi30k/"

CORPORA = {
    "shakespeare": Corpus(
        name="shakespeare", task="shakespeare_char", licence="public-domain text; char-rnn repository MIT",
        downloads=(Download(
            urls=("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",),
            sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
            save_as="tinyshakespeare.txt"),),
        measured={"tinyshakespeare.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"}),
    "multi30k": Corpus(
        name="multi30k", task="multi30k", licence="research use (Elliott et al. 2016; Flickr30k image descriptions)",
        downloads=(
            Download(urls=(QUEST + "training.tar.gz", MIRROR + "training.tar.gz"),
                     sha256="20140d013d05dd9a72dfde46478663ba05737ce983f478f960c1123c6671be5e",
                     members={"train.en": "multi30k/train.en", "train.de": "multi30k/train.de"}),
            Download(urls=(QUEST + "validation.tar.gz", MIRROR + "validation.tar.gz"),
                     sha256="a7aa20e9ebd5ba5adce7909498b94410996040857154dab029851af3a866da8c",
                     members={"val.en": "multi30k/val.en", "val.de": "multi30k/val.de"}),
            Download(urls=(QUEST + "mmt16_task1_test.tar.gz", MIRROR + "mmt16_task1_test.tar.gz"),
                     sha256="0681be16a532912288a91ddd573594fbdd57c0fbb81486eff7c55247e35326c2",
                     members={"test.en": "multi30k/test2016.en", "test.de": "multi30k/test2016.de"}),
        ),
        measured={
            "multi30k/train.en": "90821e5bb8566a2c814b909542a1ab73a3b0548308e8e8873cbcaf35ed8da9ca",
            "multi30k/train.de": "2728cdc6f394b1e4e4ba6b717a7e814c40b1ac8e566fe74b86b6ce8c1c30e96b",
            "multi30k/val.en": "40cd20974079d9afb0e3d27c659a8e059cc2fcf850b4bc23ede13fc36dd8a865",
            "multi30k/val.de": "fd0fc009db2446cfc12d96a382aff0d3122cb47577b352d0f7e0bb3a38e2e552",
            "multi30k/test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
            "multi30k/test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
        }),
}


class FetchError(RuntimeError):
    """A corpus could not be downloaded or did not match its checksum; the message says what to do."""


def hint(path: Path) -> str | None:
    """For a missing data file: the fetch command of the corpus it belongs to (None if it belongs to none)."""
    rel = path.as_posix()
    for corpus in CORPORA.values():
        if any(rel == p or rel.endswith("/" + p) or rel == p.split("/")[0] for p in corpus.measured):
            return (f"Get it with `python -m archsweep.core.data.fetch {corpus.name}` (downloads into "
                    f"{default_dest()}), or point data_dir=<folder> (train.py) or ${DATA_ENV} at a folder "
                    f"holding {', '.join(sorted(corpus.measured))}.")
    return None


def default_dest() -> Path:
    """$ARCHSWEEP_DATA_DIR if set (it is then the only data folder searched), else the user data folder."""
    return Path(os.environ[DATA_ENV]).expanduser() if os.environ.get(DATA_ENV) else user_data_dir()


def download(url: str, to: Path, timeout: float) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "archsweep-fetch"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(to, "wb") as out:
        shutil.copyfileobj(response, out)


def fetch_one(item: Download, dest: Path, tmp: Path, timeout: float, say) -> Path:
    """Download `item` into tmp from the first URL that answers; checked against its SHA-256."""
    failures = []
    for url in item.urls:
        target = tmp / Path(url).name
        say(f"downloading {url}")
        try:
            download(url, target, timeout)
        except (urllib.error.URLError, OSError, ValueError) as e:  # no network, refused, timed out, HTTP error
            failures.append(f"{url}: {getattr(e, 'reason', e)}")
            continue
        got = sha256_of(target)
        if got != item.sha256:
            failures.append(f"{url}: SHA-256 {got} is not the published {item.sha256} (file discarded)")
            target.unlink()
            continue
        return target
    raise FetchError("could not download " + "; ".join(failures) + (
        f". Without a network: copy the files onto this machine by other means into {dest} (or any folder, then "
        f"train with data_dir=<folder> or ${DATA_ENV}=<folder>); docs/tasks.md, Data, lists them."))


def fetch(name: str, dest: Path, timeout: float = TIMEOUT_S, say=print) -> list[Path]:
    """Fetch corpus `name` into `dest`; files already there with the measured checksum are kept. Returns the files."""
    if name not in CORPORA:
        raise FetchError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    corpus = CORPORA[name]
    written = []
    with tempfile.TemporaryDirectory(prefix="archsweep-fetch-") as tmp_dir:
        tmp = Path(tmp_dir)
        for item in corpus.downloads:
            wanted = [item.save_as] if item.save_as else list(item.members.values())
            if all((dest / w).is_file() and sha256_of(dest / w) == corpus.measured.get(w) for w in wanted):
                say(f"{', '.join(wanted)}: already in {dest}")
                written += [dest / w for w in wanted]
                continue
            got = fetch_one(item, dest, tmp, timeout, say)
            if item.save_as:
                written.append(place(got, dest / item.save_as))
            else:
                written += unpack(got, item.members, dest)
    for path in written:
        rel = path.relative_to(dest).as_posix()
        if sha256_of(path) != corpus.measured.get(rel):
            say(f"note: {rel} differs from the copy the README's figures were measured on "
                f"(SHA-256 {corpus.measured.get(rel)}); figures on it may differ slightly")
    return written


def place(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(source), str(target))
    return target


def unpack(archive: Path, members: dict[str, str], dest: Path) -> list[Path]:
    """The archive's files named in `members` (by base name, wherever they are inside) into dest."""
    out = []
    try:
        with tarfile.open(archive) as tar:
            found = {Path(m.name).name: m for m in tar.getmembers() if m.isfile() and Path(m.name).name in members}
            missing = sorted(set(members) - set(found))
            if missing:
                raise FetchError(f"{archive.name} has no {', '.join(missing)}")
            for base, rel in members.items():
                tmp = archive.parent / f"{base}.part"
                with tar.extractfile(found[base]) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                out.append(place(tmp, dest / rel))
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as e:  # cut short, or other bytes
        raise FetchError(f"{archive} is not a readable archive ({type(e).__name__}: {e}): truncated or damaged; "
                         f"delete it and fetch again") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m archsweep.core.data.fetch", description=__doc__.split("\n")[0])
    parser.add_argument("corpora", nargs="+", choices=sorted(CORPORA), help="what to download")
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"data folder (default: ${DATA_ENV} if set, else {user_data_dir()})")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per request (default %(default)s)")
    args = parser.parse_args(argv)
    dest = args.dir or default_dest()
    try:
        for name in args.corpora:
            fetch(name, dest.expanduser(), args.timeout)
            print(f"{name}: ready in {dest} (task={CORPORA[name].task})")
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.dir is not None and args.dir != user_data_dir() and not os.environ.get(DATA_ENV):
        print(f"train with data_dir={dest} (or export {DATA_ENV}={dest})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
