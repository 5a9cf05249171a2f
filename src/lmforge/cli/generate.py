"""`lmforge generate` and `lmforge fill-mask`: text from a model directory that holds a tokenizer."""
from __future__ import annotations

import json
import math
import sys

import torch


class TextStream:
    """Prints the text of a growing list of ids as it grows (decoding piece by piece would lose
    WordPiece joins and split multi-byte characters), after `prefix` (the prompt a decoder continues),
    which is printed with the first new token: a refusal before that prints nothing."""

    def __init__(self, tokenizer, prefix: str = "") -> None:
        self.tokenizer, self.ids, self.printed, self.prefix = tokenizer, [], "", prefix

    def __call__(self, chosen: torch.Tensor) -> None:
        self.ids.append(int(chosen[0]))
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):  # wait for a whole character
            self._show(text)

    def close(self) -> None:
        """Print what was held back (an incomplete character at the end stays as decoded)."""
        text = self.tokenizer.decode(self.ids)
        self._show(text if text.startswith(self.printed) else self.printed)
        print()

    def _show(self, text: str) -> None:
        print(self.prefix + text[len(self.printed):], end="", flush=True)
        self.printed, self.prefix = text, ""


def _encoder_decoder(model) -> bool:
    return model.config.architecture == "encoder-decoder"


def load_named(name) -> tuple:
    """(directory, model, tokenizer) of --model: a model directory or an installed model, resolved as
    every command resolves it (io.find_model_dir; a preset name, without weights, is refused)."""
    from lmforge.io import find_model_dir, load
    from lmforge.tokenizer import check_fits, load_tokenizer

    path = find_model_dir(name)
    model, tokenizer = load(path), load_tokenizer(path)
    check_fits(tokenizer, model)  # a tokenizer emitting ids the model lacks is refused, not used
    return path, model, tokenizer


def cmd_generate(args) -> None:
    """Continue a prompt (decoders) or answer it (encoder-decoders) with a model directory's LM head."""
    from lmforge.cli.common import UsageError
    from lmforge.generate import generate

    check_numbers(args)  # before the model is loaded: a bad flag costs nothing
    path, model, tokenizer = load_named(args.model)
    check_generator(args.model, model)
    seq2seq = _encoder_decoder(model)
    if not tokenizer.encode(args.prompt, add_special_tokens=False).ids:
        raise UsageError(f"the prompt {args.prompt!r} holds no tokens: give some text")
    # an encoder reads the text with its template (T5: text </s>); a decoder continues the bare text
    ids = torch.tensor([tokenizer.encode(args.prompt, add_special_tokens=seq2seq).ids])
    eos = model.config.eos_token_id if model.config.eos_token_id is not None else tokenizer.eos_id
    options, taken = decoding_options(args, path, 1 if seq2seq else ids.shape[1])
    check_options(args, options, model.config.max_seq_len, 1 if seq2seq else ids.shape[1])
    start = decoder_start(args.model, model, tokenizer) if seq2seq else None
    if taken:  # say where settings the user did not type come from (after every refusal)
        print("settings from the checkpoint: " + ", ".join(f"{k}={v}" for k, v in taken.items()),
              file=sys.stderr)
    prompt = "" if seq2seq else args.prompt  # printed with the first new token, after every refusal
    stream = TextStream(tokenizer, prompt) if args.stream else None
    out = generate(model, ids, **options, eos_token_id=eos, prefix_lm=args.prefix_lm,
                   decoder_start_token_id=start, generator=torch.Generator().manual_seed(args.seed),
                   streamer=stream)
    if stream is not None:
        stream.close()
    else:
        print(prompt + tokenizer.decode(out[0, 1 if seq2seq else ids.shape[1]:].tolist()))


def check_generator(name, model) -> None:
    """Refuse a model that cannot generate (an encoder, a model without an LM head), in CLI terms."""
    from lmforge.cli.common import UsageError

    if model.config.architecture == "encoder":
        raise UsageError(f"{name} is an encoder: generate needs a decoder or an encoder-decoder "
                         "(an encoder with an MLM head fills masks: lmforge fill-mask)")
    if not any(head.spec["kind"] == "lm" for head in model.heads.values()):
        raise UsageError(f"--model {name}: the model has no language-modelling head ('lm'): generate "
                         "needs a model pretrained as a language model (lmforge pretrain, or a Hugging Face "
                         "*LMHeadModel / *ForCausalLM / *ForConditionalGeneration directory), not a "
                         "fine-tuned classifier")


