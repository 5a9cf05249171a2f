"""`lmforge generate` and `lmforge fill-mask`: text from a model directory that holds a tokenizer."""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys

import torch

from lmforge.cli.common import SEED, bounded, said
from lmforge.generate.stops import MAX_STOP, MAX_STOP_CHARS, TextTail
from lmforge.generate.text import prompt_ids, tokenizer_ids


class TextStream:
    """Prints a generation's text as it grows: what its TextTail (`tail`, generate/stops.py) says is safe to
    show (decoded whole, as decoding piece by piece would lose WordPiece joins and split multi-byte
    characters; a possible stop string's beginning held back), after `prefix` (the prompt a decoder
    continues), which is printed with the first text: a refusal before that prints nothing. `context`: the
    prompt's ids, decoded with the new ones so that the join between them is the tokenizer's (a new
    WordPiece "##s" joins the prompt's last word; a new word after it gets its space)."""

    def __init__(self, tokenizer, prefix: str = "", context: list = (), stops: tuple = ()) -> None:
        self.tail, self.prefix = TextTail(tokenizer, stops, context), prefix

    def show(self, text: str, token_ids: list = ()) -> None:
        """Print `text`, the first after the prefix (generate_until_stop's `show`)."""
        if text:
            print(self.prefix + text, end="", flush=True)
            self.prefix = ""

    def close(self) -> None:
        """End the line (the prefix alone where no text was shown)."""
        print(self.prefix)
        self.prefix = ""


def _encoder_decoder(model) -> bool:
    return model.config.architecture == "encoder-decoder"


def load_named(name) -> tuple:
    """(directory, model, tokenizer) of --model: a model directory or an installed model, resolved as
    every command resolves it (io.find_model_dir; a preset name, without weights, is refused)."""
    from lmforge.fast.optimize import optimize
    from lmforge.fast.paths import FastPaths
    from lmforge.io import find_model_dir, load
    from lmforge.tokenizer import check_fits, load_tokenizer

    path = find_model_dir(name)
    # the generation and fill-mask jobs run the model optimized (the same tokens but at ties within float
    # rounding; fast/optimize.py), its weights read as frozen: they only run it
    model, tokenizer = optimize(load(path), paths=FastPaths.frozen()), load_tokenizer(path)
    check_fits(tokenizer, model)  # a tokenizer emitting ids the model lacks is refused, not used
    return path, model, tokenizer


def cmd_generate(args) -> None:
    """Continue a prompt (decoders) or answer it (encoder-decoders) with a model directory's LM head."""
    from lmforge.cli.common import UsageError
    from lmforge.generate.stops import generate_until_stop

    typed, stops = typed_options(args), checked_stops(args)  # before the model is loaded: costs nothing
    _, model, tokenizer = load_named(args.model)
    check_generator(args.model, model, args.prefix_lm)
    seq2seq = _encoder_decoder(model)
    if not tokenizer.encode(args.prompt, add_special_tokens=False).ids:
        raise UsageError(f"the prompt {args.prompt!r} holds no tokens: give some text")
    ids = torch.tensor([prompt_ids(tokenizer, args.prompt, seq2seq)])  # Llama's after its BOS
    start = 1 if seq2seq else ids.shape[1]  # decoder positions before the new tokens
    if ids.shape[1] > model.config.max_seq_len:
        raise UsageError(f"the prompt is {ids.shape[1]} tokens long, more than the model's context "
                         f"(max_seq_len={model.config.max_seq_len})")
    options, taken = decoding_options(args, typed, model, start, tokenizer_ids(model, tokenizer))
    if args.stream and options.num_beams > 1:
        raise UsageError(f"{_named(args, 'num_beams')}: --stream needs --num-beams 1: beam search knows its "
                         "best text only at the end")
    if taken:  # say where settings the user did not type come from (after every refusal)
        print("settings from the checkpoint: " + ", ".join(f"{k}={v}" for k, v in taken.items()),
              file=sys.stderr)
    prompt = "" if seq2seq else args.prompt  # printed with the first new text, after every refusal
    context = [] if seq2seq else ids[0].tolist()  # a decoder's new text is decoded after its prompt's ids
    stream = TextStream(tokenizer, prompt, context, stops)
    generate_until_stop(model, ids, stream.tail, options=options, prefix_lm=args.prefix_lm,
                        generator=torch.Generator().manual_seed(args.seed or 0),
                        show=stream.show if args.stream else None)
    if not args.stream:
        stream.show(stream.tail.text)
    stream.close()


