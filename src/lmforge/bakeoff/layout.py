"""The names a bake-off writes at the top of its OUT, defined once: the runner (runner.py, results.py,
plan_corpus.py) and the report (report.py) write under them, and `lmforge bakeoff` refuses a plan or an input
kept under one of them (cli.bakeoff.out_names), so the two lists cannot drift apart. Besides these, each arm
has a folder of its own, named after it (runner.BakeOff.arm_dir)."""
from __future__ import annotations

RESULTS = "results.jsonl"  # one verified row per finished (arm, seed, task): results.py
BUILT = "built.json"  # the checksums of the corpus files, built or the plan's own: results.built_files
LOG = "bakeoff.log"  # the plan's progress and every run's own log lines
SCHEDULE = "schedule.json"  # each arm's steps and counted FLOPs
REPORT = "report.md"  # the report: table, claims, curves
SUMMARY = "report.json"  # the report's numbers
CURVES = "learning_curves.png"  # each arm's pretraining loss against FLOPs
CORPUS = "corpus"  # folders: the plan's text built once (plan_corpus.corpus_files)
TOKENIZERS = "tokenizers"  # the run's tokenizer, trained once
TASKS = "tasks"  # the downstream tasks' splits, built once

WRITTEN = (RESULTS, BUILT, LOG, SCHEDULE, REPORT, SUMMARY, CURVES, CORPUS, TOKENIZERS, TASKS)
