"""RAG trained end to end (Lewis et al. 2020, sec. 2.4): a question encoder retrieves the top k
passages from a fixed index, an encoder-decoder generator reads "[CLS] passage [SEP] question [SEP]"
once per passage, and RAG-Sequence or RAG-Token marginalisation (rag.py) gives the answer's
likelihood; its gradient trains the generator and, through p(z | x), the question encoder, while the
passage embeddings stay fixed. k = 0 is the closed-book generator (the question alone). Answers decode
as sec. 2.5 does (rag_decode.py): RAG-Token by beam search over its next-token marginal (greedily at
num_beams=1), RAG-Sequence by a beam search per passage (greedy at num_beams=1) and Thorough Decoding
(every hypothesis scored under every passage) or Fast Decoding (p(y | x, z) = 0 off z's beam).

As in the paper (a BERT question encoder, a BART generator), the generator may have a tokenizer of its
own: passages, questions and answers are then cut into its pieces, and the question encoder reads the
question with the retriever's.
"""
from __future__ import annotations

import torch

from lmforge.objectives.base import IGNORE, Loss, Objective, pad
from lmforge.objectives.seq2seq import add_decoder_inputs
from lmforge.retrieval.dpr import BiEncoder, pad_batch
from lmforge.retrieval.heads import head_or_new, seeded_heads
from lmforge.retrieval.job_options import ANSWER_PIECES
from lmforge.retrieval.rag import rag_loss, rag_sequence_log_likelihood
from lmforge.retrieval.rag_decode import check_decoding, fast_scores, passage_beams, token_beam_search


