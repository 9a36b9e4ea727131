"""SamplingParams: how a generate call picks and stops its tokens, checked once when made.

  greedy = carpool.SamplingParams(max_tokens=32, temperature=0)
  client.generate("The carpool left at dawn", sampling=greedy)
  client.generate("Once", sampling=dataclasses.replace(greedy, seed=7, logprobs=2))

Fields left at None are not sent: the worker's default (the one named below) applies. The
ranges are the worker's (worker/sampler/sampling_params.h); the router still checks what only
it knows (stop_token_ids below the vocabulary size, max_tokens within the model's length).
stop, include_stop_str_in_output and skip_special_tokens act on the output text, which the
router makes with the model's tokenizer (as vLLM's fields of the same names).
"""

import dataclasses
import math
import numbers
import operator
from typing import Any, Optional, Sequence, Tuple

from . import errors

_INT32_MAX = (1 << 31) - 1
_UINT64_MAX = (1 << 64) - 1
MAX_LOGPROBS = 20


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping for one generate call. Immutable; dataclasses.replace() makes a
    changed (and again checked) copy.

    Raises TypeError for a value of the wrong type and InvalidArgument naming the field for one
    out of its range.
    """

    # New tokens to generate; [1, 2^31). Default: 16.
    max_tokens: Optional[int] = None
    # Softmax temperature; >= 0 and finite, 0 is greedy (argmax). Default: 1.
    temperature: Optional[float] = None
    # Keep only the k most likely tokens; >= -1, 0 or -1 disables. Default: 0.
    top_k: Optional[int] = None
    # Keep the smallest set of most likely tokens whose mass reaches top_p; (0, 1]. Default: 1.
    top_p: Optional[float] = None
    # Drop tokens below min_p times the top token's probability; [0, 1]. Default: 0.
    min_p: Optional[float] = None
    # > 1 discourages tokens already in the prompt or output; > 0 and finite. Default: 1.
    repetition_penalty: Optional[float] = None
    # Subtracted once from the logit of each token already in the output; [-2, 2]. Default: 0.
    presence_penalty: Optional[float] = None
    # Subtracted per occurrence in the output; [-2, 2]. Default: 0.
    frequency_penalty: Optional[float] = None
    # The randomness is a pure function of (seed, position); [0, 2^64). Default: one drawn by
    # the worker when the request is admitted.
    seed: Optional[int] = None
    # Stop (finish reason "stop") after emitting any of these; each >= 0 and below the
    # vocabulary size (the router checks that bound). Default: none.
    stop_token_ids: Sequence[int] = ()
    # Keep going past the model's end-of-sequence token(s). Default: False.
    ignore_eos: bool = False
    # Return each token's logprob plus this many top alternatives; [0, 20]. Default: 0.
    logprobs: int = 0
    # Stop strings: the output ends (finish reason "stop", result.stop_string the match) where
    # its text first contains one; a str is one stop string. Default: none.
    stop: Sequence[str] = ()
    # Keep the matched stop string at the end of the text. Default: False (removed).
    include_stop_str_in_output: bool = False
    # Leave special tokens (BOS, EOS, ...) out of the output text. Default: True.
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        for name, lo, hi in (("max_tokens", 1, _INT32_MAX), ("top_k", -1, _INT32_MAX),
                             ("seed", 0, _UINT64_MAX)):
            self._set(name, _optional_int(name, getattr(self, name), lo, hi))
        floats: Tuple[Tuple[str, Any, str], ...] = (
            ("temperature", lambda v: v >= 0 and math.isfinite(v), ">= 0 and finite"),
            ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
            ("min_p", lambda v: 0 <= v <= 1, "in [0, 1]"),
            ("repetition_penalty", lambda v: v > 0 and math.isfinite(v), "> 0 and finite"),
            ("presence_penalty", lambda v: -2 <= v <= 2, "in [-2, 2]"),
            ("frequency_penalty", lambda v: -2 <= v <= 2, "in [-2, 2]"),
        )
        for name, ok, what in floats:
            self._set(name, _optional_float(name, getattr(self, name), ok, what))
        try:
            stops = tuple(_int(v, "stop_token_ids") for v in self.stop_token_ids)
        except TypeError:
            raise TypeError("stop_token_ids must be a sequence of ints") from None
        for token in stops:
            if not 0 <= token <= _INT32_MAX:
                raise errors.InvalidArgument(
                    "stop_token_ids must be >= 0 (and below the vocabulary size), got %d" % token)
        self._set("stop_token_ids", stops)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError("ignore_eos must be a bool, not %r" % (self.ignore_eos,))
        self._set("logprobs", _optional_int("logprobs", _int(self.logprobs, "logprobs"), 0,
                                            MAX_LOGPROBS))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        try:
            stop = tuple(stop)
        except TypeError:
            raise TypeError("stop must be a str or a sequence of str") from None
        for s in stop:
            if not isinstance(s, str):
                raise TypeError("stop must be a str or a sequence of str, not a sequence of %r"
                                % type(s).__name__)
        self._set("stop", stop)
        for name in ("include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError("%s must be a bool, not %r" % (name, getattr(self, name)))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # the normalized value, in a frozen dataclass


# The fields that are sent only when set (None: the worker's default applies).
OPTIONAL_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.default is None)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not a bool" % name)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %r" % (name, type(value).__name__)) from None


def _optional_int(name: str, value: Any, lo: int, hi: int) -> Optional[int]:
    if value is None:
        return None
    v = _int(value, name)
    if not lo <= v <= hi:
        raise errors.InvalidArgument("%s must be in [%d, %d], got %d" % (name, lo, hi, v))
    return v


def _optional_float(name: str, value: Any, ok: Any, what: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, not %r" % (name, type(value).__name__))
    v = float(value)
    if not ok(v):  # each check is written so that NaN fails it
        raise errors.InvalidArgument("%s must be %s, got %r" % (name, what, v))
    return v
