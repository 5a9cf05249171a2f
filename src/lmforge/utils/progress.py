"""The progress bar of long jobs (training, building a retrieval index, embedding a file): rich's,
items done of a total with the time left, drawn only where enabled."""
from __future__ import annotations


class Bar:
    """`total` items under `label`, from `start`; `fields`, {name: text with "{}"}, are extra columns
    (a training run's loss and speed) set through update(); on standard error with stderr=True (where
    standard output carries results). Silent when not enabled."""

    def __init__(self, total: int, label: str, enabled: bool = True, start: int = 0,
                 fields: dict | None = None, stderr: bool = False) -> None:
        self.bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        fields = fields or {}
        extra = [TextColumn(text.replace("{}", f"{{task.fields[{name}]}}")) for name, text in fields.items()]
        self.bar = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), *extra,
                            TimeRemainingColumn(), console=Console(stderr=True) if stderr else None)
        self.task = self.bar.add_task(label, total=total, completed=start, **dict.fromkeys(fields, "-"))
        self.bar.start()

    def update(self, done: int, **fields) -> None:
        """Move to `done` items, with new values of the extra columns."""
        if self.bar is not None:
            self.bar.update(self.task, completed=done, **fields)

    def close(self) -> None:
        """Stop drawing."""
        if self.bar is not None:
            self.bar.stop()
