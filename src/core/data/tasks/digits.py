"""`digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes, 16 grey levels; UCI
"Optical Recognition of Handwritten Digits", Alpaydin & Kaynak 1998), offline: read from the file scikit-learn
ships, without importing scikit-learn. A fixed stratified split (`split_seed`): 70% train, 15% val, 15% test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from archsweep.core.data.tasks.images import ImageTask


def digits_file() -> Path:
    spec = importlib.util.find_spec("sklearn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.exists():
        raise FileNotFoundError("task=digits reads scikit-learn's bundled digits (sklearn/datasets/data/"
                                "digits.csv.gz), which is not installed; pip install scikit-learn")
    return path


def read_digits(path: Path) -> np.ndarray:
    """The gzip'd table; a damaged copy (cut short, other bytes) raises ValueError naming it."""
    try:
        return np.loadtxt(path, delimiter=",", dtype=np.float32)
    except (OSError, EOFError, ValueError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"task=digits: {path} does not read ({type(e).__name__}: {str(e)[:160]}): the installed "
                         f"file is damaged; reinstall scikit-learn (pip install --force-reinstall scikit-learn)") \
            from None


class DigitsTask(ImageTask):
    name = "digits"

    def __init__(self, batch_size: int, val_fraction: float = 0.15, test_fraction: float = 0.15,
                 split_seed: int = 0, random_crop_padding: int = 0, horizontal_flip: bool = False) -> None:
        table = read_digits(digits_file())  # (1797, 64 pixels + label)
        self.x = table[:, :-1].reshape(-1, 1, 8, 8) / 16.0  # (N, 1, 8, 8) in [0, 1]
        self.y = table[:, -1].astype(np.int64)
        self.class_names = [str(d) for d in range(10)]
        self.prepare(batch_size, val_fraction, test_fraction, split_seed, random_crop_padding, horizontal_flip)
