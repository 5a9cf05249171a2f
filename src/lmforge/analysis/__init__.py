"""Analysis of trained models: cloze probes (and, later, attention maps, head importance, probing)."""
from lmforge.analysis.cloze import score_probes

__all__ = ["score_probes"]
