"""`lmforge generate` and `lmforge fill-mask`: text from a model directory that holds a tokenizer."""
from __future__ import annotations

import json

import torch


class TextStream:
    """Prints the text of a growing list of ids as it grows (decoding piece by piece would lose
    WordPiece joins and split multi-byte characters)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.printed = tokenizer, [], ""

    def __call__(self, chosen: torch.Tensor) -> None:
        self.ids.append(int(chosen[0]))
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):  # wait for a whole character
            self._show(text)

    def close(self) -> None:
        """Print what was held back (an incomplete character at the end stays as decoded)."""
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.printed):
            self._show(text)
        print()

    def _show(self, text: str) -> None:
        print(text[len(self.printed):], end="", flush=True)
        self.printed = text


def _encoder_decoder(model) -> bool:
    return model.config.architecture == "encoder-decoder"


def cmd_generate(args) -> None:
    """Continue a prompt (decoders) or answer it (encoder-decoders) with a model directory's LM head."""
    from lmforge.cli import UsageError
    from lmforge.generate import generate
    from lmforge.io import load
    from lmforge.tokenizer import load_tokenizer

    if args.stream and args.num_beams > 1:
        raise UsageError("--stream needs --num-beams 1: beam search knows its best text only at the end")
    model, tokenizer = load(args.model), load_tokenizer(args.model)
    seq2seq = _encoder_decoder(model)
    # an encoder reads the text with its template (T5: text </s>); a decoder continues the bare text
    ids = torch.tensor([tokenizer.encode(args.prompt, add_special_tokens=seq2seq).ids])
    eos = model.config.eos_token_id if model.config.eos_token_id is not None else tokenizer.eos_id
    stream = TextStream(tokenizer) if args.stream else None
    if not seq2seq:
        print(args.prompt, end="", flush=True)
    out = generate(model, ids, max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
                   temperature=args.temperature or 1.0, top_k=args.top_k, top_p=args.top_p,
                   num_beams=args.num_beams, length_penalty=args.length_penalty,
                   no_repeat_ngram_size=args.no_repeat_ngram, min_new_tokens=args.min_new_tokens,
                   eos_token_id=eos, prefix_lm=args.prefix_lm,
                   generator=torch.Generator().manual_seed(args.seed), streamer=stream)
    if stream is not None:
        stream.close()
    else:
        print(tokenizer.decode(out[0, 1 if seq2seq else ids.shape[1]:].tolist()))


def cmd_fill_mask(args) -> None:
    """Print the top-k fillings of the mask with their probabilities (one per line, or JSON lines)."""
    from lmforge.fill_mask import fill_mask
    from lmforge.io import load
    from lmforge.tokenizer import load_tokenizer

    model, tokenizer = load(args.model), load_tokenizer(args.model)
    for c in fill_mask(model, tokenizer, args.text, top_k=args.top_k, max_span=args.max_span):
        if args.json:
            row = {"token": c.token, "score": c.score, "sequence": c.sequence, "token_id": c.token_id}
            print(json.dumps(row, ensure_ascii=False))
        else:
            print(f"{c.score:.4f}  {c.token!r:20s}  {c.sequence}")


def add_parsers(sub) -> None:
    """Register `generate` and `fill-mask` on the `lmforge` sub-command parser."""
    p = sub.add_parser("generate", help="continue a prompt (model directory with a tokenizer)")
    p.add_argument("prompt")
    p.add_argument("--model", required=True)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampling")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (greedy: 1)")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="beam score = log-probability / length ** this (> 0 favours longer texts)")
    p.add_argument("--no-repeat-ngram", type=int, default=0, help="never repeat an n-gram of this size")
    p.add_argument("--min-new-tokens", type=int, default=0, help="no end of text before this many tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument("--prefix-lm", action="store_true",
                   help="read the prompt bidirectionally (a decoder pretrained with --objective prefix-lm)")
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("fill-mask", help="top-k fillings of [MASK] / <mask> with probabilities")
    p.add_argument("text", help='e.g. "Paris is the [MASK] of France."')
    p.add_argument("--model", required=True, help="directory with the model and its tokenizer")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--max-span", type=int, default=10, help="T5/BART: most tokens generated for the mask")
    p.add_argument("--json", action="store_true", help="one JSON object per candidate")
    p.set_defaults(func=cmd_fill_mask)
