"""Compression: int8 quantisation, structured pruning (FFN neurons; heads live in analysis/), distillation."""
