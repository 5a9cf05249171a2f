"""REALM: retrieval-augmented language model pre-training (Guu et al. 2020).

A masked input x retrieves documents z from a knowledge corpus, and a knowledge-augmented encoder
fills x's masks from "[CLS] x [SEP] z [SEP]":

- p(z | x) = softmax_z f(x, z),  f(x, z) = Embed_input(x)^T Embed_doc(z)              (eq. 2)
- p(y | z, x) = prod_j p(y_j | z, x) over the masked tokens (the MLM head)            (eq. 3)
- p(y | x) = sum_{z in top k} p(y | z, x) p(z | x)                                     (eq. 1, sec. 3.1)

Sec. 3.4's choices, all here: salient span masking (salient.py), a null document (the empty z, for
masks no document helps with) always among the candidates, no trivial retrieval (x's own passage is
never retrieved), and the maximum inner product search over a stale index refreshed with the current
Embed_doc every `refresh_every` training forward passes, while the top k's scores are recomputed with
the current parameters (sec. 3.2), so Embed_input and Embed_doc both learn from the MLM loss: the
gradient of log p(y | x) moves f(x, z) up for documents with p(y | z, x) > p(y | x).

The index (N, d) and the forward count are buffers of the objective, saved in every checkpoint, so a
resumed run continues with the index it had (exact resume).
"""
from __future__ import annotations

import re

import torch

from lmforge.objectives.base import IGNORE, Loss, Objective, pad
from lmforge.retrieval.answers import whole_words
from lmforge.retrieval.dpr import BiEncoder, pad_batch, passage_text
from lmforge.retrieval.heads import head_or_new, seeded_heads


def realm_log_likelihood(span_log_probs: torch.Tensor, doc_log_probs: torch.Tensor) -> torch.Tensor:
    """log p(y | x) = log sum_z p(z | x) p(y | z, x): (B, K) log p(y | z, x) and log p(z | x) -> (B,)."""
    return torch.logsumexp(doc_log_probs + span_log_probs, dim=-1)