class RAGObjective(Objective):
    """Answer NLL marginalised over the retrieved passages; the question encoder trains with it. An LM
    head the generator lacks starts untrained, drawn from `seed` (the run's)."""

    name = "rag"

    def __init__(self, generator, retriever: BiEncoder, passage_vectors: torch.Tensor, passage_tokens: list,
                 k: int = 3, kind: str = "token", max_len: int = 64, tokenizer=None, seed: int = 0) -> None:
        tok = tokenizer or retriever.tokenizer  # the generator's
        super().__init__(generator, pad_id=tok.special_id("pad") or 0)
        self.tokenizer = tok
        if generator.config.vocab_size < tok.vocab_size:
            raise ValueError(f"the generator's vocabulary ({generator.config.vocab_size}) is smaller than "
                             f"its tokenizer's ({tok.vocab_size})")
        if generator.config.architecture != "encoder-decoder":
            raise ValueError("a RAG generator must be an encoder-decoder, not "
                             f"{generator.config.architecture}")
        if kind not in ("sequence", "token"):
            raise ValueError(f"kind={kind!r} is not one of sequence, token")
        if not 0 <= k <= len(passage_vectors):
            raise ValueError(f"k={k}: the index holds {len(passage_vectors)} passages (need 0 <= k <= that)")
        self.retriever, self.question_encoder = retriever, retriever.model  # registered: trained too
        self.register_buffer("passages", passage_vectors.float(), persistent=False)  # (N, d), fixed
        self.passage_tokens, self.k, self.kind, self.max_len = passage_tokens, k, kind, max_len
        with seeded_heads(seed):  # a generator without an LM head starts one drawn from the run's seed
            self.lm = head_or_new(generator, "lm", "lm")
        self.cls, self.sep = tok.special_id("cls"), tok.special_id("sep")
        if self.cls is None or self.sep is None:
            raise ValueError("the generator's tokenizer needs [CLS] and [SEP] tokens (its inputs are "
                             "[CLS] passage [SEP] question [SEP])")
        # a generator built without one (a hand-made BART) starts from [CLS], as the preset generators do;
        # written into its config, so that the saved generator generates from it too (as text2text does)
        start = generator.config.decoder_start_token_id
        self.start = self.cls if start is None else start
        if start is None:
            generator.config = generator.config.replace(decoder_start_token_id=self.start)

    def collate(self, examples: list) -> dict:
        """{"question": encoder ids, "source": question ids without specials, "labels": answer ids}
        -> padded tensors, with the decoder's shifted inputs."""
        q_ids, q_mask = pad_batch([e["question"] for e in examples],
                                  self.retriever.tokenizer.special_id("pad") or 0)
        batch = {"input_ids": q_ids, "attention_mask": q_mask,
                 "labels": pad([e["labels"] for e in examples], IGNORE),
                 "source": pad([e["source"] for e in examples], self.pad_id),
                 "source_len": torch.tensor([len(e["source"]) for e in examples])}
        return add_decoder_inputs(batch, examples, self.start, self.pad_id)

    def retrieve(self, batch: dict) -> tuple:
        """((B, K) log p(z | x) with gradient to the question encoder, (B, K) passage rows)."""
        q = self.retriever.embed(batch["input_ids"], batch["attention_mask"])  # (B, d)
        if self.k == 0:
            return torch.zeros(len(q), 1, device=q.device), None
        with torch.no_grad():
            rows = torch.topk(q @ self.passages.T, self.k, dim=1).indices  # (B, K): the fixed index
        scale = 1 / self.retriever.options.temperature if self.retriever.options.normalize else 1.0
        scores = scale * torch.einsum("bd,bkd->bk", q, self.passages[rows])
        return torch.log_softmax(scores, dim=-1), rows

    def generator_inputs(self, batch: dict, rows) -> tuple:
        """(B * K, S) ids and mask: [CLS] passage [SEP] question [SEP] for each retrieved passage
        ([CLS] question [SEP] closed-book); the passage first, as the reference implementation
        joins title / text // question, so its title starts at the same position every time."""
        out = []  # read to lists once: one device-to-host copy each, not one per question
        sources, lengths = batch["source"].tolist(), batch["source_len"].tolist()
        retrieved = rows.tolist() if rows is not None else [[None]] * len(sources)
        for source, length, passages in zip(sources, lengths, retrieved):
            question = source[:length]
            for row in passages:
                passage = self.passage_tokens[row] if row is not None else []
                room = max(0, self.max_len - len(question) - 3)
                out.append([self.cls, *([*passage[:room], self.sep] if passage else []), *question, self.sep])
        ids, mask = pad_batch(out, self.pad_id)
        return ids.to(batch["source"].device), mask.to(batch["source"].device)

    def logits(self, batch: dict, doc_rows, decoder_input_ids, decoder_mask) -> torch.Tensor:
        """(B, K, T, V) generator logits for each retrieved passage."""
        ids, mask = self.generator_inputs(batch, doc_rows)
        K = len(ids) // len(decoder_input_ids)
        hidden = self.model(ids, mask, decoder_input_ids=decoder_input_ids.repeat_interleave(K, 0),
                            decoder_attention_mask=decoder_mask.repeat_interleave(K, 0),
                            run_heads=False).last_hidden_state  # (B * K, T, d)
        logits = self.lm(hidden)
        return logits.view(len(decoder_input_ids), K, *logits.shape[1:])

    def forward(self, batch: dict) -> Loss:
        """RAG-Sequence or RAG-Token NLL of the answers (mean over questions)."""
        doc_logp, rows = self.retrieve(batch)
        logits = self.logits(batch, rows, batch["decoder_input_ids"], batch["decoder_attention_mask"])
        return Loss(rag_loss(logits, batch["labels"], doc_logp, self.kind))

    def heads(self) -> dict:
        """The generator's LM head, saved with it."""
        return {"lm": self.lm}

    @torch.no_grad()
    def answer(self, batch: dict, max_new_tokens: int = 8, num_beams: int = 1, decoding: str = "thorough") \
            -> list:
        """Answers (ids, up to [SEP]) as the objective's kind decodes (sec. 2.5): RAG-Token by beam search
        over its next-token marginal (greedy at num_beams=1); RAG-Sequence by a beam search per passage and
        `decoding` "thorough" or "fast" (sequence_candidates). The counts are bounded as generate's are."""
        num_beams, max_new_tokens = check_decoding(num_beams, decoding, self.kind, max_new_tokens)
        doc_logp, rows = self.retrieve(batch)
        if self.kind == "sequence" and rows is not None:
            return self.sequence_answers(batch, doc_logp, rows, max_new_tokens, num_beams, decoding)
        ids, mask = self.generator_inputs(batch, rows)  # (B * K, S)
        # one beam is greedy decoding (the same tokens: tests/retrieval/test_rag_decode.py), so one search
        out = token_beam_search(self, ids, mask, doc_logp, max_new_tokens, num_beams)
        answers = []
        for row in out[:, 1:].tolist():
            answers.append(row[:row.index(self.sep)] if self.sep in row else row)
        return answers

    def sequence_answers(self, batch: dict, doc_logp: torch.Tensor, rows: torch.Tensor, max_new_tokens: int,
                         num_beams: int = 1, decoding: str = "thorough") -> list:
        """RAG-Sequence's answers: of each question's candidates, the one of highest p(y | x) (the first
        drawn, that of the best passage, on a tie), without its [SEP]."""
        answers = []
        for candidates, scores in self.sequence_candidates(batch, doc_logp, rows, max_new_tokens, num_beams,
                                                           decoding):
            best = candidates[int(scores.argmax())]
            answers.append(best[:-1] if best[-1:] == [self.sep] else best)
        return answers

    @torch.no_grad()
    def sequence_candidates(self, batch: dict, doc_logp, rows, max_new_tokens: int, num_beams: int = 1,
                            decoding: str = "thorough") -> list:
        """Per question (candidates, (C,) log p(y | x)): the union of each passage's beam (at num_beams=1
        its greedy answer), each ending at its first [SEP] (kept); thorough: p(y | x) = sum_z p(z | x)
        p(y | x, z) over all k passages, by extra teacher-forced passes; fast: over the passages whose
        beam holds y, as the search scored it (no extra pass)."""
        ids, mask = self.generator_inputs(batch, rows)  # (B * K, S)
        K, out = rows.shape[1], []
        beams = passage_beams(self, ids, mask, K, max_new_tokens, num_beams)  # one beam: each greedy answer
        for b, passages in enumerate(beams):
            if decoding == "fast":
                candidates, scores = fast_scores(passages, doc_logp[b])
                candidates = [list(c) for c in candidates]
            else:
                candidates = [list(c) for c in dict.fromkeys(y for beam in passages for y in beam)]
                scores = self._sequence_log_likelihoods(batch, b, doc_logp, rows, candidates)
            out.append((candidates, scores))
        return out

    def _sequence_log_likelihoods(self, batch: dict, b: int, doc_logp, rows, candidates: list) \
            -> torch.Tensor:
        """(C,) log p(y | x) under RAG-Sequence of each candidate answer of question b (teacher-forced)."""
        C, device = len(candidates), batch["source"].device
        question = {key: batch[key][b:b + 1].expand(C, *batch[key].shape[1:])
                    for key in ("source", "source_len")}
        decoder_ids, decoder_mask = pad_batch([[self.start, *c[:-1]] for c in candidates], self.pad_id)
        logits = self.logits(question, rows[b:b + 1].expand(C, -1), decoder_ids.to(device),
                             decoder_mask.to(device))
        targets = pad(candidates, IGNORE).to(device)
        return rag_sequence_log_likelihood(logits, targets, doc_logp[b:b + 1].expand(C, -1))


