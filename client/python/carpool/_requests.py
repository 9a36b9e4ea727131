"""What Client and AsyncClient share around a call: building its request (request id, the
client's api_key and timeout where the call names none, the encoded frame) and reading the
router's answers into results and typed errors. No sockets here; encoding and decoding
stay in _wire.
"""

from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _wire
from . import errors
from .sampling import SamplingParams
from .types import Chunk, EmbedResult, GenerateResult, TokenizeResult


_DEFAULT_SAMPLING = SamplingParams()  # every field unset: the worker's defaults


class Request(NamedTuple):
    """One call, encoded and ready to send."""
    request_id: str
    frame: bytes
    timeout: float  # seconds for the whole call


def generate_request(ids: _wire.RequestIds, client_api_key: str, client_timeout: float,
                     prompt: Optional[_wire.Prompt] = None, *,
                     token_ids: Optional[Sequence[int]] = None,
                     sampling: Optional[SamplingParams] = None,
                     priority: Union[str, int] = "default", deadline_ms: int = 0,
                     add_bos: bool = True, request_id: Optional[str] = None,
                     api_key: Optional[str] = None, timeout: Optional[float] = None,
                     stream: bool = False, model: str = "") -> Request:
    """The Request of Client.generate / AsyncClient.generate (arguments and defaults as
    there; the client passes its RequestIds, api_key and timeout). Raises as
    _wire.generate_frame, or ValueError/TypeError for a bad timeout."""
    rid, call_timeout = _id_and_timeout(ids, request_id, client_timeout, timeout)
    frame = _wire.generate_frame(
        rid, prompt, token_ids, stream=stream,
        api_key=client_api_key if api_key is None else api_key, priority=priority,
        deadline_ms=deadline_ms, add_bos=add_bos,
        sampling=_DEFAULT_SAMPLING if sampling is None else sampling, model=model)
    return Request(rid, frame, call_timeout)


def chat_request(ids: _wire.RequestIds, client_api_key: str, client_timeout: float,
                 messages: Sequence[Mapping[str, Any]], *,
                 tools: Optional[Sequence[Any]] = None, add_generation_prompt: bool = True,
                 chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                 sampling: Optional[SamplingParams] = None,
                 priority: Union[str, int] = "default", deadline_ms: int = 0,
                 request_id: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: Optional[float] = None, stream: bool = False,
                 model: str = "") -> Request:
    """The Request of Client.chat / AsyncClient.chat (arguments and defaults as there). Raises
    as _wire.chat_input and _wire.generate_frame, or ValueError/TypeError for a bad timeout."""
    rid, call_timeout = _id_and_timeout(ids, request_id, client_timeout, timeout)
    chat = _wire.chat_input(messages, tools, add_generation_prompt, chat_template_kwargs)
    frame = _wire.generate_frame(
        rid, None, None, stream=stream,
        api_key=client_api_key if api_key is None else api_key, priority=priority,
        deadline_ms=deadline_ms, add_bos=False,
        sampling=_DEFAULT_SAMPLING if sampling is None else sampling, model=model, chat=chat)
    return Request(rid, frame, call_timeout)


def embed_request(ids: _wire.RequestIds, client_api_key: str, client_timeout: float,
                  inputs: _wire.EmbedInputs, *, normalize: bool = True, pooling: str = "mean",
                  priority: Union[str, int] = "default", deadline_ms: int = 0,
                  add_bos: bool = True, request_id: Optional[str] = None,
                  api_key: Optional[str] = None, timeout: Optional[float] = None,
                  model: str = "") -> Request:
    """The Request of Client.embed / AsyncClient.embed (arguments as there). Raises as
    _wire.embed_frame, or ValueError/TypeError for a bad timeout."""
    rid, call_timeout = _id_and_timeout(ids, request_id, client_timeout, timeout)
    frame = _wire.embed_frame(
        rid, inputs, normalize=normalize, pooling=pooling,
        api_key=client_api_key if api_key is None else api_key, priority=priority,
        deadline_ms=deadline_ms, add_bos=add_bos, model=model)
    return Request(rid, frame, call_timeout)


