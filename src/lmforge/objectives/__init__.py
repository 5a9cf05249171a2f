"""Pretraining objectives, one per file: data-side corruption, heads and loss."""
from lmforge.objectives.base import IGNORE, Loss, Objective
from lmforge.objectives.clm import CausalLM
from lmforge.objectives.denoising import Denoising
from lmforge.objectives.distillation import Distillation, student_from_teacher
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.pairs import PairMLM
from lmforge.objectives.plm import PermutationLM
from lmforge.objectives.prefix_lm import EncoderDecoderPrefixLM, PrefixLM, prefix_lm
from lmforge.objectives.rtd import ReplacedTokenDetection
from lmforge.objectives.seq2seq import Seq2SeqLM
from lmforge.objectives.span import SpanMLM
from lmforge.objectives.span_corruption import SpanCorruption
from lmforge.objectives.structural import StructuralMLM

__all__ = ["IGNORE", "CausalLM", "Distillation", "Loss", "MaskedLM", "Objective", "PairMLM",
           "ReplacedTokenDetection", "SpanMLM", "StructuralMLM", "student_from_teacher"]
__all__ += ["Denoising", "EncoderDecoderPrefixLM", "PrefixLM", "Seq2SeqLM", "SpanCorruption", "prefix_lm"]
__all__ += ["PermutationLM"]