def checked_stops(args) -> tuple:
    """--stop's strings, checked by the rule the server's `stop` follows (generate/stops.py: none empty, at
    most MAX_STOP, each at most MAX_STOP_CHARS characters), before the model is loaded; one line naming
    --stop."""
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError
    from lmforge.generate.stops import StopLimitError, check_stops

    try:
        return check_stops(args.stop or [])
    except StopLimitError as err:  # no string is to blame: the flag is
        raise UsageError(f"--stop: {err}") from None
    except OptionsError as err:  # field stop.i: the i-th --stop
        raise UsageError(f"--stop {shlex.quote(args.stop[int(err.field.split('.')[1])])}: {err}") from None


def check_generator(name, model, prefix_lm: bool = False) -> None:
    """Refuse a model that cannot generate (an encoder, a model without an LM head) or read the prompt as
    --prefix-lm asks (an encoder-decoder), in CLI terms, before the prompt is read."""
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError
    from lmforge.generate.checks import check_prefix_lm

    if model.config.architecture == "encoder":
        raise UsageError(f"{name} is an encoder: generate needs a decoder or an encoder-decoder "
                         "(an encoder with an MLM head fills masks: lmforge fill-mask)")
    if not any(head.spec["kind"] == "lm" for head in model.heads.values()):
        raise UsageError(f"--model {name}: the model has no language-modelling head ('lm'): generate "
                         "needs a model pretrained as a language model (lmforge pretrain, or a Hugging Face "
                         "*LMHeadModel / *ForCausalLM / *ForConditionalGeneration directory), not a "
                         "fine-tuned classifier")
    try:
        check_prefix_lm(model, prefix_lm)
    except OptionsError as err:  # as Python's and the server's refusal, naming the flag
        raise UsageError(f"--prefix-lm: {err}") from None


# GenerationOptions fields without a flag: ids are the model's and its tokenizer's; one text is printed. The
# forced and suppressed ids are flags: a checkpoint's can be switched off (-1, [])
NOT_FLAGS = ("eos_token_id", "pad_token_id", "decoder_start_token_id", "num_return_sequences")
ALIASES = {"no_repeat_ngram_size": ("--no-repeat-ngram",)}  # earlier spellings, still accepted


def flag_fields() -> list:
    """The GenerationOptions fields that are `lmforge generate` flags."""
    from lmforge.generate.options import GenerationOptions

    return [f for f in dataclasses.fields(GenerationOptions) if f.name not in NOT_FLAGS]


def typed_options(args) -> dict:
    """The generation flags given, each as its field's type and within its bounds, naming the flag."""
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError
    from lmforge.generate.options import checked_value

    typed = {}
    for f in flag_fields():
        text = getattr(args, f.name)
        if text is None:
            continue
        try:
            typed[f.name] = checked_value(f.name, text, from_text=True)
        except OptionsError as err:
            raise UsageError(f"--{_flag(f.name)} {text}: {err}") from None
    return typed


def decoding_options(args, typed: dict, model, start: int, ids: dict) -> tuple:
    """(GenerationOptions, the settings taken from the checkpoint): each flag given, else the checkpoint's
    recommendation (read with the model: generation.recommended), else the default; checked against each
    other and the model (vocabulary, context), as lmforge.generate and the server build theirs. `start`:
    decoder positions before the new tokens; `ids`: the stop id (the tokenizer's) and the decoder start id
    to use where neither the checkpoint nor the model's config names one."""
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError
    from lmforge.generate.checks import check_for_model
    from lmforge.generate.options import (SAMPLING_ONLY, refuse_unused, replaced_minimums,
                                          sampling_from_temperature)
    from lmforge.generate.recommended import recommendation, resolve

    try:
        found = recommendation(model)
        recommended = found.for_start(start, typed) if found is not None else {}
        given = sampling_from_temperature(typed)  # the flag decides sampling (0: greedy), not the checkpoint
        for name in replaced_minimums(typed):  # the checkpoint's other minimum gives way, as in the reference
            recommended.pop(name, None)
        # where settings the user did not type come from (the ids aside)
        taken = {k: v for k, v in recommended.items() if k not in given and k not in NOT_FLAGS}
        fallback = {k: v for k, v in ids.items() if v is not None and getattr(model.config, k) is None}
        options = resolve(model, start, given, defaults=fallback)
        if not options.do_sample:  # greedy reads none of the sampling settings recommended: not said
            taken = {k: v for k, v in taken.items() if k not in SAMPLING_ONLY}
        check_for_model(options, model, start)
        refuse_unused(options, typed, args.seed)  # the flags given: a checkpoint's may hold both
    except OptionsError as err:
        raise UsageError(f"{_named(args, err.field)}: {err}") from None
    return options, taken


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _named(args, field) -> str:
    """'--flag value' as typed, or saying where an untyped value came from."""
    if field is None or not hasattr(args, field):  # not a flag: an id the checkpoint or the model gave
        return f"{field} (the checkpoint's or the model's)" if field else "the generation settings"
    typed = getattr(args, field)
    return f"--{_flag(field)} {typed}" if typed is not None else \
        f"--{_flag(field)} (the checkpoint's or the default)"


