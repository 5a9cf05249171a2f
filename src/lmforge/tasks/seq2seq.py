"""Sequence-to-sequence fine-tuning (Sutskever et al. 2014; Vaswani et al. 2017): a source text in,
a target text out (summarisation, translation, any rewriting) for T5, BART and any encoder-decoder,
one built from a preset (transformer-base) included.

- Input: the source text after an optional task prefix and a colon, as T5 wrote its tasks (app. D
  of Raffel et al. 2020): prefix "summarize" gives "summarize: {source}", prefix "translate English
  to German" gives "translate English to German: {source}"; in the tokenizer's single-text
  template, truncated to max_len tokens.
- Target: the target text in the same template, ending with the end token (eos; a BERT-style
  tokenizer's [SEP]), truncated to max_len tokens with the end token kept; a job says how many
  targets were cut (say_cut), as it says how many sources were.
- Training: teacher forcing (objectives/seq2seq.py): the decoder reads the target shifted right
  behind the decoder start token and predicts every target token; cross-entropy, mean over tokens.
- Prediction: lmforge.generate, greedy (num_beams=1) or beam search (num_beams > 1), at most
  max_new_tokens tokens (at most the decoder's context, max_seq_len: a job says so where that cuts the
  budget, with say_cut), stopping where lmforge generate stops (`stop_ids`: the eos_token_id of the
  checkpoint's generation_config.json, else of its config, as the reference's generate stops); the text
  is decoded without special tokens. The decoding settings a checkpoint recommends (sampling, min_length,
  n-gram blocking ...) are not applied, so a score depends on task.json's options alone.
- Metrics (tasks/metrics.py): corpus BLEU (sacrebleu), primary, so best/ keeps the highest; ROUGE-1,
  ROUGE-2 and ROUGE-L F-measures (rouge-score); both 0-100; gen_len, the mean words predicted.

Special ids: a checkpoint's own start id is kept (T5: <pad>, BART: </s>). A model without one (built
from a preset) starts its decoder with the end token, as fairseq's Transformer does (its decoder
inputs begin with </s>). Missing ids are written into the model's config, so the fine-tuned model
generates on its own (`lmforge generate`).
"""
from __future__ import annotations

from lmforge.config.options import OptionsError
from lmforge.generate import GenerationOptions, generate
from lmforge.generate.recommended import recommendation
from lmforge.io import CheckpointError
from lmforge.tasks import metrics
from lmforge.tasks.base import Task, notes, register
from lmforge.tasks.text2text import TeacherForced


def end_token(tokenizer) -> int:
    """The id that ends a target: the tokenizer's eos, or its [SEP] (BERT-style); an error if neither."""
    end = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
    if end is None:
        raise ValueError("seq2seq needs a tokenizer with an end-of-sequence token (eos or sep) to end "
                         "its targets and stop generation")
    return end


def stop_ids(model, end: int) -> list:
    """The ids generation stops on, by lmforge generate's rule (the reference's: its generation_config's
    eos ids): the eos_token_id the model's directory recommends, else its config's, else `end` (the
    tokenizer's, written into the config); an error when `end`, which every target ends with, is not one."""
    try:
        found = recommendation(model)  # the accessor generate reads (a compiled model's inner one too)
    except (OptionsError, CheckpointError):  # a recommendation that failed its check: not read
        found = None
    eos = found.fields.get("eos_token_id") if found is not None else None
    where = "its generation_config.json" if eos is not None else "its config"
    eos = model.config.eos_token_id if eos is None else eos
    stops = [end] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if end not in stops:
        raise ValueError(f"the model stops generating at eos_token_id={eos} ({where}) but the tokenizer ends "
                         f"text with id {end}: targets would end where generation never stops; use the "
                         f"model's own tokenizer, or set eos_token_id to {end}")
    return stops


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


