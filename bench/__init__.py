"""Side-by-side benchmarks of lmforge against the reference libraries: a package, run from the
repository's root as `python -m bench.<name>` (`python -m bench.run` rebuilds RESULTS.md)."""