def decoder_start(name, model, tokenizer) -> int:
    """An encoder-decoder's first decoder token: its config's, else the pad token, as Hugging Face's T5
    configs set it and lmforge's text-to-text fine-tuning uses it (said on standard error)."""
    from lmforge.cli.common import UsageError

    cfg = model.config
    if cfg.decoder_start_token_id is not None:
        return cfg.decoder_start_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else tokenizer.pad_id
    if pad is None:
        raise UsageError(f"--model {name}: its config.json names no decoder_start_token_id and the model "
                         "has no pad token to start from: add decoder_start_token_id to its config.json")
    print(f"the decoder starts from the pad token (id {pad}), as T5 does: the config names no "
          "decoder_start_token_id", file=sys.stderr)
    return pad


def check_numbers(args) -> None:
    """Refuse NaN and infinite decoding numbers, a negative --temperature (0 means greedy, so a
    negative value would silently decode greedily) and counts out of range, naming the flag."""
    from lmforge.cli.common import UsageError

    for flag in ("temperature", "top_p", "length_penalty"):
        value = getattr(args, flag)
        if value is not None and not math.isfinite(value):
            raise UsageError(f"--{flag.replace('_', '-')} {value}: must be a finite number")
    if args.temperature is not None and args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature}: must be >= 0 (0: greedy; > 0: sampling)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p}: must be in (0, 1]")
    for flag, low in (("max_new_tokens", 1), ("num_beams", 1), ("top_k", 0), ("no_repeat_ngram", 0),
                      ("min_new_tokens", 0)):
        value = getattr(args, flag)
        if value is not None and value < low:
            raise UsageError(f"--{flag.replace('_', '-')} {value}: must be at least {low}")


def check_options(args, options: dict, context: int, start: int) -> None:
    """Refuse settings (typed, or the checkpoint's) that contradict each other or the model's context."""
    from lmforge.cli.common import UsageError

    most, least = options["max_new_tokens"], options["min_new_tokens"]
    if least > most:
        raise UsageError(f"{_named(args, 'min_new_tokens', least)} is more than "
                         f"{_named(args, 'max_new_tokens', most)}: no text could end before the budget")
    if options["num_beams"] > 1 and options["do_sample"]:
        raise UsageError(f"{_named(args, 'num_beams', options['num_beams'])} with sampling "
                         f"(temperature {options['temperature']}): beam search does not sample; give "
                         "--num-beams 1 or --temperature 0")
    if args.length_penalty is not None and options["num_beams"] == 1:
        raise UsageError(f"--length-penalty {args.length_penalty} ranks finished beams: it needs "
                         "--num-beams > 1")
    if args.stream and options["num_beams"] > 1:
        raise UsageError("--stream needs --num-beams 1: beam search knows its best text only at the end")
    if start > context:
        raise UsageError(f"the prompt is {start} tokens long, more than the model's context "
                         f"(max_seq_len={context})")
    if start + most - 1 > context:  # the last new token is never fed back
        raise UsageError(f"{_named(args, 'max_new_tokens', most)}: {start} starting tokens plus {most} new "
                         f"ones exceed the model's context (max_seq_len={context}); give a smaller "
                         "--max-new-tokens")


def _named(args, flag: str, value) -> str:
    """'--flag value' as typed, or saying where an untyped value came from."""
    typed = getattr(args, flag) is not None
    return f"--{flag.replace('_', '-')} {value}" + ("" if typed else " (the checkpoint's or the default)")


# CLI flag -> (generate argument, its value when neither the flag nor the checkpoint gives one)
FLAGS = {"max_new_tokens": ("max_new_tokens", 40), "top_k": ("top_k", 0), "top_p": ("top_p", 1.0),
         "num_beams": ("num_beams", 1), "length_penalty": ("length_penalty", 1.0),
         "no_repeat_ngram": ("no_repeat_ngram_size", 0), "min_new_tokens": ("min_new_tokens", 0)}