class REALMObjective(Objective):
    """Salient-span MLM marginalised over retrieved documents; model = the knowledge-augmented encoder,
    retriever = Embed_input (its model) and Embed_doc (its passage model), all three trained; an MLM
    head the model lacks starts untrained, drawn from `seed` (the run's)."""

    name = "realm"

    def __init__(self, model, retriever: BiEncoder, passages: list, k: int = 4, refresh_every: int = 100,
                 max_len: int = 192, null_document: bool = True, seed: int = 0) -> None:
        tok = retriever.tokenizer
        super().__init__(model, pad_id=tok.special_id("pad") or 0)
        if model.config.architecture != "encoder":
            raise ValueError("REALM's knowledge-augmented encoder must be an encoder, not "
                             f"{model.config.architecture}")
        if max_len > model.config.max_seq_len:
            raise ValueError(f"max_len={max_len} is longer than the knowledge-augmented encoder's "
                             f"max_seq_len={model.config.max_seq_len}")
        if not passages:
            raise ValueError("REALM needs a knowledge corpus: no passages given")
        if k < 0 or refresh_every < 1 or (k == 0 and not null_document):
            raise ValueError("need k >= 0, refresh_every >= 1, and a document to read "
                             "(k > 0 or the null one)")
        self.retriever, self.input_encoder = retriever, retriever.model  # registered: trained and saved
        if retriever.passage_model is not None:
            self.doc_encoder = retriever.passage_model
        with seeded_heads(seed):  # a model without an MLM head starts one drawn from the run's seed
            self.lm = head_or_new(model, "lm", "lm")
        self.k, self.refresh_every, self.max_len, self.null_document = (k, refresh_every, max_len,
                                                                        null_document)
        self.cls, self.sep = tok.special_id("cls"), tok.special_id("sep")
        self.doc_tokens = [tok.encode(passage_text(p), add_special_tokens=False).ids for p in passages]
        self.doc_inputs = [retriever.ids(passage_text(p)) for p in passages]  # what Embed_doc reads
        dim, device = (retriever.model.config.d_model,
                       next(retriever.encoder_for(passage=True).parameters()).device)
        # on Embed_doc's device: the index's device is where documents are sent to be embedded
        self.register_buffer("index", torch.zeros(len(passages), dim,
                                                  device=device))  # (N, d) Embed_doc, stale
        self.register_buffer("forwards", torch.zeros((), dtype=torch.long))
        if k:  # the index of the starting Embed_doc (a resumed run loads its own instead); k = 0 reads none
            self.refresh()

    def run_settings(self) -> dict:
        """What decides the updates beyond the weights (documents read, index refreshes): recorded in the
        Trainer's checkpoints, so a resume with others is refused rather than continued with them."""
        return {"k": self.k, "refresh_every": self.refresh_every, "max_len": self.max_len,
                "null_document": self.null_document}

    def refresh(self) -> None:
        """Re-embed every document with the current Embed_doc (eval mode, no gradient)."""
        self.index.copy_(self.retriever.encode_ids(self.doc_inputs, passage=True).to(self.index))

    def _embed_docs(self, rows: list) -> torch.Tensor:  # id lists -> (n, d) with Embed_doc
        ids, mask = pad_batch(rows, self.pad_id)
        device = self.index.device
        return self.retriever.embed(ids.to(device), mask.to(device), passage=True)

    def collate(self, examples: list) -> dict:
        """{"x", "labels", "source"} -> the query batch for Embed_input ([CLS] x [SEP]) and x itself."""
        queries = [[self.cls, *e["x"][:self.retriever.options.max_length - 2], self.sep] for e in examples]
        ids, mask = pad_batch(queries, self.pad_id)
        return {"input_ids": ids, "attention_mask": mask, "x": pad([e["x"] for e in examples], self.pad_id),
                "x_len": torch.tensor([len(e["x"]) for e in examples]),
                "labels": pad([e["labels"] for e in examples], IGNORE),
                "source": torch.tensor([e["source"] for e in examples])}

    def retrieve(self, batch: dict) -> tuple:
        """((B, K') log p(z | x) with gradient to both encoders, (B, K') document rows, -1 for the null
        document), K' = k (+ 1 with the null document)."""
        if self.training:
            if self.k and int(self.forwards) and int(self.forwards) % self.refresh_every == 0:
                self.refresh()
            self.forwards += 1
        q = self.retriever.embed(batch["input_ids"], batch["attention_mask"])  # (B, d) Embed_input(x)
        B = len(q)
        rows = torch.empty(B, 0, dtype=torch.long, device=q.device)
        docs = q.new_zeros(B, 0, q.shape[-1])
        if self.k:
            with torch.no_grad():  # the stale index only chooses the top k; x's own passage is excluded
                scores = (q @ self.index.T).scatter(1, batch["source"][:, None], float("-inf"))
                rows = torch.topk(scores, min(self.k, len(self.index) - 1), dim=1).indices  # (B, K)
            docs = self._embed_docs([self.doc_inputs[r]
                                     for r in rows.flatten().tolist()]).view(B, -1, q.shape[-1])
        if self.null_document:
            null = self._embed_docs([[self.cls, self.sep]])  # the empty document
            docs = torch.cat([docs, null.expand(B, 1, -1)], 1)
            rows = torch.cat([rows, rows.new_full((B, 1), -1)], 1)
        scale = 1 / self.retriever.options.temperature if self.retriever.options.normalize else 1.0
        f = scale * torch.einsum("bd,bkd->bk", q, docs)  # fresh f(x, z) for the candidates
        return torch.log_softmax(f.float(), dim=-1), rows

    def reader_inputs(self, batch: dict, rows: torch.Tensor) -> dict:
        """(B * K', S) ids, mask and segments of "[CLS] x [SEP] z [SEP]" ("[CLS] x [SEP]" for the null
        document), and the labels of x's masked tokens at their positions."""
        ids, segments, labels = [], [], []
        xs, lengths, gold = batch["x"].tolist(), batch["x_len"].tolist(), batch["labels"].tolist()
        for x, n, y, docs in zip(xs, lengths, gold, rows.tolist()):
            for row in docs:
                doc = self.doc_tokens[row][:max(0, self.max_len - n - 3)] + [self.sep] if row >= 0 else []
                ids.append([self.cls, *x[:n], self.sep, *doc])
                segments.append([0] * (n + 2) + [1] * len(doc))
                labels.append([IGNORE, *y[:n]])
        device = batch["x"].device
        ids_t, mask = pad_batch(ids, self.pad_id)
        return {"input_ids": ids_t.to(device), "attention_mask": mask.to(device),
                "segment_ids": pad(segments, 0).to(device), "labels": pad(labels, IGNORE).to(device)}

    def token_log_probs(self, batch: dict, rows: torch.Tensor) -> tuple:
        """((B, K', M, V) log p(. | z, x) at the masked tokens, (B, M) their gold ids); M = masked tokens
        of the example with the most (padded with IGNORE)."""
        inputs = self.reader_inputs(batch, rows)
        segments = inputs["segment_ids"] if self.model.config.n_segments else None
        hidden = self.model(inputs["input_ids"], inputs["attention_mask"], segment_ids=segments,
                            run_heads=False).last_hidden_state  # (B * K', S, d)
        B, K = rows.shape
        labels = inputs["labels"][:, :hidden.shape[1]].view(B, K, -1)[:, 0]  # (B, T): the same in every row
        masked = labels != IGNORE
        M = int(masked.sum(1).max())
        order = torch.argsort((~masked).int(), dim=1, stable=True)[:, :M]  # masked positions first, in order
        gold = labels.gather(1, order).masked_fill(~masked.gather(1, order), IGNORE)  # (B, M)
        picked = hidden.view(B, K, *hidden.shape[1:]).gather(
            2, order[:, None, :, None].expand(B, K, M, hidden.shape[-1]))  # (B, K, M, d)
        return torch.log_softmax(self.lm(picked).float(), dim=-1), gold

    def score(self, batch: dict) -> tuple:
        """((B, K') log p(z | x), (B, K') rows, (B, K', M, V) token log-probs, (B, M) gold ids,
        (B, K') log p(y | z, x))."""
        doc_logp, rows = self.retrieve(batch)
        token_logp, gold = self.token_log_probs(batch, rows)
        real = gold != IGNORE
        span = token_logp.gather(-1, gold.clamp(min=0)[:, None, :, None].expand(-1, rows.shape[1], -1, 1))
        span = span.squeeze(-1).masked_fill(~real[:, None], 0.0).sum(-1)  # (B, K') log p(y | z, x)
        return doc_logp, rows, token_logp, gold, span

    def forward(self, batch: dict) -> Loss:
        """-log p(y | x) (eq. 1), mean over examples; metrics: the marginal's span accuracy and the
        probability the retriever gives the null document."""
        doc_logp, _, token_logp, gold, span = self.score(batch)
        loss = -realm_log_likelihood(span, doc_logp).mean()
        metrics = {"span_accuracy": span_correct(token_logp, doc_logp, gold).float().mean().detach()}
        if self.null_document:
            metrics["p_null"] = doc_logp[:, -1].exp().mean().detach()
        return Loss(loss, metrics)

    def heads(self) -> dict:
        """The MLM head of the knowledge-augmented encoder."""
        return {"lm": self.lm}


