"""Fine-tuning task types, their data formats and metrics (see tasks/base.py for the contract).

A task module registers its Task classes with `lmforge.tasks.base.register`;
`task_class(kind)` finds them (importing the module named in base.MODULES on demand).
"""
from lmforge.tasks.base import TASKS, Task, register, task_class

__all__ = ["TASKS", "Task", "register", "task_class"]
