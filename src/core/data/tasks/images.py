"""Image classification tasks (the Vision Transformer's data, `kind=vit`): `images` reads a folder of class
sub-folders of PNG/JPEG files, or an `.npz` file with arrays `x` (N, H, W) or (N, H, W, C) and `y` (N,); the
base class `ImageTask` also serves `digits` (`digits.py`).

The images are read once, when the task is built, so every problem with them (a missing path, a corrupt file,
mixed sizes, an empty class) is refused before training, naming the file. Nothing is unpickled: `.npz` files are
read with `np.load(allow_pickle=False)`, image files by Pillow. The split into train / val / test is stratified
(each class in the same proportions) and fixed by `split_seed`, the same for every run.

Batches (on the CPU): `images` (B, C, H, W) float32, standardised per channel with the training split's mean and
standard deviation; `labels` (B, 1), the class; `n_tokens` counts images (so `train/tokens_per_s` is images/s).
Training batch i draws B distinct training images from a generator seeded by (seed, i), so a resumed run sees
the same stream; validation and test run once through their split in order. Augmentations (training batches
only, off by default): `random_crop_padding` (zero-pad by that many pixels, then crop back at a random offset:
shifts of up to that many pixels) and `horizontal_flip` (mirror half the images).
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from archsweep.core.data import paths
from archsweep.core.data.tasks.base import Task
from archsweep.core.model.config import ModelConfig
from archsweep.variants.model import IMAGE, kinds_of

if TYPE_CHECKING:
    from collections.abc import Iterable

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
HOW = ("Give task.path a folder holding one sub-folder of PNG/JPEG images per class, or an .npz file with arrays "
       "x (N, H, W[, C]) and y (N,)")


def stratified_split(labels: np.ndarray, val_fraction: float, test_fraction: float,
                     seed: int) -> dict[str, np.ndarray]:
    """{split: indices}: each class shuffled by `seed`, round(n_c * fraction) of it to test, then to val, the rest
    to train (at least one of each class in train)."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_test, n_val = round(len(idx) * test_fraction), round(len(idx) * val_fraction)
        parts["test"].append(idx[:n_test])
        parts["val"].append(idx[n_test:n_test + n_val])
        parts["train"].append(idx[n_test + n_val:])
    return {split: np.sort(np.concatenate(p)) for split, p in parts.items()}


