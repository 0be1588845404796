"""Tasks: data sources behind one interface (`Task`). A task is chosen with `task=<name>` (conf/task/<name>.yaml,
whose `_target_` names the class)."""

from archsweep.core.data.tasks.base import IGNORE_INDEX, SPLITS, Task

__all__ = ["IGNORE_INDEX", "SPLITS", "Task"]
