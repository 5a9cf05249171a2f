"""Shared by these tests: no loss.png drawn by their training runs (see tests/tasks/core.no_loss_plot)."""
from tests.tasks.core import no_loss_plot  # noqa: F401  (an autouse fixture)