class ImageTask(Task):
    """Subclasses load `self.x` (N, C, H, W) float32 in [0, 1], `self.y` (N,) int64 and `self.class_names`,
    then call `self.prepare(...)`."""

    name = "images"
    forms = (IMAGE,)
    family = "classification"
    rate_unit = "images/s"
    test_splits = ("test",)
    x: np.ndarray
    y: np.ndarray
    class_names: list[str]

    def prepare(self, batch_size: int, val_fraction: float, test_fraction: float, split_seed: int,
                random_crop_padding: int, horizontal_flip: bool) -> None:
        for field, value, least in (("batch_size", batch_size, 1), ("random_crop_padding", random_crop_padding, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"task.{field}={value!r} must be an integer >= {least}")
        for field, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"task.{field}={value} must be in (0, 1)")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"task.val_fraction + task.test_fraction = {val_fraction + test_fraction} must be below 1 "
                             f"(the rest trains the model)")
        self.batch_size, self.crop, self.flip = batch_size, random_crop_padding, bool(horizontal_flip)
        self.n_classes = len(self.class_names)
        self.vocab_size = self.n_classes  # the model's outputs: one per class
        self.split = stratified_split(self.y, val_fraction, test_fraction, split_seed)
        empty = [s for s, idx in self.split.items() if len(idx) == 0]
        if empty:
            raise ValueError(f"task={self.name}: the {' and '.join(empty)} split(s) would be empty with "
                             f"val_fraction={val_fraction}, test_fraction={test_fraction} and {len(self.y)} images; "
                             f"raise the fractions or add images")
        train = self.x[self.split["train"]]
        self.mean = train.mean(axis=(0, 2, 3)).astype(np.float32)  # (C,)
        self.std = np.maximum(train.std(axis=(0, 2, 3)), 1e-6).astype(np.float32)

    @property
    def image_size(self) -> list[int]:
        return [int(self.x.shape[2]), int(self.x.shape[3])]

    def model_fields(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "src_vocab_size": None, "n_classes": self.n_classes,
                "image_size": self.image_size, "in_channels": int(self.x.shape[1])}

    def why_not(self, kind: str) -> str:
        return f"it feeds images, which only kind={' or '.join(kinds_of(self.forms))} reads"

    def max_input_len(self, kind: str) -> int:
        """Images are no token sequences (their token count depends on the model's patch size; see check_model)."""
        return 0

    def check_model(self, cfg: ModelConfig) -> None:
        super().check_model(cfg)
        given = {"n_classes": self.n_classes, "in_channels": int(self.x.shape[1])}
        for field, value in given.items():
            if getattr(cfg, field) != value:
                raise ValueError(f"model.{field}={getattr(cfg, field)} does not match task={self.name} ({value}); "
                                 f"leave model.{field}=null to take it from the task")
        if list(np.broadcast_to(cfg.image_size, 2)) != self.image_size:
            raise ValueError(f"model.image_size={cfg.image_size} does not match task={self.name}'s images "
                             f"({self.image_size}); leave model.image_size=null to take it from the task")
        n = cfg.variant("kind").n_tokens(cfg.sizes())
        limit = cfg.position_limit()
        if limit is not None and n > limit:
            raise ValueError(f"model.max_seq_len={cfg.max_seq_len} is shorter than the {n} tokens a "
                             f"{self.image_size[0]}x{self.image_size[1]} image makes with patch_size={cfg.patch_size}"
                             f" (pooling={cfg.pooling}), and pos={cfg.choice('pos')} has a table of max_seq_len "
                             f"positions; set model.max_seq_len>={n}")

    def n_batches(self, split: str) -> int | None:
        return None if split == "train" else math.ceil(len(self.split[split]) / self.batch_size)

    def make_batch(self, split: str, seed: int, index: int) -> dict[str, Any]:
        import torch

        from archsweep.core.data.tasks.batches import batch_seed

        rows = self.split[split]
        if split == "train":
            gen = torch.Generator().manual_seed(batch_seed(seed, split, index))
            pick = rows[torch.randperm(len(rows), generator=gen)[:self.batch_size].numpy()]
        else:
            gen, pick = None, rows[index * self.batch_size:(index + 1) * self.batch_size]
        images = torch.from_numpy((self.x[pick] - self.mean[:, None, None]) / self.std[:, None, None])  # (B, C, H, W)
        if gen is not None:
            images = self.augment(images, gen)
        labels = torch.from_numpy(self.y[pick]).long()[:, None]  # (B, 1)
        return {"images": images, "labels": labels, "n_tokens": len(pick)}

    def augment(self, images: Any, gen: Any) -> Any:
        import torch
        import torch.nn.functional as F

        if self.flip:
            mirror = torch.rand(images.shape[0], generator=gen) < 0.5
            images = torch.where(mirror[:, None, None, None], images.flip(-1), images)
        if self.crop:
            p, (h, w) = self.crop, images.shape[-2:]
            padded = F.pad(images, (p, p, p, p))  # zeros: the training mean after standardisation
            dy, dx = torch.randint(0, 2 * p + 1, (2, images.shape[0]), generator=gen).tolist()
            images = torch.stack([padded[i, :, y:y + h, x:x + w] for i, (y, x) in enumerate(zip(dy, dx, strict=True))])
        return images

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        from archsweep.core.data.tasks.batches import stream_loader

        if split not in self.split:
            raise ValueError(f"task={self.name} has no split {split!r}; its splits: {', '.join(self.split)}")
        return stream_loader(lambda i: self.make_batch(split, seed, i), start, self.n_batches(split), rank,
                             world_size)


