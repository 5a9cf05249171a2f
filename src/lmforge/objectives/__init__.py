"""Pretraining objectives, one per file: data-side corruption, heads and loss. Each file registers
its objective names with the registry (registry.py); importing this package imports every file of
it, so the registry is complete: a new objective is one new file here, and no edit elsewhere."""
import importlib  # noqa: I001 (the objectives are imported in the order --help lists them)
import pkgutil

from lmforge.objectives.base import IGNORE, Loss, Objective
# the built-in objectives, in the order `lmforge pretrain --help` lists them
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.pairs import PairMLM
from lmforge.objectives.spanbert import SpanMLM
from lmforge.objectives.structbert import StructuralMLM
from lmforge.objectives.rtd import ReplacedTokenDetection
from lmforge.objectives.clm import CausalLM
from lmforge.objectives.prefix_lm import EncoderDecoderPrefixLM, PrefixLM, prefix_lm
from lmforge.objectives.t5_span_corruption import SpanCorruption
from lmforge.objectives.denoising import Denoising
from lmforge.objectives.plm import PermutationLM
from lmforge.objectives.distilbert import Distillation, student_from_teacher
from lmforge.objectives.seq2seq import Seq2SeqLM
from lmforge.objectives.registry import ObjectiveSpec, aliases, get, names, register, specs, unregister

# any other file of the package registers itself too (sorted by name, after the built-ins)
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["IGNORE", "CausalLM", "Distillation", "Loss", "MaskedLM", "Objective", "PairMLM",
           "ReplacedTokenDetection", "SpanMLM", "StructuralMLM", "student_from_teacher"]
__all__ += ["Denoising", "EncoderDecoderPrefixLM", "PrefixLM", "Seq2SeqLM", "SpanCorruption", "prefix_lm"]
__all__ += ["PermutationLM"]
__all__ += ["ObjectiveSpec", "aliases", "get", "names", "register", "specs", "unregister"]