def decoding_options(args, model_dir, start: int) -> tuple:
    """(generate() settings, those taken from the checkpoint): each flag given, else the checkpoint's
    recommendation (convert.hf.generation_defaults), else the CLI default. `start`: tokens before the new
    ones (the prompt for a decoder, the start token for an encoder-decoder), to turn lengths into new
    tokens."""
    from lmforge.convert.hf import generation_defaults

    recommended = generation_defaults(model_dir)
    if "max_new_tokens" not in recommended and "max_length" in recommended:
        recommended["max_new_tokens"] = max(1, recommended["max_length"] - start)
    if "min_new_tokens" not in recommended and recommended.get("min_length"):
        recommended["min_new_tokens"] = max(0, recommended["min_length"] - start)
    options, taken = {}, {}
    for flag, (name, default) in FLAGS.items():
        given = getattr(args, flag)
        options[name] = given if given is not None else recommended.get(name, default)
        if given is None and name in recommended:
            taken[name] = recommended[name]
    sampling = args.temperature > 0 if args.temperature is not None else bool(recommended.get("do_sample"))
    temperature = args.temperature or recommended.get("temperature", 1.0)
    if args.temperature is None and recommended.get("do_sample"):
        taken.update(do_sample=True, temperature=temperature)
    if options["num_beams"] > 1 and "early_stopping" in recommended:
        options["early_stopping"] = recommended["early_stopping"]
    return {**options, "do_sample": sampling, "temperature": temperature}, taken


def cmd_fill_mask(args) -> None:
    """Print the top-k fillings of the mask with their probabilities (one per line, or JSON lines)."""
    from lmforge.apps.fill_mask import fill_mask

    check_fill_options(args)  # before the model is loaded
    _, model, tokenizer = load_named(args.model)
    check_filler(args.model, model)
    for c in fill_mask(model, tokenizer, args.text, top_k=args.top_k, max_span=args.max_span):
        if args.json:
            row = {"token": c.token, "score": c.score, "sequence": c.sequence, "token_id": c.token_id}
            print(json.dumps(row, ensure_ascii=False))
        else:
            print(f"{c.score:.4f}  {c.token!r:20s}  {c.sequence}")


def check_fill_options(args) -> None:
    """Refuse --top-k and --max-span below 1, naming the flag."""
    from lmforge.cli.common import UsageError

    for flag in ("top_k", "max_span"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")


def check_filler(name, model) -> None:
    """Refuse a model that cannot fill a mask (a decoder, a model without an LM head), in CLI terms."""
    from lmforge.cli.common import UsageError

    arch = model.config.architecture
    if arch == "decoder":
        raise UsageError(f"--model {name} is a decoder: fill-mask needs an encoder with a masked-LM head or "
                         "an encoder-decoder (T5, BART); a decoder continues text (lmforge generate)")
    if not any(head.spec["kind"] == "lm" for head in model.heads.values()):
        needs = ("a model pretrained with MLM (lmforge pretrain --objective mlm, or a Hugging Face "
                 "*ForMaskedLM directory)" if arch == "encoder" else "a model pretrained to fill spans "
                 "(T5 span corruption, BART denoising; a Hugging Face *ForConditionalGeneration directory)")
        kind = "masked-LM" if arch == "encoder" else "language-modelling"
        raise UsageError(f"--model {name}: the model has no {kind} head ('lm'): fill-mask needs {needs}")


MODEL_HELP = "a trained model directory with its tokenizer (lmforge or Hugging Face) or an installed model"


def add_parsers(sub) -> None:
    """Register `generate` and `fill-mask` on the `lmforge` sub-command parser."""
    p = sub.add_parser("generate", help="continue a prompt (model directory with a tokenizer)")
    p.add_argument("prompt")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    # settings left out come from the checkpoint's generation_config.json, else these defaults
    p.add_argument("--max-new-tokens", type=int, help="default: the checkpoint's, else 40")
    p.add_argument("--temperature", type=float, help="0: greedy; > 0: sampling (default: the checkpoint's, else 0)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--num-beams", type=int, help="beam search with this many beams (default: the checkpoint's, else 1)")
    p.add_argument("--length-penalty", type=float,
                   help="beam score = log-probability / length ** this (> 0 favours longer texts)")
    p.add_argument("--no-repeat-ngram", type=int, help="never repeat an n-gram of this size")
    p.add_argument("--min-new-tokens", type=int, help="no end of text before this many tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument("--prefix-lm", action="store_true",
                   help="read the prompt bidirectionally (a decoder pretrained with --objective prefix-lm)")
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("fill-mask", help="top-k fillings of [MASK] / <mask> with probabilities")
    p.add_argument("text", help='e.g. "Paris is the [MASK] of France."')
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--max-span", type=int, default=10, help="T5/BART: most tokens generated for the mask")
    p.add_argument("--json", action="store_true", help="one JSON object per candidate")
    p.set_defaults(func=cmd_fill_mask)
