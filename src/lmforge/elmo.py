"""ELMo (Peters et al. 2018, "Deep contextualized word representations"): a bidirectional language
model over characters whose layers are a downstream task's features.

The forward LM models p(t_k | t_1 .. t_k-1), the backward LM p(t_k | t_k+1 .. t_N) (sec. 3.1); both
read the same token representations x_k^LM (a character CNN, layers/variants/elmo.py) and their
top layers share one softmax over a word vocabulary (an "lm" head that the bilm objective attaches:
objectives/bilm.py). Their LSTMs share nothing. A word's representation at layer j is
[h->_k,j ; h<-_k,j] and at layer 0 the token representation given to both directions, [x_k ; x_k]
(AllenNLP's layout), so every layer is 2 * d_model wide (sec. 3.2, eq. 1 mixes them: ScalarMix).

Inputs are character ids (tokenizer/chars.py) of whole sequences, sentence marks included: the
objective feeds <S> w_1 .. w_n </S>; `word_layers` adds and strips the marks itself. The model is
stateless by default (every batch starts from zero states, so results do not depend on what ran
before); config.stateful carries each row's final LSTM states into the next batch, detached, as the
original's training did over its streams (`reset_state` forgets them). As AllenNLP's stateful encoder, a
batch of other size takes the first rows (rows beyond the carried ones start from zeros) and the rows it
does not have keep their states; a row without words keeps its own.

A class of its own, chosen by architecture="elmo" (model.model_class), with the interface the io and
trainer read: config, heads, add_head, save, num_parameters, reset_parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.config.options import checked_argument
from lmforge.layers.variants.elmo import BiLSTM, CharEncoder
from lmforge.tokenizer.chars import check_sentences, sentence_chars
from lmforge.utils.modes import evaluating

# lmforge.io registers its save function here on import, as it does with lmforge.model (no import of io)
_SAVERS: list = []
MAX_BATCH_SIZE = 4096  # word_layers' sentences per pass: bounds one pass's memory


def register_saver(save) -> None:
    """Let `ELMo.save` call `save(model, path, format)` (lmforge.io registers itself)."""
    _SAVERS.append(save)


@dataclass
class BiLMOutput:
    """One pass of both LMs over right-padded sequences."""

    token: torch.Tensor  # (B, T, d_model): x_k^LM, zero at padding
    forward_states: list  # per LSTM layer (B, T, d_model): h->_k,j (layer j has read words <= k)
    backward_states: list  # per LSTM layer (B, T, d_model): h<-_k,j (layer j has read words >= k)
    mask: torch.Tensor  # (B, T) bool, True at real words

    @property
    def last_hidden_state(self) -> torch.Tensor:
        """(B, T, 2 d_model): the top layer of both directions."""
        return torch.cat([self.forward_states[-1], self.backward_states[-1]], dim=-1)

    def layers(self) -> torch.Tensor:
        """(n_layers + 1, B, T, 2 d_model): [x ; x], then [h-> ; h<-] of each LSTM layer."""
        first = torch.cat([self.token, self.token], dim=-1)
        rest = [torch.cat(pair, dim=-1) for pair in zip(self.forward_states, self.backward_states)]
        return torch.stack([first, *rest])


class ELMo(nn.Module):
    """The biLM: a character encoder shared by a forward and a backward LSTM stack (Peters et al. 2018)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.architecture != "elmo":
            raise ValueError(f"elmo.py: ELMo needs architecture='elmo', got {cfg.architecture!r}")
        self.config = cfg
        self.chars = CharEncoder(cfg)
        self.lstm = BiLSTM(cfg)
        self.heads = nn.ModuleDict()
        self.states: Optional[list] = None  # stateful mode: the last batch's final states (detached)

    def forward(self, char_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                stateless: bool = False) -> BiLMOutput:
        """char_ids (B, T, max_characters_per_token) of whole sequences (<S> .. </S> included); mask
        (B, T), 1 at real words, right-padded (default: words that are not all zeros). stateless: start
        from zeros and leave a stateful model's carried states as they are (its evaluation)."""
        mask = self._check(char_ids, attention_mask)
        return self._run(char_ids, mask, carry=self.config.stateful and not stateless)

    def _run(self, char_ids: torch.Tensor, mask: torch.Tensor, carry: bool) -> BiLMOutput:
        B, T, _ = char_ids.shape
        encoded = self.chars(char_ids[mask])  # (N, d_model): real words only
        token = encoded.new_zeros(B, T, encoded.shape[-1]).index_put((mask,), encoded)  # (B, T, d_model)
        states = self._carried(B) if carry else None
        fwd, bwd, final = self.lstm(token, mask, states)
        if carry:  # truncated back-propagation: the next batch starts from these values, not their graph
            self._keep(final)
        return BiLMOutput(token, fwd, bwd, mask)

    def _carried(self, B: int) -> Optional[list]:
        """The carried states fitted to B rows (AllenNLP's _get_initial_states): the first B rows, zeros
        for rows never carried; None where nothing is carried."""
        if self.states is None:
            return None

        def fit(s: torch.Tensor) -> torch.Tensor:
            return s[:B] if s.shape[0] >= B else torch.cat([s, s.new_zeros(B - s.shape[0], s.shape[1])])

        return [[(fit(h), fit(c)) for h, c in direction] for direction in self.states]

    def _keep(self, final: list) -> None:
        """Carry `final` (detached); rows past this batch's keep theirs (AllenNLP's _update_states)."""
        def merge(new: torch.Tensor, old: Optional[torch.Tensor]) -> torch.Tensor:
            new = new.detach()
            kept = old is None or old.shape[0] <= new.shape[0]
            return new if kept else torch.cat([new, old[new.shape[0]:]])

        old = self.states or [[(None, None)] * len(direction) for direction in final]
        self.states = [[(merge(h, oh), merge(c, oc)) for (h, c), (oh, oc) in zip(direction, kept)]
                       for direction, kept in zip(final, old)]

    def _check(self, char_ids, attention_mask) -> torch.Tensor:
        cfg = self.config
        L = cfg.max_characters_per_token
        if not isinstance(char_ids, torch.Tensor) or char_ids.dim() != 3 or char_ids.shape[-1] != L \
                or char_ids.dtype not in (torch.long, torch.int):  # what nn.Embedding indexes with
            got = f"{tuple(char_ids.shape)} {char_ids.dtype}" if isinstance(char_ids, torch.Tensor) \
                else type(char_ids).__name__
            raise ValueError(f"elmo: char_ids must be an int64 or int32 tensor (batch, words, {L}), "
                             f"got {got}")
        if char_ids.shape[1] == 0 or char_ids.shape[0] == 0:
            raise ValueError("elmo: char_ids is empty: a sequence needs at least one word")
        low, high = int(char_ids.min()), int(char_ids.max())
        if low < 0 or high >= cfg.n_characters:
            raise ValueError(f"elmo: char_ids holds character id {low if low < 0 else high} outside "
                             f"[0, {cfg.n_characters})")
        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
            raise ValueError(f"elmo: attention_mask must be a tensor (batch, words), got "
                             f"{type(attention_mask).__name__}")
        mask = char_ids.ne(0).any(-1) if attention_mask is None else attention_mask.bool()
        if tuple(mask.shape) != tuple(char_ids.shape[:2]):
            raise ValueError(f"elmo: attention mask of shape {tuple(mask.shape)} does not match "
                             f"(batch, words) = {tuple(char_ids.shape[:2])}")
        if (mask[:, 1:] & ~mask[:, :-1]).any():  # the backward LM starts from each row's last real word
            raise ValueError("elmo: the attention mask must be right padding (1s, then 0s)")
        return mask

    def word_layers(self, sentences: list, batch_size: int = 32) -> list:
        """Frozen features: per sentence (a list of words) a (n_layers + 1, n_words, 2 d_model) tensor on
        the model's device; layer 0 is [x ; x], the others [h-> ; h<-] (the <S> and </S> positions the
        LMs read are dropped). Eval mode and stateless, whatever the model's mode and config."""
        sentences = check_sentences(sentences, "word_layers(sentences)")
        # as every batch_size is read (a whole 8.0 is 8, a numpy number Python's); -1 batched nothing
        batch_size = checked_argument("batch_size", "int", {"low": 1, "high": MAX_BATCH_SIZE}, batch_size)
        device = next(self.parameters()).device
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # less padding per batch
        out: list = [None] * len(sentences)
        with evaluating(self), torch.no_grad():
            for start in range(0, len(order), batch_size):
                chunk = order[start: start + batch_size]
                words = [sentences[i] for i in chunk]
                chars, mask = sentence_chars(words, self.config.max_characters_per_token)
                layers = self._run(chars.to(device), mask.to(device), carry=False).layers()
                for b, i in enumerate(chunk):
                    out[i] = layers[:, b, 1: len(sentences[i]) + 1]  # (L + 1, n_words, 2 d_model)
        return out

    def set_fused_lstm(self, mode: str) -> "ELMo":
        """Run the LSTMs fused (one cuDNN call per layer and direction, checked against the clips,
        step by step again where one acted) or step by step: 'auto' (fused on CUDA), 'on' (fused on
        any device), 'off'. Not saved with the model: an execution choice."""
        self.lstm.set_fused(mode)
        return self

    def reset_state(self) -> None:
        """Forget the carried LSTM states (stateful mode): the next batch starts from zeros."""
        self.states = None

    def add_head(self, name: str, head: nn.Module) -> nn.Module:
        """Attach a head (the bilm objective's softmax); saved with the model."""
        self.heads[name] = head.train(self.training)
        return head

    def save(self, path, format: str = "lmforge") -> None:
        """Write the directory `path` in lmforge's format; Hugging Face has no ELMo to write to."""
        if format == "hf":
            raise ValueError("elmo: transformers has no ELMo model class, so there is no Hugging Face format "
                             "to write; save with format='lmforge'")
        if not _SAVERS:
            raise RuntimeError("saving needs lmforge.io (import lmforge)")
        _SAVERS[-1](self, path, format)

    def num_parameters(self, embeddings: bool = True) -> int:
        """Parameters of the biLM (heads, i.e. the softmax, excluded); without the character table."""
        total = sum(p.numel() for n, p in self.named_parameters() if not n.startswith("heads."))
        return total if embeddings else total - self.chars.embed.weight.numel()

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation of the character encoder and the LSTMs (heads keep their own)."""
        self.chars.reset_parameters()
        self.lstm.reset_parameters()
