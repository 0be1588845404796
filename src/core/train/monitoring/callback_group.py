"""The `callbacks` config group: Lightning callbacks a user adds to train.py's own (checkpoints, progress,
decoding, diagnostics), one entry each with a `_target_`, as in lightning-hydra-template:

    python train.py callbacks=early_stopping                      # conf/callbacks/early_stopping.yaml
    python train.py +callbacks.swa._target_=lightning.pytorch.callbacks.StochasticWeightAveraging \\
        +callbacks.swa.swa_lrs=0.01
    python train.py callbacks=none                                # none

`check_callbacks` runs with job.py's checks, before training: it imports each target (Lightning only when an
entry names a Lightning class) and refuses one that is not a Lightning `Callback`, or whose arguments the class
does not take. `make_callbacks` instantiates the checked entries for the Trainer.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

CALLBACK = "lightning.pytorch.callbacks.callback.Callback"  # where lightning.pytorch.Callback is defined
EXAMPLE = "lightning.pytorch.callbacks.EarlyStopping"
HYDRA_KEYS = ("_target_", "_args_", "_recursive_", "_convert_", "_partial_")


def locate(path: str) -> Any:
    """The object a dotted path names (Hydra's `get_object`); ValueError with Hydra's reason in one line."""
    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")  # it logs the failure too; the ValueError says it once
    level = hydra_log.level
    hydra_log.setLevel(logging.CRITICAL)
    try:
        return get_object(path)
    except ImportError as e:
        raise ValueError(" ".join(line.strip() for line in str(e).splitlines() if line.strip())) from None
    finally:
        hydra_log.setLevel(level)


def _is_callback(obj: Any) -> bool:
    return isinstance(obj, type) and any(f"{c.__module__}.{c.__qualname__}" == CALLBACK for c in obj.__mro__)


def check_entry(key: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict) or not isinstance(entry.get("_target_"), str):
        raise ValueError(f"callbacks.{key} has no _target_; give the class of a Lightning callback, e.g. "
                         f"+callbacks.{key}._target_={EXAMPLE}, or remove the entry with ~callbacks.{key}")
    target = entry["_target_"]
    try:
        cls = locate(target)
    except ValueError as e:
        raise ValueError(f"callbacks.{key}._target_={target} cannot be imported ({e}); give the full import path "
                         f"of a Lightning callback class, e.g. {EXAMPLE}") from None
    if not _is_callback(cls):
        raise ValueError(f"callbacks.{key}._target_={target} is not a Lightning callback (a subclass of "
                         f"lightning.pytorch.Callback); name one, e.g. {EXAMPLE}, or remove the entry with "
                         f"~callbacks.{key}")
    if entry.get("_partial_"):
        raise ValueError(f"callbacks.{key}._partial_=true would give the Trainer a partial, not a callback; "
                         f"remove _partial_")
    kwargs = {k: v for k, v in entry.items() if k not in HYDRA_KEYS}
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to check against: instantiate will tell
        return entry
    try:
        signature.bind(*entry.get("_args_", []), **kwargs)
    except TypeError as e:
        raise ValueError(f"callbacks.{key}: {target} {e}; its arguments: "
                         f"{', '.join(signature.parameters) or 'none'}") from None
    return entry


def check_callbacks(block: Any) -> dict[str, dict[str, Any]]:
    """The resolved `callbacks` block (a plain dict; None: none) -> name -> checked entry. An entry set to null
    (`callbacks.<name>=null`) is off. ValueError names the key and the fix."""
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ValueError(f"callbacks={block!r} must map names to callbacks, each with a _target_; e.g. "
                         f"callbacks=early_stopping, +callbacks.<name>._target_={EXAMPLE}, or callbacks=none")
    return {str(key): check_entry(str(key), entry) for key, entry in block.items() if entry is not None}


def make_callbacks(entries: dict[str, dict[str, Any]]) -> list[Any]:
    """The checked entries, instantiated in order; a constructor's own refusal becomes a ConfigError naming the
    key."""
    from hydra.utils import instantiate

    from archsweep.core.train.config.setup import ConfigError

    made = []
    for key, entry in entries.items():
        try:
            made.append(instantiate(entry))
        except Exception as e:  # Hydra wraps the constructor's error
            raise ConfigError(f"callbacks.{key}: {e.__cause__ or e}") from None
    return made
