"""ELMo's biLM objective (Peters et al. 2018, sec. 3.1): jointly maximise the log likelihood of the
forward and the backward language model,

    sum_k  log p(t_k | t_1 .. t_k-1; Θx, Θ->LSTM, Θs)  +  log p(t_k | t_k+1 .. t_N; Θx, Θ<-LSTM, Θs)

with the token representation Θx (the character CNN) and the softmax Θs shared by both directions.
An example is one sentence, <S> w_1 .. w_n </S> (longer ones cut into pieces of max_len words, each
between the marks). At position k the forward LM's top state h->_k predicts word k+1 and the backward
LM's h<-_k predicts word k-1; the loss is the mean of the two directions' mean cross-entropies (bilm-tf's
0.5 (L-> + L<-)), and each direction's perplexity is logged.

The softmax runs over the word vocabulary of the run's word tokenizer (tokenizer/chars.py): the full
softmax ("bilm"), or while training a sampled one ("bilm-sampled", Jean et al. 2015, as bilm-tf trains
with 8192 negatives per batch): the negatives are drawn from a log-uniform (Zipfian) proposal over the
frequency-ranked ids, every logit corrected by -log(k Q(w)), and a negative equal to the target
(an "accidental hit") removed. Its training perplexities are those of the sampled loss; evaluation
always uses the full softmax. A word out of the vocabulary is predicted as <UNK>, but the character CNN
reads its own characters where its example spells it ("oov", sentence_examples), as bilm-tf and AllenNLP
feed the raw words. A stateful model (config.stateful) carries its LSTM states from one
training batch to the next; evaluation starts every batch from zeros and leaves those states alone.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lmforge.data.shard_oov import sentence_parts
from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import Loss, Objective, tokenizer_pad, within
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.tokenizer.chars import vocabulary_chars, word_chars
from lmforge.utils.errors import shown

SAMPLES = 8192  # bilm-tf's n_negative_samples_batch


def sentence_examples(docs, tokenizer, max_len: int, seed: int = 0) -> list:
    """Each sentence as <S> w_1 .. w_n </S>, cut into pieces of max_len - 2 words. A sentence is a list
    of word ids, or (ids, {position: spelling}) as tokenizer/chars.spelled_ids gives: a piece then keeps
    the spellings of its <UNK> words as "oov" {position in the piece: word}, whose own characters
    collate feeds."""
    bos, eos = tokenizer.special_id("bos"), tokenizer.special_id("eos")
    if bos is None or eos is None:
        raise ValueError("objectives/bilm.py: the biLM needs a word tokenizer with <S> and </S> (bos and eos "
                         "tokens), as `lmforge pretrain` trains for it (tokenizer/chars.py)")
    if max_len < 3:
        raise ValueError(f"objectives/bilm.py: max_len={max_len} leaves no room for a word between "
                         "<S> and </S>")
    n = max_len - 2
    return [_piece(bos, eos, sentence, i, n) for doc in docs for sentence in doc
            for i in range(0, len(sentence_parts(sentence)[0]), n)]


def _piece(bos: int, eos: int, sentence, i: int, n: int) -> dict:
    """Words i .. i + n of a sentence between the marks, with its spelled <UNK> words where it has any
    (only those: a corpus of in-vocabulary words costs nothing more than its ids)."""
    ids, spellings = sentence_parts(sentence)
    example = {"input_ids": [bos, *ids[i: i + n], eos]}
    oov = {k - i + 1: word for k, word in (spellings or {}).items() if i <= k < i + n}
    return {**example, "oov": oov} if oov else example


def log_uniform(ids: torch.Tensor, V: int) -> torch.Tensor:
    """log Q(w) of the log-uniform proposal over ids 0..V-1: Q(w) = log((w + 2) / (w + 1)) / log(V + 1)."""
    return torch.log(torch.log1p(1.0 / (ids.float() + 1.0)) / math.log(V + 1.0))


def draw_log_uniform(k: int, V: int, device=None) -> torch.Tensor:
    """k ids drawn from the log-uniform proposal (inverse CDF; the global RNG, which the trainer seeds)."""
    u = torch.rand(k, device=device)
    return (torch.exp(u * math.log(V + 1.0)) - 1.0).long().clamp_(0, V - 1)


class BiLM(Objective):
    """Forward and backward next-word cross-entropy through one shared softmax (an "lm" head)."""

    name = "bilm"
    bounds = {"samples": within(0, integer=True)}  # 0: the full softmax; a negative one read as 0 unsaid
    all_used = True  # the full and the sampled softmax both run the head's transform (features())

    def __init__(self, model, pad_id: int = 0, chars: list | None = None, samples: int = 0,
                 unk_id: int | None = None) -> None:
        super().__init__(model, pad_id)
        if model.config.architecture != "elmo":
            raise ValueError(f"objectives/bilm.py: the biLM objective trains an ELMo model, not a "
                             f"{model.config.architecture}")
        self.check_values({"samples": samples})
        self.softmax = model.heads["softmax"] if "softmax" in model.heads else make_head(model, "lm")
        self.samples, self.unk_id = samples, unk_id  # unk_id: the words an example may spell
        L = model.config.max_characters_per_token
        # word id -> its characters (id 0..261 fit int16: a 793k-word vocabulary stays ~80 MB)
        self.char_table = torch.tensor(chars if chars is not None else [[0] * L], dtype=torch.int16)

    def carried(self):
        """A stateful biLM's last batch's final LSTM states (None where it carries none)."""
        return self.model.states

    def carry(self, state) -> None:
        """Start the next batch from the checkpoint's states, as the run did."""
        device = next(self.model.parameters()).device
        self.model.states = None if state is None else [[(h.to(device), c.to(device)) for h, c in direction]
                                                        for direction in state]

    @classmethod
    def build(cls, model, tokenizer, samples: int = 0) -> "BiLM":
        """The objective over `tokenizer`'s words (each id's characters tabulated once)."""
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(f"objectives/bilm.py: the tokenizer has {tokenizer.vocab_size} words but the "
                             f"softmax only {model.config.vocab_size} rows (vocab_size)")
        chars = vocabulary_chars(tokenizer, model.config.max_characters_per_token)
        return cls(model, pad_id=tokenizer_pad(tokenizer), chars=chars, samples=samples,
                   unk_id=tokenizer.special_id("unk"))

    def collate(self, examples: list) -> dict:
        """Padded word ids and attention mask, and char_ids (B, T, max_characters): each word's characters,
        its own where an example spells an <UNK> word ("oov"), all zeros at padding."""
        batch = super().collate([{"input_ids": e["input_ids"]} for e in examples])
        ids = batch["input_ids"]
        if int(ids.max()) >= len(self.char_table):
            raise ValueError(f"objectives/bilm.py: word id {int(ids.max())} is beyond the tokenizer's "
                             f"{len(self.char_table)} words")
        chars = self.char_table[ids].long()
        L = chars.shape[-1]
        for b, e in enumerate(examples):
            for k, word in e.get("oov", {}).items():
                if not isinstance(word, str) or not word or not isinstance(k, int) \
                        or not 0 <= k < len(e["input_ids"]) or e["input_ids"][k] != self.unk_id:
                    raise ValueError(f"objectives/bilm.py: example {b} spells position {k!r} as "
                                     f"{shown(word)}, which is not one of its <UNK> words")
                chars[b, k] = torch.tensor(word_chars(word, L))  # the target stays the id (<UNK>)
        batch["char_ids"] = chars * batch["attention_mask"][..., None]
        return batch

    def forward(self, batch: dict) -> Loss:
        """Mean of the forward LM's loss (h->_k predicts word k+1) and the backward LM's (h<-_k, word k-1)."""
        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        # evaluation reads each batch from zero states and leaves the training stream's carried ones
        # alone (bilm-tf evaluates a model of its own): else its loss hung on what ran before it
        out = self.model(batch["char_ids"], mask, stateless=not self.training)
        p = self.model.config.dropout  # bilm-tf drops the top LSTM outputs before the softmax too
        fwd = F.dropout(out.forward_states[-1], p, self.training)  # (B, T, d)
        bwd = F.dropout(out.backward_states[-1], p, self.training)
        both = mask[:, 1:] & mask[:, :-1]  # (B, T-1): a real word and its real neighbour
        forward_loss = self._loss(fwd[:, :-1][both], ids[:, 1:][both])
        backward_loss = self._loss(bwd[:, 1:][both], ids[:, :-1][both])
        loss = (forward_loss + backward_loss) / 2
        return Loss(loss, {"forward_perplexity": forward_loss.detach().exp(),
                           "backward_perplexity": backward_loss.detach().exp()})

    def _loss(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of (N, d) states for (N,) words: sampled while training with samples."""
        V = self.model.config.vocab_size
        if self.training and 0 < self.samples < V:
            return self._sampled(hidden, target, V)
        return F.cross_entropy(self.softmax(hidden).float(), target)

    def _sampled(self, hidden: torch.Tensor, target: torch.Tensor, V: int) -> torch.Tensor:
        negatives = draw_log_uniform(self.samples, V, hidden.device)  # (k,) shared by the batch
        logits = self.sampled_logits(hidden, target, negatives).float()  # the true word is class 0
        return F.cross_entropy(logits, torch.zeros_like(target))

    def sampled_logits(self, hidden: torch.Tensor, target: torch.Tensor,
                       negatives: torch.Tensor) -> torch.Tensor:
        """(N, 1 + k) logits of (N, d) states over their (N,) targets then the (k,) negatives, each minus
        log(k Q(w)), an accidental hit -inf: the full softmax's logits at those ids, corrected."""
        # features(): the head's transform (lm_transform=True) as the full softmax applies it, else training
        # scored other logits than evaluation (and d_embed != d_model failed on shapes); none: the states
        hidden = self.softmax.features(hidden)  # (N, E)
        weight, bias = self.softmax.projection()  # (V, E), (V,) or None
        V, log_k = weight.shape[0], math.log(len(negatives))
        true = (hidden * weight[target]).sum(-1) - log_k - log_uniform(target, V)  # (N,)
        noise = hidden @ weight[negatives].T - log_k - log_uniform(negatives, V)  # (N, k)
        if bias is not None:
            true, noise = true + bias[target], noise + bias[negatives]
        noise = noise.masked_fill(negatives[None] == target[:, None], float("-inf"))  # accidental hits
        return torch.cat([true[:, None], noise], dim=1)

    def heads(self) -> dict:
        """The shared softmax, saved with the model as its "softmax" head (kind "lm")."""
        return {"softmax": self.softmax}


_SENTENCES = ExampleFormat("custom", build=sentence_examples, spellings=True)
register(ObjectiveSpec(name="bilm", build=BiLM.build, summary="ELMo's forward + backward LMs, full softmax",
                       aliases=("elmo",), architectures=("elmo",), tokenizer="words", examples=_SENTENCES))
register(ObjectiveSpec(name="bilm-sampled", build=BiLM.build, options={"samples": SAMPLES},
                       summary=f"ELMo's biLM with a sampled softmax ({SAMPLES} negatives a batch)",
                       architectures=("elmo",), tokenizer="words", examples=_SENTENCES))
