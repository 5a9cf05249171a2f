"""SpanBERT's span masking without the span-boundary objective (Joshi et al. 2020, Table 6's
"Span Masking" row beside "Span Masking + SBO"): geometric spans of whole words are masked as in
SpanMLM, and only the masked LM is trained, so a bake-off can tell the masking's share of the gain
from the SBO's."""
from __future__ import annotations

from lmforge.data.stream import ExampleFormat
from lmforge.objectives.base import Loss
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.objectives.spanbert import SpanMLM


class SpanMaskedLM(SpanMLM):
    """Geometric span masking, masked LM only (no SBO head, no SBO loss)."""

    name = "span-mlm"
    uses_sbo = False  # read by FLOP accounting (lmforge.bakeoff.flops): no SBO is computed
    all_used = True  # the masked LM's loss alone, which runs its head on every batch (MaskedLM.all_used)

    def __init__(self, model, mask_id: int, **mlm) -> None:
        super().__init__(model, mask_id, **mlm)
        del self.sbo  # SpanMLM builds the SBO head; this objective never runs it, so it holds no weights

    def forward(self, batch: dict) -> Loss:
        """Masked LM loss at the positions of the masked spans."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"), run_heads=False).last_hidden_state
        return self.mlm_loss(hidden, batch["labels"])


register(ObjectiveSpec(name="span-mlm", build=SpanMaskedLM.build,
                       summary="span masking without SBO (SpanBERT ablation)",
                       architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("sentences", word_starts=True)))
