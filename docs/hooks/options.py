"""mkdocs hook: a page's `<!-- options: NAME -->` marker becomes the table of that job's options, made
from its options object (name, default, bounds, help), so a guide's options never drift from the code."""
from __future__ import annotations

import importlib
import json
import re

# marker name -> "module:class" of the options object it lists
OPTIONS = {
    "generation": "lmforge.generate.options:GenerationOptions",
    "training": "lmforge.train.config:TrainConfig",
    "recipe": "lmforge.train.pretrain_options:RecipeOptions",
    "finetuning": "lmforge.tasks.finetune:TaskConfig",
    "model": "lmforge.config.model:ModelConfig",
    "server": "lmforge.serve.limits:Limits",
    "distillation": "lmforge.compress.task_distillation:DistillConfig",
    "sparse": "lmforge.compress.sparse_finetune:SparseConfig",
}
MARKER = re.compile(r"<!-- options: ([a-z_]+) -->")


def options_table(name: str) -> str:
    """The markdown table of the options object registered as `name`."""
    from lmforge.config.options import bounds_text, help_rows

    module, cls = OPTIONS[name].split(":")
    rows = help_rows(getattr(importlib.import_module(module), cls))
    lines = ["| option | default | what it does [bounds] |", "|---|---|---|"]
    for option, default, text in rows:
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        lines.append(f"| `{option}` | `{shown}` | {text.replace('|', '&#124;')} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace every options marker of a page with its table (an unknown name fails the build)."""
    return MARKER.sub(lambda m: options_table(m.group(1)), markdown)