def read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """x (N, C, H, W) float32 in [0, 1] and y (N,) int64 from an .npz with `x` and `y`; never unpickles."""
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in ("x", "y") if k not in data.files]
            if missing:
                raise ValueError(f"task.path={path} has no array {' or '.join(missing)} (it holds "
                                 f"{', '.join(data.files) or 'nothing'}); {HOW}")
            x, y = data["x"], data["y"]
    except ValueError as e:
        if "task.path" in str(e):
            raise
        raise ValueError(f"task.path={path} cannot be read as an .npz of plain arrays ({e}); it is not loaded "
                         f"(object arrays would need unpickling, which is never done)") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:  # a truncated copy has lost the archive's directory
        raise ValueError(f"task.path={path} is not a readable .npz file ({type(e).__name__}: {e}): truncated or "
                         f"damaged (an interrupted copy?); copy or save it again") from None
    if x.ndim not in (3, 4) or y.ndim != 1 or len(x) != len(y) or not len(x):
        raise ValueError(f"task.path={path}: x has shape {x.shape} and y {y.shape}; x must be (N, H, W) or "
                         f"(N, H, W, C) and y (N,), with the same N > 0")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"task.path={path}: y must hold integer class ids, not {y.dtype}")
    x = x[..., None] if x.ndim == 3 else x
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32) / scale, y.astype(np.int64)


def read_folder(root: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images of <root>/<class>/*.png|jpg|jpeg, classes in name order; every file is decoded here."""
    from PIL import Image, UnidentifiedImageError

    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"task.path={root} holds no class sub-folders; {HOW}")
    images, labels, first = [], [], None
    for label, folder in enumerate(classes):
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"task.path={root}: class {folder.name!r} ({folder}) holds no PNG or JPEG images; "
                             f"add images or remove the folder")
        for file in files:
            try:
                with Image.open(file) as im:
                    im.load()
                    array = np.asarray(im.convert("RGB" if im.mode not in ("L", "1", "I;16") else "L"))
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
                raise ValueError(f"task.path={root}: {file} is not a readable image ({e})") from None
            array = array[..., None] if array.ndim == 2 else array  # (H, W, C)
            if first is None:
                first = (file, array.shape)
            elif array.shape != first[1]:
                raise ValueError(f"task.path={root}: images have mixed sizes: {file} is {_size(array.shape)} but "
                                 f"{first[0]} is {_size(first[1])}; resize them to one size first")
            images.append(array)
            labels.append(label)
    x = np.stack(images).transpose(0, 3, 1, 2).astype(np.float32) / 255.0  # (N, C, H, W)
    return x, np.asarray(labels, dtype=np.int64), [c.name for c in classes]


def _size(shape: tuple[int, ...]) -> str:
    return f"{shape[1]}x{shape[0]} pixels with {shape[2]} channel(s)"


class ImagesTask(ImageTask):
    """`images`: any labelled image set at `path` (see the module docstring)."""

    def __init__(self, path: str, batch_size: int, val_fraction: float = 0.15, test_fraction: float = 0.15,
                 split_seed: int = 0, random_crop_padding: int = 0, horizontal_flip: bool = False,
                 data_dir: str | None = None, name: str = "images") -> None:
        self.name = name
        if path is None:
            raise ValueError(f"task.path is not set; {HOW}")
        source = paths.locate(path, data_dir, f"task.path={path}", HOW)
        if source.is_dir():
            self.x, self.y, self.class_names = read_folder(source)
        elif source.suffix.lower() == ".npz":
            self.x, self.y = read_npz(source)
            if self.y.min() < 0:
                raise ValueError(f"task.path={source}: class ids must be >= 0, found {int(self.y.min())}")
            self.class_names = [str(c) for c in range(int(self.y.max()) + 1)]
            empty = sorted(set(range(len(self.class_names))) - set(self.y.tolist()))
            if empty:
                raise ValueError(f"task.path={source}: class(es) {', '.join(map(str, empty))} have no images (y "
                                 f"holds ids 0..{len(self.class_names) - 1}); renumber the classes 0..K-1")
        else:
            raise ValueError(f"task.path={source} is neither a folder nor an .npz file; {HOW}")
        self.prepare(batch_size, val_fraction, test_fraction, split_seed, random_crop_padding, horizontal_flip)
