"""GenerationOptions: every setting of a generation request, its type, bounds (both ways), default and help.

One object for the three faces: `lmforge.generate(model, ids, **fields)` builds it from its keyword
arguments, `lmforge generate` makes its flags from its fields, and the server's /generate request
schema is made from them too, so the three accept and refuse the same requests. Field names are the
reference library's GenerationConfig names, so a checkpoint's generation_config.json is read and
written as it is (`load` / `save`). Settings that depend on the model (the vocabulary, the context)
are checked against it by `checks.check_for_model(options, model, start)`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from lmforge.config.model import MAX_LEN, MAX_VOCAB
from lmforge.config.options import (OptionsError, base_type, check_options, check_value, coerce, from_dict,
                                    option, with_changes)
from lmforge.io.files import CheckpointError
from lmforge.utils import jsontext
from lmforge.utils.atomic import atomic_write_text
from lmforge.utils.jsonfile import json_object
from lmforge.utils.errors import shown

MAX_NEW_TOKENS = 4096  # new tokens one request may ask for (a server's Limits may ask fewer)
MAX_BEAMS = 64  # running hypotheses per input: memory grows with num_beams x length x vocabulary
# sequences one call runs at once (prompts x beams or returned sequences): each step's logits hold a row
# of vocab_size floats for each (65,536 x GPT-2's 50,257: 13 GB); 200,000 prompts x 64 beams asked
# torch for 100 GB and failed as a RuntimeError naming nothing
MAX_SEQUENCES = 1 << 16
EARLY_STOPPING = (True, False, "never")
FILE = "generation_config.json"
REFERENCE_TOP_K = 50  # the reference's GenerationConfig.top_k when a file names none
TOKEN_ID = dict(low=0, high=MAX_VOCAB - 1)
# a forced id's "none", overriding the checkpoint's: Hugging Face's word for it, None, is lmforge's "not
# given" (the checkpoint's); a list's "none" is [] in both
OFF = -1
FORCED_ID = dict(low=OFF, high=MAX_VOCAB - 1)


class GenerationWarning(UserWarning):
    """A generation setting taken by a convention the model's config does not state, or a recommendation not
    applied (shown, not refused)."""


@dataclass
class GenerationOptions:
    """How new tokens are chosen: greedy, sampling or beam search, with the logit processors and stop ids."""

    max_new_tokens: int = option(20, "new tokens generated at most (the prompt and these must fit the "
                                 "model's context, else refused)",
                                 low=1, high=MAX_NEW_TOKENS)
    min_new_tokens: Optional[int] = option(None, "no stop token before this many new tokens (<= "
                                           "max_new_tokens); given (0 too), it replaces a min_length",
                                           unset="none",
                                           low=0, high=MAX_NEW_TOKENS)
    min_length: int = option(0, "no stop token before the whole sequence (prompt included) is this long "
                             "(<= the prompt + max_new_tokens)",
                             low=0, high=MAX_LEN)
    do_sample: bool = option(False, "sample the next token (false: greedy, or beam search); the command line "
                             "and the server sample when temperature > 0")
    temperature: float = option(1.0, "divide the scores by this before sampling (> 0 when sampling; "
                                "0 means greedy)", low=0.0, high=100.0)
    top_k: int = option(0, "sample among the k most probable tokens (at most the vocabulary); 0: all",
                        low=0, high=MAX_VOCAB)
    top_p: float = option(1.0, "nucleus: sample among the most probable tokens whose mass reaches this",
                          low=0.0, high=1.0, open_low=True)
    num_beams: int = option(1, "beam search with this many hypotheses per input; 1: none",
                            low=1, high=MAX_BEAMS)
    num_return_sequences: int = option(1, "sequences returned per input (beams: the best first, "
                                       "<= num_beams; greedy: 1)", low=1, high=MAX_BEAMS)
    length_penalty: float = option(1.0, "beam score = log-probability / length ** this (> 0 favours "
                                   "longer texts)", low=-100.0, high=100.0)
    early_stopping: Union[bool, str] = option(False, "beam search ends an input: true, once num_beams "
                                              "hypotheses are finished; false, once none can do better "
                                              'at this length; "never", once none can at any length')
    repetition_penalty: float = option(1.0, "divide the scores of tokens already present by this "
                                       "(CTRL); 1: off", low=0.0, high=100.0, open_low=True)
    no_repeat_ngram_size: int = option(0, "never repeat an n-gram of this size; 0: off", low=0, high=64)
    eos_token_id: Optional[Union[int, list]] = option(None, "stop token id(s); default: the model config's")
    pad_token_id: Optional[int] = option(None, "filler after a row's stop; default: the config's, else eos",
                                         **TOKEN_ID)
    decoder_start_token_id: Optional[int] = option(None, "an encoder-decoder's first decoder token; default: "
                                                   "the config's", **TOKEN_ID)
    forced_bos_token_id: Optional[int] = option(None, "the token forced first; -1: none, overriding the "
                                                "checkpoint's", unset="the config's", **FORCED_ID)
    forced_eos_token_id: Optional[int] = option(None, "the token forced at the last position; -1: none, "
                                                "overriding the checkpoint's", unset="the config's",
                                                **FORCED_ID)
    suppress_tokens: Optional[list] = option(None, "token ids never generated; []: none, overriding the "
                                             "checkpoint's", unset="none")

    def __post_init__(self) -> None:
        if not isinstance(self.early_stopping, (bool, str)) or self.early_stopping not in EARLY_STOPPING:
            # a server's client sends any text: its first 40 characters keep the refusal one short line
            raise OptionsError('early_stopping must be true, false or "never", got '
                               f"{shown(self.early_stopping)}", "early_stopping")
        check_options(self)
        for name, least, most in (("eos_token_id", 1, MAX_BEAMS), ("suppress_tokens", 0, MAX_VOCAB)):
            _check_ids(name, getattr(self, name), least, most)
        self._check_mix()

    def _check_mix(self) -> None:
        """Settings that contradict each other, each refusal naming the field to change."""
        if self.do_sample and self.temperature == 0:
            raise OptionsError("temperature must be > 0 when sampling, got 0 (do_sample=false is greedy)",
                               "temperature")
        if self.num_beams > 1 and self.do_sample:
            raise OptionsError(f"num_beams={self.num_beams} with sampling: beam search does not sample; give "
                               "num_beams=1, or do_sample=false (temperature 0)", "num_beams")
        if self.min_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise OptionsError(f"min_new_tokens={self.min_new_tokens} is more than max_new_tokens="
                               f"{self.max_new_tokens}: no text could end before the budget",
                               "min_new_tokens")
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise OptionsError(f"num_return_sequences={self.num_return_sequences} must be between 1 and "
                               f"num_beams={self.num_beams}", "num_return_sequences")
        if self.num_beams == 1 and not self.do_sample and self.num_return_sequences != 1:
            raise OptionsError("greedy decoding returns one sequence per input: num_return_sequences must "
                               f"be 1, got {self.num_return_sequences}", "num_return_sequences")

    def check_start(self, start: int) -> None:
        """Settings that contradict the `start` decoder positions before the new tokens (a decoder's prompt,
        an encoder-decoder's start token): a min_length, which counts them, beyond the budget's reach or
        beyond what min_new_tokens asks (the reference then applies min_new_tokens alone)."""
        if self.min_length > start + self.max_new_tokens:  # as min_new_tokens > max_new_tokens is
            raise OptionsError(f"min_length={self.min_length} is more than {start} starting tokens plus "
                               f"max_new_tokens={self.max_new_tokens}: no text could end before the budget",
                               "min_length")
        if self.min_new_tokens is not None and self.min_length > start + self.min_new_tokens:
            # the reference then reads min_new_tokens alone: honouring min_length too gave other tokens
            raise OptionsError(f"min_length={self.min_length} asks more than {start} starting tokens plus "
                               f"min_new_tokens={self.min_new_tokens}: give one of them (with both, Hugging "
                               "Face transformers applies min_new_tokens only)", "min_length")

    @classmethod
    def build(cls, options: Optional["GenerationOptions"] = None, fields: Optional[dict] = None):
        """`options` (or the defaults) with `fields` changed; an unknown name or a bad value names the field.
        One minimum among `fields` replaces the other one of `options` (a checkpoint's), as the command line's
        flag does: min_new_tokens=0 over a checkpoint's min_length means no minimum, as in the reference."""
        fields = dict(fields or {})
        if options is not None:
            fields.update({name: FIELDS[name].default for name in replaced_minimums(fields)})
        return with_changes(cls, options, fields, "generation")

    @classmethod
    def recommended(cls, path, start: Optional[int] = None) -> dict:
        """The fields a model directory recommends: its generation_config.json's (the names that coincide),
        else config.json's decoding keys (older checkpoints such as BART's keep them there); max_length /
        min_length become new-token counts when `start` (the positions before the new tokens) is given;
        without it a max_length is not applied, said in a GenerationWarning (min_length, a field, counts
        them itself), as are the reference library's settings lmforge does not apply (UNAPPLIED)."""
        return for_start(path, read_recommended(path), start)

    @classmethod
    def load(cls, path, start: Optional[int] = None) -> "GenerationOptions":
        """The options a model directory recommends (see `recommended`), the defaults for the rest."""
        found = cls.recommended(path, start)  # its refusals name the file already
        try:
            return from_dict(cls, found, FILE)
        except OptionsError as err:
            raise OptionsError(f"{Path(path) / FILE}: {err}", err.field) from None

    def save(self, path) -> Path:
        """Write the options into `path`/generation_config.json (atomically), keeping its other keys."""
        return write_settings(path, {k: v for k, v in dataclasses.asdict(self).items() if v is not None})


def replaced_minimums(given) -> set:
    """The minimum that one among the names `given` replaces: the reference applies one minimum, so a
    min_new_tokens given sets aside a min_length from beneath it (a checkpoint's), and the other way round."""
    pairs = (("min_new_tokens", "min_length"), ("min_length", "min_new_tokens"))
    return {other for name, other in pairs if name in given and other not in given}


def write_settings(path, fields: dict) -> Path:
    """`fields` into `path`/generation_config.json (atomically) over its other keys; a forced id's OFF
    written as the reference's spelling of none, null (it would read -1 as the vocabulary's last id)."""
    target = Path(path) / FILE
    ours = {k: None if k in FORCED and v == OFF else v for k, v in fields.items()}
    return atomic_write_text(target, json.dumps({**_read_json(target), **ours}, indent=2) + "\n")


def read_recommended(path) -> dict:
    """A model directory's recommended settings as written (see GenerationOptions.recommended), max_length
    and min_length still counting the positions before the new tokens; the settings lmforge does not apply
    are said in a GenerationWarning here, once per reading."""
    from lmforge.convert.hf import generation_defaults

    target = Path(path) / FILE
    written = _read_json(target, strict=True) if target.exists() else None  # a folder there: refused
    # a forced id's null is none, over the model config's (as write_settings spells OFF, and the reference
    # reads it); another null is no setting
    found = {k: OFF if v is None else v for k, v in written.items() if v is not None or k in FORCED} \
        if written else generation_defaults(path)
    if _is_int(found.get("min_new_tokens")):  # the reference then reads min_new_tokens alone
        found.pop("min_length", None)
    config = {} if "top_k" in found else _read_json(Path(path) / "config.json")
    if "top_k" not in found and (written is not None or "model_type" in config):
        # the reference samples (recommended or asked) among its default 50 most probable, at most the
        # vocabulary, which its files leave out; lmforge's own files write top_k, 0 included
        vocab = config.get("vocab_size")
        found["top_k"] = min(REFERENCE_TOP_K, vocab) if _is_int(vocab) and vocab > 0 else REFERENCE_TOP_K
    _unapplied_settings(path, found)
    return {k: v for k, v in found.items() if k in FIELD_NAMES or k == "max_length"}


def for_start(path, found: dict, start: Optional[int], given=()) -> dict:
    """The fields of `found` (read_recommended's) for `start` positions before the new tokens: a max_length
    and a min_length as new-token counts; without `start` a max_length is not applied (said). A max_length
    the `start` positions already reach is refused naming max_new_tokens, as the reference refuses it (one
    new token was generated unsaid), unless max_new_tokens is among the names `given` (a request's own)."""
    found = dict(found)
    max_length = found.pop("max_length", None)
    if "max_new_tokens" not in found and "max_new_tokens" not in given and _is_int(max_length):
        if start is None:
            _unapplied_max_length(path, max_length)
        elif start >= max_length:
            raise OptionsError(f"{Path(path) / FILE} recommends max_length={max_length}, which the {start} "
                               "tokens before the new ones already reach: give max_new_tokens",
                               "max_new_tokens")
        else:
            found["max_new_tokens"] = max_length - start
    if start is not None and "min_new_tokens" not in found and _is_int(found.get("min_length")):
        found["min_new_tokens"] = max(0, found["min_length"] - start)
    return found


def _read_json(path: Path, strict: bool = False) -> dict:
    """The JSON object in `path`; {} where there is none. One that cannot be read is {} too, or with
    `strict` a CheckpointError naming the file (a damaged one read as none gave other settings unsaid)."""
    if not strict:
        return json_object(path) or {}
    try:
        found = jsontext.loads(path.read_text(encoding="utf-8"))  # nesting too deep: a JSONDecodeError
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not readable as JSON ({err})") from None
    if not isinstance(found, dict):
        raise CheckpointError(f"{path}: not a JSON object {{...}} but {type(found).__name__}")
    return found


# the reference library's settings that change its tokens but that lmforge does not apply, each with the
# values that change nothing (a checkpoint may state them)
UNAPPLIED = {"typical_p": (1,), "epsilon_cutoff": (0,), "eta_cutoff": (0,), "min_p": (0,),
             "num_beam_groups": (1,), "diversity_penalty": (0,), "penalty_alpha": (0,),
             "bad_words_ids": ([],), "force_words_ids": ([],), "sequence_bias": ({}, []),
             "begin_suppress_tokens": ([],), "forced_decoder_ids": ([],), "encoder_repetition_penalty": (1,),
             "encoder_no_repeat_ngram_size": (0,), "constraints": ([],), "guidance_scale": (1,),
             "exponential_decay_length_penalty": ([],), "stop_strings": ([], ""), "dola_layers": ([],)}


def _unapplied_settings(path, found: dict) -> None:
    """Say which of a checkpoint's recommendations lmforge does not apply (they were dropped unsaid: a
    bad_words_ids token was generated, diverse beam search ran as plain beam search)."""
    said = {k: v for k, v in found.items() if k in UNAPPLIED and v not in UNAPPLIED[k]}
    if said:
        named = ", ".join(f"{k}={json.dumps(v)[:40]}" for k, v in said.items())
        warnings.warn(f"{Path(path) / FILE} recommends {named}, which lmforge does not apply: decoding goes "
                      "on without (Hugging Face transformers' text may differ)", GenerationWarning)


def _unapplied_max_length(path, max_length: int) -> None:
    """Say that a recommended max_length is not applied: it counts the positions before the new tokens,
    which only the caller knows (it was dropped unsaid: Python generated max_new_tokens' default where the
    command line, which knows its prompt, generated max_length minus the prompt)."""
    warnings.warn(f"{Path(path) / FILE} recommends max_length={max_length}, which counts the tokens before "
                  "the new ones: not applied without start= (the prompt's length for a decoder, 1 for an "
                  "encoder-decoder), so max_new_tokens stays "
                  f"{FIELDS['max_new_tokens'].default}", GenerationWarning)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(name: str, value, least: int, most: int) -> None:
    """An id or a list of `least` to `most` ids, each an integer in [0, MAX_VOCAB) (the model's vocabulary
    is checked by check_for_model)."""
    if value is None:
        return
    ids = [value] if _is_int(value) else value
    if not isinstance(ids, (list, tuple)) or not least <= len(ids) <= most \
            or not all(_is_int(i) and 0 <= i < MAX_VOCAB for i in ids):
        raise OptionsError(f"{name} must be a token id or a list of {least} to {most} token ids, got "
                           f"{str(value)[:60]}", name)


FIELDS = {f.name: f for f in dataclasses.fields(GenerationOptions)}
FIELD_NAMES = frozenset(FIELDS)
FORCED = ("forced_bos_token_id", "forced_eos_token_id")  # OFF: none, overriding the checkpoint's


def checked_type(name: str, value, from_text: bool = False):
    """`value` as field `name`'s type (a whole 3.0 as 3; from_text: a command line's string), refused unless
    it has that type and is finite. Bounds are left to the object, so that a server's stricter caps speak
    first."""
    field = FIELDS[name]
    if from_text and isinstance(value, str) and field_kind(name) == "list":
        value = _listed(name, value)
    value = coerce(GenerationOptions, name, value, from_text=from_text)
    if isinstance(value, float) and not math.isfinite(value):  # said here: check_value's wording wants bounds
        raise OptionsError(f"{name} must be a finite number, got {value}", name)
    if name == "early_stopping" and from_text and str(value).lower() in ("true", "false"):
        value = str(value).lower() == "true"
    check_value(name, field.type, {}, value)
    return value


def _listed(name: str, text: str):
    """A command line's list, as JSON ("[]", "[5, 7]"); "null"/"none" is left for coerce (not given)."""
    if text.strip().lower() in ("null", "none", "~"):
        return text
    try:
        return jsontext.loads(text)  # "[[[[..." thousands deep: a JSONDecodeError, not a RecursionError
    except json.JSONDecodeError:
        raise OptionsError(f"{name} must be a JSON list of token ids ([] for none), got {text[:60]!r}",
                           name) from None


def checked_value(name: str, value, from_text: bool = False):
    """`value` as field `name`'s type, within its declared bounds (the cross-field rules are the object's)."""
    value = checked_type(name, value, from_text)
    check_value(name, FIELDS[name].type, FIELDS[name].metadata, value)
    return value


def sampling_from_temperature(fields: dict) -> dict:
    """The command line's and the server's convention: where do_sample is not given, temperature > 0
    samples and temperature 0 is greedy."""
    temperature = fields.get("temperature")
    if "do_sample" in fields or not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        return dict(fields)
    return {**fields, "do_sample": bool(temperature > 0)}  # NaN: false, and the object refuses it


SAMPLING_ONLY = ("temperature", "top_k", "top_p")  # what only sampling reads
BEAMS_ONLY = ("length_penalty", "early_stopping")  # what only beam search reads


def refuse_unused(options: GenerationOptions, given, seed=None) -> None:
    """OptionsError naming a setting among `given` (the names a request set itself, not a checkpoint's
    recommendations, which may hold both) that its decoding would not read, set to other than its default
    (which changes nothing: OpenAI's clients send top_p=1 with every request): a sampling setting or a
    `seed` (not None) without sampling (temperature 0 aside: the command line's and the server's word for
    greedy), a beam setting without beams. Given, it would be ignored: a silently different result from
    the one asked for."""
    def changed(name: str) -> bool:
        return name in given and getattr(options, name) != FIELDS[name].default

    if not options.do_sample:
        for name in SAMPLING_ONLY:
            if changed(name) and not (name == "temperature" and options.temperature == 0):
                raise _unsampled(name, getattr(options, name), given)
    if options.num_beams == 1:
        for name in BEAMS_ONLY:
            if changed(name):
                raise OptionsError(f"{name}={getattr(options, name)!r} is read only by beam search "
                                   "(num_beams > 1)", name)
    if seed is not None and not options.do_sample:
        raise _unsampled("seed", seed, given)


def _unsampled(name: str, value, given) -> OptionsError:
    """The refusal of sampling setting `name` where nothing is sampled: where the request itself said
    do_sample=false, the two contradict (its sampling was not left to temperature), else it is unread."""
    if "do_sample" in given:
        return OptionsError(f"{name}={value!r} contradicts do_sample=false, also given: {name} is read only "
                            f"when sampling; give do_sample=true to sample, or leave {name} out", name)
    return OptionsError(f"{name}={value!r} is read only when sampling (do_sample=true; on the command line "
                        "and the server, temperature > 0 or the checkpoint's do_sample=true): leave it out "
                        "for greedy or beam search", name)


def field_kind(name: str) -> str:
    """'int', 'float', 'bool', ... of field `name` (its annotation without Optional)."""
    return base_type(FIELDS[name].type)[0]