def token_correct(token_log_probs: torch.Tensor, doc_log_probs: torch.Tensor,
                  gold: torch.Tensor) -> torch.Tensor:
    """(B, M) whether each masked token's argmax under the marginal sum_z p(z | x) p(y_j | z, x) is
    gold (True at padding)."""
    marginal = torch.logsumexp(doc_log_probs[:, :, None, None] + token_log_probs, dim=1)  # (B, M, V)
    return (marginal.argmax(-1) == gold) | (gold == IGNORE)


def span_correct(token_log_probs: torch.Tensor, doc_log_probs: torch.Tensor,
                 gold: torch.Tensor) -> torch.Tensor:
    """(B,) whether every masked token of the span is right under the marginal (token_correct)."""
    return token_correct(token_log_probs, doc_log_probs, gold).all(-1)


def contains(text: str, answer: str) -> bool:
    """Whether `answer` occurs in `text` as whole words."""
    return re.search(whole_words(answer), text) is not None  # case-sensitive: the masked span's own text


@torch.no_grad()
def evaluate_realm(objective: REALMObjective, examples: list, passages: list, batch_size: int = 16) -> dict:
    """Over held-out salient-span examples: the marginal's span accuracy and (per example) token
    accuracy, the mean log p(y | x), the mean p(null | x), and answer recall (the share whose masked
    text is in a retrieved document)."""
    objective.eval()
    device, sums = objective.index.device, {"span_accuracy": 0.0, "token_accuracy": 0.0,
                                            "log_likelihood": 0.0, "answer_recall": 0.0}
    if objective.null_document:
        sums["p_null"] = 0.0
    for start in range(0, len(examples), batch_size):
        part = examples[start:start + batch_size]
        batch = {k: v.to(device) for k, v in objective.collate(part).items()}
        doc_logp, rows, token_logp, gold, span = objective.score(batch)
        right = token_correct(token_logp, doc_logp, gold)
        sums["span_accuracy"] += float(right.all(-1).sum())
        sums["token_accuracy"] += float((right & (gold != IGNORE)).sum(-1).div(
            (gold != IGNORE).sum(-1)).sum())
        sums["log_likelihood"] += float(realm_log_likelihood(span, doc_logp).sum())
        sums["answer_recall"] += sum(any(r >= 0 and contains(passage_text(passages[r]), e["answer"])
                                         for r in row)
                                     for e, row in zip(part, rows.tolist()))
        if objective.null_document:
            sums["p_null"] += float(doc_logp[:, -1].exp().sum())
    return {k: round(v / max(1, len(examples)), 4) for k, v in sums.items()}
