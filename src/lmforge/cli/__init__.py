"""The `lmforge` command: one sub-command per job, a module per job in this package.

Exit status 0 on success, 2 on bad usage or bad input (a one-line message, no
traceback), 1 on an internal error.
"""
from __future__ import annotations

import argparse
import sys

from lmforge.cli import analysis, analysis_probe, bakeoff, data, distill, generate, model, options, pretrain, prune, quantize, retrieve, serve, tasks, tokenizer
from lmforge.cli.common import UsageError
from lmforge.config import ConfigError
from lmforge.io import CheckpointError

JOBS = (model, pretrain, tokenizer, data, tasks, generate, analysis, analysis_probe, prune, distill, quantize, retrieve, bakeoff, serve, options)  # each adds its sub-commands


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="lmforge", description="The `lmforge` command: one sub-command per job.")
    sub = parser.add_subparsers(dest="command", required=True)
    for job in JOBS:
        job.add_parsers(sub)
    return parser


def main(argv: list | None = None) -> int:
    """Entry point of the `lmforge` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (UsageError, ConfigError, CheckpointError, ValueError, OSError) as err:
        print(f"lmforge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
