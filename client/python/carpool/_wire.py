"""The edge between the SDK and carpool.v1 protobuf messages: requests out, results in.

Shared by the sync and asyncio clients; no sockets here.
"""

import codecs
import contextlib
import itertools
import json
import operator
import os
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Union

from . import errors
from .sampling import OPTIONAL_FIELDS, SamplingParams
from .types import (Chunk, EmbedResult, GenerateResult, Stats, TenantStats, Timings, Token,
                    TokenizeResult, TokenLogprob, Usage, WorkerStats)

try:
    from . import carpool_pb2 as pb
except ImportError as e:  # pragma: no cover - a setup problem, not a code path
    raise ImportError(
        "carpool.carpool_pb2 is missing: it is generated from proto/carpool.proto at build time. "
        "Install the package (pip install ./client/python), or build the CMake target "
        "carpool_python and put build/client/python on PYTHONPATH") from e

PROTOCOL_VERSION = 1

Prompt = Union[str, bytes, bytearray, Sequence[int]]


class Chat(NamedTuple):
    """A conversation for the model's chat template, as the wire carries it (ChatInput): JSON
    texts made by chat_input()."""
    messages_json: str
    tools_json: str               # "" = no tools (the template's `tools` is None)
    add_generation_prompt: bool
    chat_template_kwargs_json: str  # "" = none


def _json(value: Any, what: str) -> str:
    """`value` as JSON text: keys in their order, non-ASCII kept (as transformers' tojson
    prints it); TypeError naming `what` for what JSON cannot hold (NaN and infinities too)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError("%s cannot be sent as JSON: %s" % (what, e)) from None


def chat_input(messages: Sequence[Mapping[str, Any]], tools: Optional[Sequence[Any]],
               add_generation_prompt: bool,
               chat_template_kwargs: Optional[Mapping[str, Any]]) -> Chat:
    """Checks the shapes (TypeError) and serializes a conversation: messages a list of dicts
    (OpenAI chat messages), tools a list (OpenAI tools) or None, chat_template_kwargs a dict of
    extra template variables or None. The router checks the rest (roles, contents) and renders
    it with the model's template."""
    if isinstance(messages, (str, bytes, bytearray, Mapping)) or not isinstance(messages,
                                                                                 Sequence):
        raise TypeError("messages must be a list of dicts (OpenAI chat messages), not %r" %
                        type(messages).__name__)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError("messages[%d] must be a dict, not %r" % (i, type(m).__name__))
    if tools is not None and (isinstance(tools, (str, bytes, bytearray, Mapping))
                              or not isinstance(tools, Sequence)):
        raise TypeError("tools must be a list (OpenAI tools) or None, not %r" %
                        type(tools).__name__)
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise TypeError("chat_template_kwargs must be a dict or None, not %r" %
                        type(chat_template_kwargs).__name__)
    if not isinstance(add_generation_prompt, bool):
        raise TypeError("add_generation_prompt must be a bool, not %r" %
                        type(add_generation_prompt).__name__)
    return Chat(_json([dict(m) for m in messages], "messages"),
                "" if tools is None else _json(list(tools), "tools"),
                add_generation_prompt,
                "" if chat_template_kwargs is None else _json(dict(chat_template_kwargs),
                                                              "chat_template_kwargs"))


def _set_chat(c: Any, chat: Chat) -> None:
    """Fills a ChatInput message."""
    c.messages_json = chat.messages_json
    c.tools_json = chat.tools_json
    c.add_generation_prompt = chat.add_generation_prompt
    c.chat_template_kwargs_json = chat.chat_template_kwargs_json

_PRIORITIES = {
    "default": pb.PRIORITY_DEFAULT,
    "interactive": pb.PRIORITY_INTERACTIVE,
    "batch": pb.PRIORITY_BATCH,
}

class RequestIds:
    """Unique request ids for one client: a random prefix and a counter."""

    def __init__(self) -> None:
        self._prefix = "py-" + os.urandom(6).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return "%s-%d" % (self._prefix, next(self._counter))


def _token_list(values: Any, what: str) -> List[int]:
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise TypeError("%s must be a sequence of ints" % what) from None