QUESTION_PIECES = 48  # of a question the generator reads after its passage (bench/retrieval_qa.py's)


def rag_examples(retriever: BiEncoder, records: list, tokenizer=None) -> list:
    """Question records -> RAGObjective examples (the first answer is the target, ended by [SEP]); the
    generator's source and labels in `tokenizer`'s pieces (default: the retriever's)."""
    tok = tokenizer or retriever.tokenizer
    sep = tok.special_id("sep")
    return [{"question": retriever.ids(r["question"]),
             "source": tok.encode(r["question"], add_special_tokens=False).ids[:QUESTION_PIECES],
             "labels": tok.encode(r["answers"][0], add_special_tokens=False).ids[:ANSWER_PIECES - 1] + [sep]}
            for r in records]


def passage_tokens(retriever: BiEncoder, passages: list, tokenizer=None) -> list:
    """Each passage's ids without special tokens (title. text), as the generator reads them (in
    `tokenizer`'s pieces; default: the retriever's)."""
    from lmforge.retrieval.dpr import passage_text

    tok = tokenizer or retriever.tokenizer
    return [tok.encode(passage_text(p), add_special_tokens=False).ids for p in passages]


def answer_matches(tokenizer, ids: list, answers: list) -> bool:
    """Whether generated ids are a gold answer: its exact tokens, or text equal under SQuAD's
    normalisation (decoding alone would miss "short - breathed" for Short-breathed)."""
    from lmforge.tasks.qa import exact_match

    text = tokenizer.decode(ids)
    return any(ids == tokenizer.encode(gold, add_special_tokens=False).ids or exact_match(gold, text)
               for gold in answers)


def exact_match_rate(objective: RAGObjective, records: list, batch_size: int = 32, max_new_tokens: int = 8,
                     num_beams: int = 1, decoding: str = "thorough") -> float:
    """Share of records whose answer (RAGObjective.answer's decoding) is a gold answer (answer_matches)."""
    objective.eval()
    examples, hits = rag_examples(objective.retriever, records, objective.tokenizer), 0
    device = next(objective.parameters()).device
    for start in range(0, len(records), batch_size):
        batch = {k: v.to(device) for k, v in objective.collate(examples[start:start + batch_size]).items()}
        answers = objective.answer(batch, max_new_tokens, num_beams=num_beams, decoding=decoding)
        for ids, r in zip(answers, records[start:start + batch_size]):
            hits += answer_matches(objective.tokenizer, ids, r["answers"])
    return hits / max(1, len(records))
