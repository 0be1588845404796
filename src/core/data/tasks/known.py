"""The framework's registry of tasks: the `_target_` of every yaml of the `task` config group (the package's
conf/task/ and that group in the folders $ARCHSWEEP_CONFIG_PATH names). Code that builds a task from a
config it did not compose itself (a checkpoint's stored config) builds only these; a checkpoint cannot make
the framework call a class or function it names. Light (OmegaConf only)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from archsweep import conf_dir

EXTRA_CONF_ENV = "ARCHSWEEP_CONFIG_PATH"  # more config folders (os.pathsep-separated); read by the entry points too


def task_targets() -> dict[str, str]:
    """`_target_` -> the task option (yaml name) that names it."""
    folders = [conf_dir()] + [Path(f) for f in os.environ.get(EXTRA_CONF_ENV, "").split(os.pathsep) if f]
    targets: dict[str, str] = {}
    for folder in folders:
        for path in sorted((folder / "task").glob("*.yaml")):
            target = OmegaConf.load(path).get("_target_")
            if isinstance(target, str):
                targets.setdefault(target, path.stem)
    return targets


def check_task_target(task_cfg: dict[str, Any], where: str) -> None:
    """Refuse a task config whose `_target_` is not one of the framework's tasks (ValueError naming `where`)."""
    target = task_cfg.get("_target_")
    known = task_targets()
    if target not in known:
        raise ValueError(f"{where}: task._target_={target!r} is not one of the framework's tasks (the _target_ of a "
                         f"conf/task/*.yaml: {', '.join(sorted(known.values()))}); it is not built. A task of your "
                         f"own needs its yaml in a folder named by ${EXTRA_CONF_ENV}")