def generate_frame(request_id: str, prompt: Optional[Prompt],
                   token_ids: Optional[Sequence[int]], *, stream: bool, api_key: str,
                   priority: Union[str, int], deadline_ms: int, add_bos: bool,
                   sampling: SamplingParams, model: str = "",
                   chat: Optional[Chat] = None) -> bytes:
    """The encoded ClientMessage for a generate call (sampling's unset fields stay unset); with
    `chat` (and no prompt or token_ids), a chat call: the prompt is the conversation as the
    model's chat template renders it.

    Raises TypeError for arguments of the wrong type and InvalidArgument for values the wire
    cannot carry (out of the field's range, an unknown priority); the router checks the rest.
    """
    if not isinstance(sampling, SamplingParams):
        raise TypeError("sampling must be a carpool.SamplingParams, not %r" %
                        type(sampling).__name__)
    if prompt is not None and token_ids is not None:
        raise TypeError("pass either a prompt or token_ids, not both")
    if chat is not None and (prompt is not None or token_ids is not None):
        raise TypeError("a chat call takes messages, not a prompt or token_ids")
    if chat is None and prompt is None and token_ids is None:
        raise TypeError("generate() needs a prompt (str, bytes or a list of token ids) "
                        "or token_ids")
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    g = msg.generate
    with _out_of_range_is_invalid(request_id):
        g.request_id = request_id
        if chat is not None:
            _set_chat(g.chat, chat)
        elif prompt is not None:
            _set_prompt(g, prompt, "token_ids")
        else:
            _set_token_ids(g, token_ids, "token_ids")  # ids, even when given as str or bytes
        _set_priority(g, priority)
        g.deadline_ms = deadline_ms
        g.api_key = api_key
        g.stream = stream
        g.add_bos = add_bos
        g.model = _model(model)
        g.stop.extend(sampling.stop)
        g.include_stop_str_in_output = sampling.include_stop_str_in_output
        g.skip_special_tokens = sampling.skip_special_tokens
        s = g.sampling
        for name in OPTIONAL_FIELDS:
            value = getattr(sampling, name)
            if value is not None:
                setattr(s, name, value)
        s.stop_token_ids.extend(sampling.stop_token_ids)
        s.ignore_eos = sampling.ignore_eos
        s.logprobs = sampling.logprobs
    return msg.SerializeToString()


_POOLINGS = {"mean": pb.POOLING_MEAN, "last": pb.POOLING_LAST}

EmbedInputs = Union[str, bytes, bytearray, Sequence[Union[str, bytes, bytearray, Sequence[int]]]]


def embed_frame(request_id: str, inputs: EmbedInputs, *, normalize: bool, pooling: str,
                api_key: str, priority: Union[str, int], deadline_ms: int,
                add_bos: bool, model: str = "") -> bytes:
    """The encoded ClientMessage for an embed call.

    inputs: one text (str or bytes), or a list whose items are each a text (str, bytes) or a
    list of token ids. Raises TypeError for inputs of the wrong type and InvalidArgument for an
    unknown pooling or priority; the router checks the rest (empty inputs, vocabulary, length).
    """
    if isinstance(inputs, (str, bytes, bytearray)):
        inputs = [inputs]
    try:
        items = list(inputs)
    except TypeError:
        raise TypeError("embed() needs a text or a list of inputs (str, bytes or lists of "
                        "token ids), not %r" % type(inputs).__name__) from None
    if items and all(isinstance(x, int) for x in items):
        raise TypeError("embed() takes a list of inputs: wrap token ids as [[1, 2, 3]]")
    if pooling not in _POOLINGS:
        raise errors.InvalidArgument(
            "pooling must be one of %s, not %r" % (sorted(_POOLINGS), pooling))
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    e = msg.embed
    with _out_of_range_is_invalid(request_id):
        e.request_id = request_id
        for i, item in enumerate(items):
            _set_prompt(e.inputs.add(), item, "inputs[%d]" % i)
        e.normalize = bool(normalize)
        e.pooling = _POOLINGS[pooling]
        _set_priority(e, priority)
        e.deadline_ms = deadline_ms
        e.api_key = api_key
        e.add_bos = add_bos
        e.model = _model(model)
    return msg.SerializeToString()