def cmd_fill_mask(args) -> None:
    """Print the top-k fillings of the mask with their probabilities (one per line, or JSON lines)."""
    from lmforge.pipelines.fill_mask import fill_mask

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
    """Refuse --top-k and --max-span out of fill_mask's bounds, naming the flag, before a model loads."""
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError
    from lmforge.pipelines.fill_mask import check_fill

    try:
        args.top_k, args.max_span = check_fill(args.top_k, args.max_span, from_text=True)
    except OptionsError as err:
        raise UsageError(f"--{err.field.replace('_', '-')} {getattr(args, err.field)}: {err}") from None


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


def add_generation_flags(p) -> None:
    """One flag per GenerationOptions field (its help, bounds and default); a flag left out takes the
    checkpoint's generation_config.json value, else the default. Values are read as text and checked by
    the options object, so a refusal is one line naming the flag."""
    from lmforge.config.options import bounds_text
    from lmforge.generate.options import SAMPLING_ONLY

    for f in flag_fields():
        kind = f.type.replace("Optional[", "").rstrip("]")
        metavar = {"int": "N", "float": "X", "bool": "true|false", "list": "JSON-LIST"}.get(kind, "VALUE")
        default = json.dumps(f.default) if isinstance(f.default, bool) else f.default  # true, as typed
        if default is None:  # what leaving the flag out means: "the config's", "none"
            default = f.metadata.get("unset")
        # a sampling setting's default is read only when sampling: leaving --temperature out is greedy
        when = " when sampling" if f.name in SAMPLING_ONLY else ""
        said(p.add_argument(f"--{_flag(f.name)}", *ALIASES.get(f.name, ()), dest=f.name, metavar=metavar,
                            help=f.metadata["help"]),
             f"the checkpoint's, else {default}{when}", bounds_text(f.metadata).strip())


def add_parsers(sub) -> None:
    """Register `generate` and `fill-mask` on the `lmforge` sub-command parser."""
    from lmforge.config.options import bounds_text
    from lmforge.generate.call_options import CALL_FIELDS
    from lmforge.pipelines.fill_mask import FillOptions

    p = sub.add_parser("generate", help="continue a prompt (model directory with a tokenizer)")
    p.add_argument("prompt", help="the text a decoder continues (an encoder-decoder's input)")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    add_generation_flags(p)
    said(p.add_argument("--seed", type=bounded(int, *SEED), help="the sampling's seed (with temperature > 0 "
                        "or the checkpoint's sampling)"), 0)
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help=f"end the text before this string, and generation where it appears, as the "
                   f"server's stop (repeatable: at most {MAX_STOP}, each at most {MAX_STOP_CHARS} "
                   "characters; not empty)")
    # CallOptions' field, which Python's prefix_lm= and the server's prefix_lm are made from too
    p.add_argument("--prefix-lm", action="store_true", help=CALL_FIELDS["prefix_lm"].metadata["help"])
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("fill-mask", help="top-k fillings of [MASK] / <mask> with probabilities")
    p.add_argument("text", help='e.g. "Paris is the [MASK] of France."')
    p.add_argument("--model", required=True, help=MODEL_HELP)
    for name in ("top_k", "max_span"):  # read as text, as FillOptions reads it: 3.0 is 3 in every face
        declared = FillOptions.__dataclass_fields__[name]
        said(p.add_argument(f"--{name.replace('_', '-')}", default=declared.default, metavar="N",
                            help=declared.metadata["help"]), bounds=bounds_text(declared.metadata).strip())
    p.add_argument("--json", action="store_true", help="one JSON object per candidate")
    p.set_defaults(func=cmd_fill_mask)
