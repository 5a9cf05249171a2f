"""Analysis of trained models: cloze probes (and, later, attention maps, head importance, probing)."""
from lmforge.analysis.cloze import compare, score_probes

__all__ = ["compare", "score_probes"]
