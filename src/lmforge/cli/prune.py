"""`lmforge prune`: structured pruning of a fine-tuned model (FFN neurons or attention heads).

    lmforge prune --model runs/sst/best --method ffn --sparsity 0.5 --data dev.jsonl --out runs/ffn50
"""
from __future__ import annotations


def cmd_prune(args) -> None:
    """Prune, save under --out/model, print the before/after table; prune.json beside it."""
    from rich.console import Console
    from rich.table import Table

    from lmforge.cli.common import UsageError
    from lmforge.compress.prune_report import run_prune
    from lmforge.tasks.finetune import task_info
    from lmforge.tasks.formats import read_task_file

    kind = args.task or task_info(args.model).get("kind")
    if kind is None:
        raise UsageError("--task is needed: the model directory has no task.json")
    records = read_task_file(args.data, kind, args.columns, True)
    extra = read_task_file(args.importance_data, kind, args.columns, True) if args.importance_data else None
    report = run_prune(args.model, records, args.out, args.method, args.sparsity, kind, extra)
    table = Table(title=f"{args.method} pruning at sparsity {args.sparsity}")
    for col in ("", "parameters", "safetensors MB", "metric", "forward s (batch 16)"):
        table.add_column(col, justify="right")
    for name in ("before", "after"):
        r = report[name]
        table.add_row(name, f"{r['parameters']:,}", f"{r.get('bytes', 0) / 1e6:.1f}", f"{r['metric']:.4f}",
                      f"{r['seconds_b16']:.4f}")
    Console().print(table)
    print(f"speed-up {report['speedup']:.2f}x; model in {args.out}/model, report in {args.out}/prune.json")


def add_parsers(sub) -> None:
    """Add the prune sub-command to the `lmforge` parser."""
    from lmforge.compress.prune_report import METHODS

    p = sub.add_parser("prune", help="structured pruning (FFN neurons or heads) that shrinks the matrices")
    p.add_argument("--model", required=True, help="a fine-tuned model directory (with task.json)")
    p.add_argument("--method", required=True, choices=METHODS, help="ffn: feed-forward units; heads: attention heads")
    p.add_argument("--sparsity", required=True, type=float, help="share removed, in (0, 1)")
    p.add_argument("--data", required=True, help="labelled data: importance and the metric")
    p.add_argument("--importance-data", help="labelled data importance is estimated on (default: --data)")
    p.add_argument("--task", help="task type (default: the model's task.json)")
    p.add_argument("--columns", help="field=column pairs, e.g. text=sentence,label=gold")
    p.add_argument("--out", required=True, help="directory for model/ and prune.json")
    p.set_defaults(func=cmd_prune)