@register
class Seq2SeqTask(TeacherForced, Task):
    """Source text -> target text with an encoder-decoder's LM head (see the module docstring)."""

    kind = "seq2seq"
    head = "lm"
    options = ("prefix", "num_beams", "max_new_tokens")
    target_cut = 0  # records of the last encode_all whose target was cut to max_len tokens (say_cut)
    _budget_said = False  # whether say_cut told of max_new_tokens capped at the context (said once)

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 128,
                 prefix: str | None = None, num_beams: int = 1, max_new_tokens: int = 64) -> None:
        if model.config.architecture != "encoder-decoder":
            raise ValueError(f"task 'seq2seq' needs an encoder-decoder (T5, BART, transformer-base), not a "
                             f"{model.config.architecture}")
        if prefix is not None and not isinstance(prefix, (str, int, float)):
            raise ValueError(f"prefix must be text, got {prefix!r}")
        # checked before the base class takes the model over (and drops its other heads)
        beams, budget = _positive("num_beams", num_beams), _positive("max_new_tokens", max_new_tokens)
        end = end_token(tokenizer)
        self.stops = stop_ids(model, end)
        super().__init__(model, tokenizer, labels, max_len)
        self.prefix = (str(prefix).strip().rstrip(":").strip() or None) if prefix is not None else None
        # generate refuses more new tokens than the decoder's context, which the default 64 exceeds on small
        # models: capped (so task.json holds the budget the scores used) and said once (say_cut)
        self.asked_new_tokens = budget
        self.num_beams, self.max_new_tokens, self.end = beams, min(budget, model.config.max_seq_len), end
        cfg = model.config
        self.start = self.end if cfg.decoder_start_token_id is None else cfg.decoder_start_token_id
        ids = {"decoder_start_token_id": self.start, "eos_token_id": self.end, "pad_token_id": self.pad_id}
        model.config = cfg.replace(**{k: v for k, v in ids.items() if getattr(cfg, k) is None})

    # ---- data side ----------------------------------------------------------------------------
    def source(self, record: dict) -> str:
        """The encoder's input text of a record: "{prefix}: {source}", or the source alone."""
        return f"{self.prefix}: {record['source']}" if self.prefix else record["source"]

    def target(self, text: str) -> list:
        """Token ids of a target text, ending with the end token (within max_len); a cut is counted
        (`target_cut`, told by say_cut)."""
        enc = self.tokenizer.encode(text, max_length=self.max_len)
        ids = enc.ids  # cut: tokens left over, or no room left for the end token appended below
        self.target_cut += enc.truncated or len(ids) + (ids[-1:] != [self.end]) > self.max_len
        if ids[-1:] != [self.end]:  # a template without an end token (GPT-2's), or one cut off
            ids = ids[:self.max_len - 1] + [self.end]
        return ids

    def encode_all(self, records: list) -> list:
        """The base's examples; `target_cut` counts the records whose target was cut to max_len tokens."""
        self.target_cut = 0
        return super().encode_all(records)

    def say_cut(self, n: int, what: str, log=None) -> None:
        """The base's line on cut sources, and one on cut targets: a target cut trains the model to stop
        early, so it is said as a cut source is."""
        super().say_cut(n, what, log)
        say = notes(log)
        if self.target_cut:
            say(f"{self.target_cut} of {n} {what} records have a target longer than max_len={self.max_len} "
                f"tokens, cut to its first {self.max_len - 1} and the end token for the loss (scores compare "
                f"the whole target); raise max_len to train on more")
        if self.asked_new_tokens > self.max_new_tokens and not self._budget_said:
            self._budget_said = True
            say(f"max_new_tokens={self.asked_new_tokens} is more than the decoder's context, max_seq_len="
                f"{self.max_new_tokens}: predictions are cut at {self.max_new_tokens} tokens")

    def encode(self, record: dict) -> list:
        """One example: the source ids and, when the record has a target, the target as labels."""
        example = {"input_ids": self.encode_capped(self.source(record)).ids}
        if record.get("target") is not None:
            example["labels"] = self.target(record["target"])
        return [example]

    # ---- model side ---------------------------------------------------------------------------
    def predict(self, batch: dict) -> list:
        """Each example's generated ids (without the start token), up to its first stop token."""
        # options given whole: a checkpoint's generation_config.json (do_sample, min_length, ...) would
        # make the scores depend on settings task.json does not hold, and vary from run to run; its stop
        # ids are the model's, given (a stop id outside the vocabulary is never produced: left out)
        stops = [i for i in self.stops if i < self.model.config.vocab_size]
        out = generate(self.model, batch["input_ids"], batch["attention_mask"], options=GenerationOptions(),
                       max_new_tokens=self.max_new_tokens, num_beams=self.num_beams, eos_token_id=stops,
                       pad_token_id=self.pad_id, decoder_start_token_id=self.start)
        rows = [row[1:] for row in out.tolist()]
        return [row[:next((i for i, t in enumerate(row) if t in stops), len(row))] for row in rows]

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The text of each record's generated ids (special tokens left out)."""
        predictions = [""] * len(records)
        for example, ids in zip(examples, outputs):
            predictions[example["record"]] = self.tokenizer.decode(ids).strip()
        return predictions

    def score(self, records: list, predictions: list) -> dict:
        """bleu (primary), rouge1, rouge2, rougeL (0-100) and gen_len against the records' targets."""
        return metrics.generation_metrics([str(r["target"]).strip() for r in records], predictions)
