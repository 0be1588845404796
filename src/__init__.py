"""archsweep: an experiment framework for Transformer architecture variants.

The folder `src/` is the package `archsweep`: `archsweep.variants` holds the swappable parts in plain PyTorch,
`archsweep.core` the framework in five wings (model, data, eval, train, report). Importing this package is
light (no torch), so command-line entry points can answer `--help` fast.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def conf_dir() -> Path:
    """The Hydra config folder: `archsweep/conf` in an installed package, else the repository's `conf/`."""
    here = Path(__file__).resolve().parent
    installed = here / "conf"
    return installed if installed.is_dir() else here.parent / "conf"