def tokenize_request(ids: _wire.RequestIds, client_api_key: str, client_timeout: float,
                     text: Optional[Union[str, bytes]] = None, *, model: str = "",
                     add_special_tokens: Optional[bool] = None,
                     request_id: Optional[str] = None, api_key: Optional[str] = None,
                     timeout: Optional[float] = None,
                     messages: Optional[Sequence[Mapping[str, Any]]] = None,
                     tools: Optional[Sequence[Any]] = None, add_generation_prompt: bool = True,
                     chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> Request:
    """The Request of Client.tokenize / AsyncClient.tokenize (arguments as there): of `text`,
    or, with `messages`, of the conversation as the model's chat template renders it."""
    rid, call_timeout = _id_and_timeout(ids, request_id, client_timeout, timeout)
    chat = None
    if messages is not None:
        chat = _wire.chat_input(messages, tools, add_generation_prompt, chat_template_kwargs)
    elif tools is not None or chat_template_kwargs is not None:
        raise TypeError("tools and chat_template_kwargs go with messages")
    frame = _wire.tokenize_frame(rid, text, model=model, add_special_tokens=add_special_tokens,
                                 api_key=client_api_key if api_key is None else api_key,
                                 chat=chat)
    return Request(rid, frame, call_timeout)


def detokenize_request(ids: _wire.RequestIds, client_api_key: str, client_timeout: float,
                       token_ids: Sequence[int], *, model: str = "",
                       skip_special_tokens: bool = False, request_id: Optional[str] = None,
                       api_key: Optional[str] = None,
                       timeout: Optional[float] = None) -> Request:
    """The Request of Client.detokenize / AsyncClient.detokenize (arguments as there)."""
    rid, call_timeout = _id_and_timeout(ids, request_id, client_timeout, timeout)
    frame = _wire.detokenize_frame(rid, token_ids, model=model,
                                   skip_special_tokens=skip_special_tokens,
                                   api_key=client_api_key if api_key is None else api_key)
    return Request(rid, frame, call_timeout)


def _id_and_timeout(ids: _wire.RequestIds, request_id: Optional[str], client_timeout: float,
                    timeout: Optional[float]) -> Tuple[str, float]:
    rid = request_id if request_id is not None else ids.next()
    return rid, client_timeout if timeout is None else _wire.check_timeout(timeout)


class StreamReader:
    """The receiving side of one generate call, fed the events a client's transport hands it:
    a ServerMessage (chunk, final or error) of the request, or a CarpoolError made in the
    client (Timeout, Cancelled, a broken connection). Not thread-safe; a stream owns it.

    Once ended (done), `error` is None after a final, else the error that ended the call.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.done = False
        self.error: Optional[errors.CarpoolError] = None
        self._acc = _wire.Accumulator(request_id)

    def feed(self, event: Any) -> Optional[Chunk]:
        """The chunk `event` carries; None when it ended the call."""
        if isinstance(event, errors.CarpoolError):
            self.end(event)
            return None
        kind = event.WhichOneof("body")
        if kind == "chunk":
            return self._acc.chunk(event.chunk)
        if kind == "final":
            self._acc.final(event.final)
            self.done = True
        else:
            self.end(errors.from_error(event.error))
        return None

    def end(self, error: errors.CarpoolError) -> None:
        self.done = True
        self.error = error

    def check_ended(self) -> bool:
        """True once the call ended normally; raises its error when it ended in one."""
        if self.done and self.error is not None:
            raise self.error
        return self.done

    @property
    def result(self) -> GenerateResult:
        """The whole result once the call ended normally; before (or after an error), what
        the chunks read so far hold."""
        return self._acc.result if self.done and self.error is None else self._acc.partial()


def embed_answer(event: Any) -> Optional[EmbedResult]:
    """The EmbedResult in an event of an embed call (as StreamReader.feed takes); raises the
    error it carries; None for anything else (the caller keeps waiting)."""
    return _answer(event, "embed_result", _wire.embed_result_from)


def tokenize_answer(event: Any) -> Optional[TokenizeResult]:
    """As embed_answer, for a tokenize call."""
    return _answer(event, "tokenize_result", _wire.tokenize_result_from)


def detokenize_answer(event: Any) -> Optional[str]:
    """As embed_answer, for a detokenize call: the text (invalid UTF-8 shows as U+FFFD)."""
    return _answer(event, "detokenize_result",
                   lambda r: bytes(r.text).decode("utf-8", "replace"))


def _answer(event: Any, body: str, convert: Any) -> Any:
    if isinstance(event, errors.CarpoolError):
        raise event
    kind = event.WhichOneof("body")
    if kind == body:
        return convert(getattr(event, body))
    if kind == "error":
        raise errors.from_error(event.error)
    return None


class Problems:
    """Frames from the router that a client could not match to a call or decode: counted, the
    last one described, for the message of a later Timeout. Not thread-safe (the blocking
    client holds its lock around it)."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""

    def note(self, what: str) -> None:
        self.count += 1
        self.last = what

    def note_unmatched(self, msg: Any) -> None:
        """Notes `msg`, a message of no call in flight, when it is a refusal the router could
        not tie to a request (a message over its size limit); other strays are not problems."""
        if msg.WhichOneof("body") == "error" and not msg.error.request_id:
            self.note("%s: %s" % (msg.error.reason, msg.error.message))

    def suffix(self) -> str:
        """"" when none, else a clause for a Timeout message."""
        if not self.last:
            return ""
        return "; the router sent %d message(s) this client could not match or decode " \
               "(last: %s)" % (self.count, self.last)