def tokenize_frame(request_id: str, text: Optional[Union[str, bytes, bytearray]], *, model: str,
                   add_special_tokens: Optional[bool], api_key: str,
                   chat: Optional[Chat] = None) -> bytes:
    """The encoded ClientMessage for a tokenize call: of `text` (str, sent as UTF-8, or bytes),
    or of `chat` as the model's chat template renders it. add_special_tokens None: True for a
    text; for a chat the field stays unset, which the router reads as False (the template
    writes the special tokens it wants, as transformers' apply_chat_template)."""
    if chat is not None:
        if text is not None:
            raise TypeError("tokenize() takes a text or messages, not both")
    elif not isinstance(text, (str, bytes, bytearray)):
        raise TypeError("tokenize() needs a text (str or bytes) or messages, not %r" %
                        type(text).__name__)
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    t = msg.tokenize
    with _out_of_range_is_invalid(request_id):
        t.request_id = request_id
        t.model = _model(model)
        if chat is not None:
            _set_chat(t.chat, chat)
        else:
            t.text = text.encode("utf-8") if isinstance(text, str) else bytes(text)
            if add_special_tokens is None:
                add_special_tokens = True
        if add_special_tokens is not None:
            t.add_special_tokens = bool(add_special_tokens)
        t.api_key = api_key
    return msg.SerializeToString()


def detokenize_frame(request_id: str, token_ids: Sequence[int], *, model: str,
                     skip_special_tokens: bool, api_key: str) -> bytes:
    """The encoded ClientMessage for a detokenize call."""
    if isinstance(token_ids, (str, bytes, bytearray)):
        raise TypeError("detokenize() needs a list of token ids, not %r" %
                        type(token_ids).__name__)
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    d = msg.detokenize
    with _out_of_range_is_invalid(request_id):
        d.request_id = request_id
        d.model = _model(model)
        d.token_ids.extend(_token_list(token_ids, "token_ids"))
        d.skip_special_tokens = bool(skip_special_tokens)
        d.api_key = api_key
    return msg.SerializeToString()


def _model(model: str) -> str:
    if not isinstance(model, str):
        raise TypeError("model must be a str, not %r" % type(model).__name__)
    return model


def _set_prompt(message: Any, prompt: Prompt, what: str) -> None:
    """Sets `message`'s text (str: as UTF-8; bytes) or token_ids (any other sequence, named
    `what` in the TypeError when its items are not ints)."""
    if isinstance(prompt, str):
        message.text = prompt.encode("utf-8")
    elif isinstance(prompt, (bytes, bytearray)):
        message.text = bytes(prompt)
    else:
        _set_token_ids(message, prompt, what)


def _set_token_ids(message: Any, ids: Sequence[int], what: str) -> None:
    message.token_ids.ids.extend(_token_list(ids, what))
    # An empty list still selects the token_ids prompt (the router refuses it).
    message.token_ids.SetInParent()


def _set_priority(message: Any, priority: Union[str, int]) -> None:
    if isinstance(priority, str):
        if priority not in _PRIORITIES:
            raise errors.InvalidArgument(
                "priority must be one of %s, not %r" % (sorted(_PRIORITIES), priority))
        message.priority = _PRIORITIES[priority]
    else:
        message.priority = priority


@contextlib.contextmanager
def _out_of_range_is_invalid(request_id: str) -> Iterator[None]:
    """Turns protobuf's ValueError for a value out of a field's range into InvalidArgument
    (a CarpoolError, itself a ValueError, passes unchanged)."""
    try:
        yield
    except ValueError as e:
        if isinstance(e, errors.CarpoolError):
            raise
        raise errors.InvalidArgument(str(e), request_id=request_id) from None


def embed_result_from(r: Any) -> EmbedResult:
    return EmbedResult(r.request_id, [list(e.values) for e in r.embeddings],
                       Usage(prompt_tokens=r.usage.prompt_tokens),
                       Timings(r.timings.queue_ms, r.timings.ttft_ms, r.timings.total_ms))


def tokenize_result_from(r: Any) -> TokenizeResult:
    return TokenizeResult(r.request_id, list(r.token_ids), r.max_model_len)


def seeded_frame(frame: bytes, seed: int) -> bytes:
    """A generate frame with `seed` when it names none (any other frame as is): with two
    routers the client draws the seed, so a stream resumed on the other router is the one the
    lost router was producing."""
    msg = pb.ClientMessage()
    msg.ParseFromString(frame)
    if msg.WhichOneof("body") != "generate" or msg.generate.sampling.HasField("seed"):
        return frame
    msg.generate.sampling.seed = seed
    return msg.SerializeToString()


def resume_frame(frame: bytes, tokens: Sequence[int]) -> Optional[bytes]:
    """The generate frame `frame` resumed after the output `tokens` its client received
    (GenerateRequest.resume_tokens); None when they are all it asked for (only its final was
    lost: nothing is left to resume)."""
    msg = pb.ClientMessage()
    msg.ParseFromString(frame)
    g = msg.generate
    if g.sampling.HasField("max_tokens") and len(tokens) >= g.sampling.max_tokens:
        return None
    del g.resume_tokens[:]
    g.resume_tokens.extend(tokens)
    return msg.SerializeToString()


def cancel_frame(request_id: str) -> bytes:
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    msg.cancel.request_id = request_id
    return msg.SerializeToString()


def stats_frame(api_key: str = "") -> bytes:
    """A stats query; a router with tenants answers it only to a key."""
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    msg.stats.SetInParent()
    msg.stats.api_key = api_key
    return msg.SerializeToString()


def parse_server(frame: bytes) -> "pb.ServerMessage":
    """Decodes one frame from the router; ValueError when it is not a v1 ServerMessage."""
    msg = pb.ServerMessage()
    try:
        msg.ParseFromString(frame)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise ValueError("undecodable frame of %d bytes: %s" % (len(frame), e)) from None
    if msg.protocol_version != PROTOCOL_VERSION:
        raise ValueError("protocol version %d, expected %d" %
                         (msg.protocol_version, PROTOCOL_VERSION))
    if msg.WhichOneof("body") is None:
        raise ValueError("a ServerMessage with no body")
    return msg


def request_id_of(msg: "pb.ServerMessage") -> str:
    return getattr(msg, msg.WhichOneof("body")).request_id


def _tokens(tokens) -> List[Token]:
    return [Token(t.id, t.logprob, [TokenLogprob(x.token, x.logprob) for x in t.top_logprobs])
            for t in tokens]


def _fields(cls: Any, message: Any) -> Dict[str, Any]:
    """The dataclass fields of `cls` that `message` has, by name (so a newer or older proto
    leaves the others at their defaults)."""
    names = set(message.DESCRIPTOR.fields_by_name)
    return {f: getattr(message, f) for f in cls.__dataclass_fields__ if f in names}


def stats_from(s: Any) -> Stats:
    maps = ("rejections_by_reason", "batches_by_status")
    scalars = {k: v for k, v in _fields(Stats, s).items()
               if k not in ("workers", "tenants") + maps}
    return Stats(workers=[WorkerStats(**_fields(WorkerStats, w)) for w in s.workers],
                 tenants=[TenantStats(**_fields(TenantStats, t))
                          for t in getattr(s, "tenants", ())],
                 **{name: dict(getattr(s, name, {})) for name in maps}, **scalars)


class Accumulator:
    """Builds one request's GenerateResult from its chunks and final message."""

    def __init__(self, request_id: str) -> None:
        self.result = GenerateResult(request_id)
        self._text = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def chunk(self, c) -> Chunk:
        tokens = _tokens(c.tokens)
        self.result.tokens.extend(tokens)
        self._text += c.text
        return Chunk(self.result.request_id, c.index, tokens, self._decoder.decode(c.text),
                     bytes(c.text))

    def final(self, f) -> GenerateResult:
        r = self.result
        if len(f.tokens):  # non-streaming: the final holds everything
            r.tokens = _tokens(f.tokens)
            self._text = bytearray(f.text)
        elif f.text:
            self._text = bytearray(f.text)
        r.text_bytes = bytes(self._text)
        r.text = r.text_bytes.decode("utf-8", "replace")
        r.finish_reason = f.finish_reason
        r.stop_string = getattr(f, "stop_string", "")
        r.usage = Usage(f.usage.prompt_tokens, f.usage.completion_tokens,
                        f.usage.cached_prompt_tokens)
        r.timings = Timings(f.timings.queue_ms, f.timings.ttft_ms, f.timings.total_ms)
        return r

    def partial(self) -> GenerateResult:
        """The result so far (tokens and text of the chunks read)."""
        self.result.text_bytes = bytes(self._text)
        self.result.text = self.result.text_bytes.decode("utf-8", "replace")
        return self.result


def timeout_error(request_id: str, what: str, timeout: float, note: str = "") -> errors.Timeout:
    return errors.Timeout("no %s from the router within %.3g s%s" % (what, timeout, note),
                          request_id=request_id)


def check_timeout(timeout: Any) -> float:
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError("timeout must be a number of seconds, not %r" % (timeout,)) from None
    if not t > 0:
        raise ValueError("timeout must be > 0 seconds, not %r" % (timeout,))
    return t
