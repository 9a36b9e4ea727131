"""The blocking client: generate and chat (whole or streamed), embed, tokenize, detokenize,
cancel, stats and batch jobs (files and batches) against a carpool router.

Thread safety: a Client may be shared by any number of threads. One background I/O thread per
Client owns its ZeroMQ DEALER socket (ZeroMQ sockets are not thread-safe); calling threads hand it
frames through a queue and wait for their own answers, which it routes by request_id, so calls
never wait for one another. A Stream belongs to one thread at a time, except Stream.cancel(), which
any thread may call.
"""

import collections
import os
import queue
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Union

import zmq
from zmq.utils.monitor import parse_monitor_message

from . import _batch
from . import _failover
from . import _requests
from . import _wire
from . import errors
from .sampling import SamplingParams
from .types import (Batch, BatchList, BatchResults, Chunk, EmbedResult, FileObject,
                    GenerateResult, Stats, TokenizeResult)

DEFAULT_URL = "tcp://127.0.0.1:5555"

# Batch calls that change nothing: with several routers, sent again after a router is lost.
_READ_ONLY_BATCH_OPS = _failover.READ_ONLY_BATCH_OPS


class SocketOptions:
    """Connection options shared by Client and AsyncClient (see Client's docstring)."""

    def __init__(self, max_message_bytes: int = 16 << 20, heartbeat_ms: int = 1000,
                 curve_server_key: str = "", curve_public_key: str = "",
                 curve_secret_key: str = "") -> None:
        if max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be > 0")
        if heartbeat_ms < 0:
            raise ValueError("heartbeat_ms must be >= 0")
        keys = {"curve_server_key": curve_server_key, "curve_public_key": curve_public_key,
                "curve_secret_key": curve_secret_key}
        for name, key in keys.items():
            if key and len(key) != 40:
                raise errors.InvalidArgument("%s must be a 40-character Z85 key" % name)
        if bool(curve_public_key) != bool(curve_secret_key):
            raise errors.InvalidArgument(
                "curve_public_key and curve_secret_key go together (or both stay empty)")
        if curve_public_key and not curve_server_key:
            raise errors.InvalidArgument("a CURVE key pair needs curve_server_key")
        self.max_message_bytes = int(max_message_bytes)
        self.heartbeat_ms = int(heartbeat_ms)
        self.curve_server_key = curve_server_key
        self.curve_public_key = curve_public_key
        self.curve_secret_key = curve_secret_key


# What a connection monitor reports: a connection is up (handshake done), or it dropped.
_MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


def configure_socket(sock: "zmq.Socket", url: str,
                     options: SocketOptions) -> Optional["zmq.Socket"]:
    """Applies `options` to a DEALER socket and connects it (InvalidArgument for a bad url).

    Returns the PAIR socket of a monitor on the connection (of the socket's own kind, sync or
    asyncio; None for inproc://, which has no connection to lose): read it with
    ConnectionWatch.
    """
    monitor = None
    try:
        sock.setsockopt(zmq.LINGER, 200)  # on close, cancels get ~200 ms to leave
        sock.setsockopt(zmq.MAXMSGSIZE, options.max_message_bytes)
        if options.heartbeat_ms > 0 and hasattr(zmq, "HEARTBEAT_IVL"):
            # A router that sends nothing for 1.5 intervals after a PING is dropped: a silent
            # router is noticed within 2.5 intervals. PINGs are answered by the router's ZeroMQ
            # I/O thread, so a busy router is not.
            sock.setsockopt(zmq.HEARTBEAT_IVL, options.heartbeat_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, options.heartbeat_ms * 3 // 2)
        if options.curve_server_key:
            if not zmq.has("curve"):
                raise errors.InvalidArgument("this libzmq has no CURVE support")
            public, secret = options.curve_public_key, options.curve_secret_key
            if not public:
                public, secret = (k.decode("ascii") for k in zmq.curve_keypair())
            sock.setsockopt_string(zmq.CURVE_SERVERKEY, options.curve_server_key)
            sock.setsockopt_string(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt_string(zmq.CURVE_SECRETKEY, secret)
        if not url.startswith("inproc://"):
            monitor = sock.get_monitor_socket(_MONITOR_EVENTS)  # before connect: misses nothing
            monitor.setsockopt(zmq.LINGER, 0)
        sock.connect(url)
        return monitor
    except zmq.ZMQError as e:
        close_monitor(sock, monitor)
        sock.close(linger=0)
        raise errors.InvalidArgument("cannot connect to %r: %s" % (url, e)) from None
    except BaseException:
        close_monitor(sock, monitor)
        sock.close(linger=0)
        raise


def close_monitor(sock: "zmq.Socket", monitor: Optional["zmq.Socket"]) -> None:
    if monitor is None:
        return
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(linger=0)


class ConnectionWatch:
    """Reads a connection monitor's events and tells when an established connection dropped:
    every call sent over it is then lost (the router keys requests by connection). A failed
    handshake (a wrong CURVE key, a peer that is not a router) never carried a call: not lost."""

    def __init__(self) -> None:
        self._up = False

    @property
    def up(self) -> bool:
        """The connection is up (its handshake done) and has not dropped since."""
        return self._up

    def lost(self, parts: List[bytes]) -> bool:
        """Feeds one monitor message; True when it says the connection was lost."""
        event = parse_monitor_message(parts)["event"]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._up = True
        elif event == zmq.EVENT_DISCONNECTED and self._up:
            self._up = False
            return True
        return False


def router_lost_error(url: str, request_id: str = "", why: str = "") -> errors.RouterLost:
    return errors.RouterLost(_failover.lost_why(url, why), request_id=request_id)


router_urls = _failover.router_urls


class _Call(_failover.Call):
    """One call in flight: the I/O thread appends what arrives for it. With several routers
    its failover fields (_failover.Call) are the I/O thread's once started."""
    __slots__ = ("events",)

    def __init__(self, request_id: str, frame: bytes = b"", resend: bool = False) -> None:
        super().__init__(request_id, frame, resend)
        # ServerMessage (chunk, final, error) or a CarpoolError made in this client.
        self.events: "queue.SimpleQueue[Any]" = queue.SimpleQueue()


class _StatsCall:
    __slots__ = ("answer", "abandoned")

    def __init__(self) -> None:
        self.answer: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.abandoned = False


class _Core:
    """The socket, its I/O thread and the calls in flight. Shared by a Client and its Streams."""

    def __init__(self, url: Union[str, Sequence[str]], options: SocketOptions,
                 context: Optional["zmq.Context"], connect_timeout: float = 1.0) -> None:
        self._urls = router_urls(url)
        self._url = self._urls[0]  # the router in use (the I/O thread's once started)
        self._options = options
        self._connect_timeout = float(connect_timeout)
        if self._connect_timeout <= 0:
            raise ValueError("connect_timeout must be > 0")
        self._own_context = context is None
        self._context = context if context is not None else zmq.Context()
        try:
            self._sock = self._context.socket(zmq.DEALER)
            self._monitor = configure_socket(self._sock, self._url, options)
        except BaseException:
            if self._own_context:
                self._context.term()
            raise
        self._connecting_since = time.monotonic()
        self._watch = ConnectionWatch()  # I/O thread only
        self._poller: Optional[zmq.Poller] = None  # I/O thread only
        self._unsent: Deque[bytes] = collections.deque()  # I/O thread only
        # _mu guards the fields below it; the socket belongs to the I/O thread alone.
        self._mu = threading.Lock()
        self._calls: Dict[str, _Call] = {}
        self._stats_calls: Deque[_StatsCall] = collections.deque()  # in send order
        self._outbox: Deque[bytes] = collections.deque()  # frames for the I/O thread to send
        self._closed = False
        self._broken: Optional[errors.CarpoolError] = None  # set when the I/O thread failed
        self._problems = _requests.Problems()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="carpool-client-io", daemon=True)
        self._thread.start()

    @property
    def failover(self) -> bool:
        """Several routers: calls open when one is lost go to the next."""
        return len(self._urls) > 1

    # ---- calling threads

    def start(self, request_id: str, frame: bytes, resend: bool = True) -> _Call:
        """Sends `frame` as a new call. resend: with several routers, it may be sent to the
        next router when its router is lost (not for batch calls that change the store)."""
        frame = _failover.seeded(frame, self.failover)
        call = _Call(request_id, frame, resend)
        with self._mu:
            if self._closed:
                raise errors.Cancelled("the client is closed", request_id=request_id)
            if self._broken is not None:
                raise self._broken
            if request_id in self._calls:
                raise errors.InvalidArgument(
                    "request_id %r is already in flight on this client" % request_id,
                    code="ALREADY_EXISTS", request_id=request_id)
            self._calls[request_id] = call
            self._outbox.append(frame)
        self._wake()
        return call

    def wait(self, call: _Call, deadline: float, timeout: float) -> Any:
        """The next event of `call`; on timeout, cancels it at the router and raises Timeout."""
        try:
            return call.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pass
        self._forget(call.request_id, call)
        raise _wire.timeout_error(call.request_id, "answer", timeout, self._problem_note())

    def cancel(self, request_id: str, message: str = "cancelled by the client") -> bool:
        with self._mu:
            call = self._calls.pop(request_id, None)
            if call is None:
                return False
            self._outbox.append(_wire.cancel_frame(request_id))
        call.events.put(errors.Cancelled(message, request_id=request_id))
        self._wake()
        return True

    def _forget(self, request_id: str, call: _Call) -> None:
        """Drops `call` (if still in flight) and tells the router to cancel it."""
        with self._mu:
            if self._calls.get(request_id) is not call:
                return
            del self._calls[request_id]
            if self._closed:
                return
            self._outbox.append(_wire.cancel_frame(request_id))
        self._wake()

    def stats(self, timeout: float, api_key: str) -> Stats:
        call = _StatsCall()
        with self._mu:
            if self._closed:
                raise errors.Cancelled("the client is closed")
            if self._broken is not None:
                raise self._broken
            self._stats_calls.append(call)
            self._outbox.append(_wire.stats_frame(api_key))
        self._wake()
        try:
            answer = call.answer.get(timeout=timeout)
        except queue.Empty:
            with self._mu:
                call.abandoned = True
            raise _wire.timeout_error("", "stats answer", timeout, self._problem_note()) from None
        if isinstance(answer, errors.CarpoolError):
            raise answer
        return _wire.stats_from(answer)

    def close(self) -> None:
        with self._mu:
            if self._closed:
                return
            self._closed = True
            calls = list(self._calls.values())
            self._calls.clear()
            for call in calls:
                self._outbox.append(_wire.cancel_frame(call.request_id))
            stats_calls = list(self._stats_calls)
            self._stats_calls.clear()
        for call in calls:
            call.events.put(errors.Cancelled("the client was closed", request_id=call.request_id))
        for s in stats_calls:
            s.answer.put(errors.Cancelled("the client was closed"))
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)
            if self._own_context:
                self._context.term()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed

    def _problem_note(self) -> str:
        with self._mu:
            return self._problems.suffix()

    # ---- the I/O thread

    def _run(self) -> None:
        self._poller = poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        unsent = self._unsent
        try:
            while True:
                events = dict(poller.poll(self._poll_timeout_ms()))
                if self._wake_r in events:
                    self._drain_wake_pipe()
                with self._mu:
                    unsent.extend(self._outbox)
                    self._outbox.clear()
                    closing = self._closed
                while unsent:
                    try:
                        self._sock.send(unsent[0], zmq.NOBLOCK)
                    except zmq.Again:  # high-water mark: wait for POLLOUT
                        break
                    unsent.popleft()
                poller.modify(self._sock, zmq.POLLIN | (zmq.POLLOUT if unsent else 0))
                if closing:
                    break
                # Answers that arrived before a disconnect are routed before calls are ended.
                self._receive_all()
                if self._monitor is not None and self._monitor in events:
                    self._read_monitor()
                if self._poll_timeout_ms() == 0:
                    self._router_lost("no connection to the router at %s within %g s "
                                      "(connect_timeout)" % (self._url, self._connect_timeout))
        except Exception as e:  # a broken socket or context: fail every call, never hang them
            self._fail_all(errors.InternalError("the client's I/O thread failed: %r" % (e,)))
        finally:
            close_monitor(self._sock, self._monitor)
            self._sock.close(linger=200)

    def _poll_timeout_ms(self) -> int:
        """1000, or with several routers while the connection is not up, the ms until it
        counts as failed (connect_timeout)."""
        if not self.failover or self._watch.up or self._monitor is None:
            return 1000
        left = self._connecting_since + self._connect_timeout - time.monotonic()
        return max(0, min(1000, int(left * 1000)))

    def _switch_router(self) -> None:
        """Closes the connection to the current router and connects to the next."""
        self._poller.unregister(self._sock)
        if self._monitor is not None:
            self._poller.unregister(self._monitor)
        close_monitor(self._sock, self._monitor)
        self._sock.close(linger=0)  # what it still holds was for the lost router
        self._unsent.clear()
        self._url = _failover.next_url(self._urls, self._url)
        self._sock = self._context.socket(zmq.DEALER)
        self._monitor = configure_socket(self._sock, self._url, self._options)
        self._connecting_since = time.monotonic()
        self._watch = ConnectionWatch()
        self._poller.register(self._sock, zmq.POLLIN)
        if self._monitor is not None:
            self._poller.register(self._monitor, zmq.POLLIN)

    def _read_monitor(self) -> None:
        while True:
            try:
                parts = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if self._watch.lost(parts):
                self._router_lost()
                return  # with several routers the monitor was replaced

    def _router_lost(self, why: str = "") -> None:
        """Ends every call and stats query in flight with RouterLost; the client goes on. With
        several routers it first connects to the next, and the calls that may go there are
        sent again instead: a stream resuming after the tokens it received (resume_tokens),
        any other as it was, at most once per router each."""
        lost = self._url
        why = _failover.lost_why(lost, why)
        resent = False
        with self._mu:
            if self.failover:
                self._switch_router()
                why += "; failing over to %s" % self._url
                # Frames not sent yet were for the lost router: the calls are sent again below.
                self._outbox.clear()
            ended = []
            for request_id, call in list(self._calls.items()):
                frame = call.failover_frame(len(self._urls))
                if frame is None:
                    del self._calls[request_id]
                    ended.append(call)
                    continue
                self._outbox.append(frame)
                resent = True
            stats_calls = list(self._stats_calls)
            self._stats_calls.clear()
        if resent:
            self._wake()
        for call in ended:
            call.events.put(router_lost_error(lost, call.request_id, why))
        for s in stats_calls:
            s.answer.put(router_lost_error(lost, "", why))

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _receive_all(self) -> None:
        while True:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._route(frame)

    def _route(self, frame: bytes) -> None:
        try:
            msg = _wire.parse_server(frame)
        except ValueError as e:
            self._note_problem(str(e))
            return
        kind = msg.WhichOneof("body")
        if kind == "stats":
            with self._mu:
                while self._stats_calls:
                    call = self._stats_calls.popleft()
                    if not call.abandoned:
                        call.answer.put(msg.stats)
                        return
            return
        request_id = _wire.request_id_of(msg)
        if kind == "error" and not request_id:  # a refusal naming no request answers a stats
            with self._mu:                        # query (one without a key, say)
                while self._stats_calls:
                    call = self._stats_calls.popleft()
                    if not call.abandoned:
                        call.answer.put(errors.from_error(msg.error))
                        return
                self._problems.note_unmatched(msg)
            return
        with self._mu:
            call = self._calls.get(request_id)
            if call is not None and kind != "chunk":
                del self._calls[request_id]
        if call is not None:
            if self.failover:
                call.received(kind, msg)
            call.events.put(msg)
            return
        with self._mu:
            self._problems.note_unmatched(msg)

    def _note_problem(self, what: str) -> None:
        with self._mu:
            self._problems.note(what)

    def _fail_all(self, error: errors.CarpoolError) -> None:
        with self._mu:
            self._broken = error
            calls = list(self._calls.values())
            self._calls.clear()
            stats_calls = list(self._stats_calls)
            self._stats_calls.clear()
        for call in calls:
            call.events.put(error)
        for s in stats_calls:
            s.answer.put(error)


class Stream:
    """One streaming request: iterate it for Chunks; `result` is complete once iteration ends.

    Iteration raises the request's CarpoolError (Timeout when the call's timeout passes, Cancelled
    after cancel()) and, once ended, raises the same end again. Dropping or closing an unfinished
    Stream cancels its request.
    """

    def __init__(self, client: "Client", core: _Core, call: _Call, deadline: float,
                 timeout: float) -> None:
        self._client = client  # keeps the client (and its socket) alive while the stream is
        self._core = core
        self._call = call
        self._deadline = deadline
        self._timeout = timeout
        self._reader = _requests.StreamReader(call.request_id)

    @property
    def request_id(self) -> str:
        return self._call.request_id

    @property
    def done(self) -> bool:
        return self._reader.done

    @property
    def result(self) -> GenerateResult:
        """Everything received so far; the complete result once the stream ended normally."""
        return self._reader.result

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Chunk:
        while not self._reader.check_ended():
            try:
                event = self._core.wait(self._call, self._deadline, self._timeout)
            except errors.CarpoolError as e:
                event = e
            chunk = self._reader.feed(event)
            if chunk is not None:
                return chunk
        raise StopIteration

    def wait(self) -> GenerateResult:
        """Reads the remaining chunks and returns the whole result (raises the stream's error)."""
        for _ in self:
            pass
        return self._reader.result

    def cancel(self) -> bool:
        """Ends the request: the router is told, and iteration raises Cancelled once the chunks
        already received are read. False when the request had already ended. Any thread."""
        return self._core.cancel(self.request_id)

    def close(self) -> None:
        """Cancels the request if it has not ended."""
        if not self._reader.done:
            self._core.cancel(self.request_id)
            self._reader.end(errors.Cancelled("the stream was closed", request_id=self.request_id))

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._reader.done and not self._core.closed:
                self._core.cancel(self.request_id)
        except Exception:
            pass


class Client:
    """A blocking carpool client over one ZeroMQ DEALER socket.

      client = carpool.Client("tcp://10.0.0.1:5555", timeout=30)
      greedy = carpool.SamplingParams(max_tokens=32, temperature=0)
      print(client.generate("The carpool left at dawn", sampling=greedy).text)
      for chunk in client.stream("Once upon a time", sampling=greedy):
          print(chunk.text, end="", flush=True)
      reply = client.chat([{"role": "user", "content": "Hi"}], sampling=greedy)

    Args:
      url: the router's frontend endpoint, or several (a list, or one string separated by
        commas): a pair of routers (docs/cluster.md, "Two routers"). With several the client
        talks to one at a time; when its connection drops (or is not up within
        connect_timeout) it connects to the next, and every call open is sent there again
        instead of raising RouterLost: a stream with the tokens it already received as
        resume_tokens (it continues after them: no gap, no duplicate), any other call as it was
        (not a batch call that changes the store), at most once per router each. Generate calls
        without a seed get one drawn here, so a resumed stream is the one the lost router would
        have produced. Default: tcp://127.0.0.1:5555.
      connect_timeout: with several routers, seconds a connection may take to come up before
        the next router is tried. Default: 1.
      timeout: seconds a call may take, unless the call names its own. Default: 60.
      api_key: sent with every request that names none. Default: none.
      max_message_bytes: largest message accepted from the router. Default: 16 MiB.
      heartbeat_ms: ZMTP heartbeat interval: a router silent for 1.5 intervals after a PING is
        dropped; 0: off. Default: 1000.
      curve_server_key: the router's CURVE public key (Z85, 40 characters): encrypts the
        connection. Default: off.
      curve_public_key, curve_secret_key: this client's CURVE key pair, for a router that checks
        client keys (--curve-allow). Default: generated per client.
      context: a zmq.Context to use; by default the client makes (and terminates) its own.

    Connecting does not wait for the router: calls to a router that never answers raise Timeout.
    When the connection to the router drops (the router died or closed it, or missed heartbeats),
    every call open on it raises RouterLost at once; the client redials by itself.
    Thread-safe (see the module docstring). Use it as a context manager, or call close().
    """

    def __init__(self, url: Union[str, Sequence[str]] = DEFAULT_URL, *, timeout: float = 60.0,
                 api_key: str = "", max_message_bytes: int = 16 << 20, heartbeat_ms: int = 1000,
                 curve_server_key: str = "", curve_public_key: str = "",
                 curve_secret_key: str = "", context: Optional["zmq.Context"] = None,
                 connect_timeout: float = 1.0) -> None:
        self.url = url
        self.timeout = _wire.check_timeout(timeout)
        self.api_key = api_key
        self._ids = _wire.RequestIds()
        options = SocketOptions(max_message_bytes, heartbeat_ms, curve_server_key,
                                curve_public_key, curve_secret_key)
        self._max_message_bytes = options.max_message_bytes
        self._core = _Core(url, options, context, connect_timeout)

    def generate(self, prompt: Optional[_wire.Prompt] = None, *,
                 token_ids: Optional[Sequence[int]] = None,
                 sampling: Optional[SamplingParams] = None,
                 priority: Union[str, int] = "default", deadline_ms: int = 0,
                 add_bos: bool = True, request_id: Optional[str] = None,
                 api_key: Optional[str] = None, timeout: Optional[float] = None,
                 stream: bool = False, model: str = "") -> Union[GenerateResult, Stream]:
        """Generates from `prompt` (str or bytes: text; a list of ints: token ids).

        sampling: a carpool.SamplingParams (max_tokens, temperature, top_k, ..., logprobs, stop
        strings, include_stop_str_in_output, skip_special_tokens); its unset fields, and all of
        them when None, take the worker's defaults (max_tokens 16, temperature 1, ...).
        priority: "interactive", "default" or "batch". deadline_ms: the router drops the request
        if it is not done this long after arrival (0: none). add_bos: add the tokenizer's
        special tokens (BOS) to a text prompt (default True, as Hugging Face's encode, the CLI,
        the C++ SDK and the HTTP gateway do). request_id: unique among this client's calls in
        flight (default: generated). timeout: seconds for the whole call (default: the
        client's); past it the router is told to cancel and Timeout is raised. model: the model
        to serve it (default "": the cluster's only model; UnknownModel for one not served).

        stream=False: waits and returns the GenerateResult. stream=True: returns a Stream at
        once (the request is sent); iterate it for Chunks.
        Raises the CarpoolError subclass of the router's reason, or Timeout.
        """
        req = _requests.generate_request(
            self._ids, self.api_key, self.timeout, prompt, token_ids=token_ids, sampling=sampling,
            priority=priority, deadline_ms=deadline_ms, add_bos=add_bos, request_id=request_id,
            api_key=api_key, timeout=timeout, stream=stream, model=model)
        deadline = time.monotonic() + req.timeout
        call = self._core.start(req.request_id, req.frame)
        s = Stream(self, self._core, call, deadline, req.timeout)
        return s if stream else s.wait()

    def stream(self, prompt: Optional[_wire.Prompt] = None, **kwargs: Any) -> Stream:
        """generate(prompt, stream=True, **kwargs): a Stream of Chunks."""
        kwargs["stream"] = True
        return self.generate(prompt, **kwargs)

    def chat(self, messages: Sequence[Mapping[str, Any]], *,
             tools: Optional[Sequence[Any]] = None, add_generation_prompt: bool = True,
             chat_template_kwargs: Optional[Mapping[str, Any]] = None,
             sampling: Optional[SamplingParams] = None,
             priority: Union[str, int] = "default", deadline_ms: int = 0,
             request_id: Optional[str] = None, api_key: Optional[str] = None,
             timeout: Optional[float] = None, stream: bool = False,
             model: str = "") -> Union[GenerateResult, Stream]:
        """Generates the assistant's turn of a conversation: the router renders `messages` with
        the model's chat template (or its --chat-template) and tokenizes the text without adding
        special tokens again, as transformers' apply_chat_template does (docs/chat_templates.md).

        messages: a list of dicts, OpenAI chat messages ({"role": "user", "content": "Hi"};
        content a str, None or a list of parts; tool_calls, tool_call_id, name,
        reasoning_content as the template reads them), sent as JSON in their key order.
        tools: a list of OpenAI tools ({"type": "function", "function": {...}}) for the
        template's `tools`; None: none. add_generation_prompt: open the assistant's turn
        (default True). chat_template_kwargs: a dict of extra template variables (e.g.
        {"enable_thinking": False}); None: none. The other arguments as for generate.

        Raises TypeError for arguments of the wrong shape or not JSON-serializable, before
        sending; InvalidArgument when the router refuses the conversation (an unknown role, a
        content part that is not text, a template that raises: its message, a template over its
        limits, a model with no chat template); otherwise as generate.
        """
        req = _requests.chat_request(
            self._ids, self.api_key, self.timeout, messages, tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs, sampling=sampling, priority=priority,
            deadline_ms=deadline_ms, request_id=request_id, api_key=api_key, timeout=timeout,
            stream=stream, model=model)
        deadline = time.monotonic() + req.timeout
        call = self._core.start(req.request_id, req.frame)
        s = Stream(self, self._core, call, deadline, req.timeout)
        return s if stream else s.wait()

    def cancel(self, request_id: str) -> bool:
        """Cancels a call of this client in flight: it raises Cancelled and the router frees the
        request's resources. False when no call with that id is in flight."""
        return self._core.cancel(request_id)

    def stats(self, timeout: Optional[float] = None, api_key: Optional[str] = None) -> Stats:
        """The router's view of the cluster: workers, queue, totals. A router with tenants
        answers only to a key (default: the client's api_key): Unauthenticated otherwise."""
        return self._core.stats(self.timeout if timeout is None else _wire.check_timeout(timeout),
                                self.api_key if api_key is None else api_key)

    def embed(self, inputs: _wire.EmbedInputs, *, normalize: bool = True,
              pooling: str = "mean", priority: Union[str, int] = "default",
              deadline_ms: int = 0, add_bos: bool = True,
              request_id: Optional[str] = None, api_key: Optional[str] = None,
              timeout: Optional[float] = None, model: str = "") -> EmbedResult:
        """Embeddings of `inputs`: one text (str or bytes), or a list of texts and token-id lists.

        normalize: scale each embedding to unit L2 norm. pooling: "mean" (over every token) or
        "last" (the last token's hidden state). add_bos: prepend the model's BOS to text inputs.
        priority, deadline_ms, request_id, api_key, timeout and model as for generate. Returns an
        EmbedResult with one vector per input, in order. Raises the CarpoolError subclass of the
        router's reason (InvalidArgument naming the bad input, FailedPrecondition when no worker
        serves embeddings), or Timeout.
        """
        req = _requests.embed_request(
            self._ids, self.api_key, self.timeout, inputs, normalize=normalize, pooling=pooling,
            priority=priority, deadline_ms=deadline_ms, add_bos=add_bos, request_id=request_id,
            api_key=api_key, timeout=timeout, model=model)
        return self._one_shot(req, _requests.embed_answer)

    def tokenize(self, text: Optional[Union[str, bytes]] = None, *, model: str = "",
                 add_special_tokens: Optional[bool] = None, request_id: Optional[str] = None,
                 api_key: Optional[str] = None, timeout: Optional[float] = None,
                 messages: Optional[Sequence[Mapping[str, Any]]] = None,
                 tools: Optional[Sequence[Any]] = None, add_generation_prompt: bool = True,
                 chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> TokenizeResult:
        """The token ids of `text` (str, or bytes of UTF-8) with the model's tokenizer, run by
        the router, as Hugging Face's encode: add_special_tokens (default True for a text) adds
        what the tokenizer puts around a sequence (BOS). Returns a TokenizeResult (token_ids,
        max_model_len). model, request_id, api_key and timeout as for generate. Raises
        InvalidArgument (text that is not UTF-8), UnknownModel, Unsupported (a model without a
        tokenizer), or Timeout.

        With messages= (and tools, add_generation_prompt, chat_template_kwargs as for chat)
        instead of a text: the ids of the conversation as the model's chat template renders it,
        which are the prompt ids chat() with the same arguments gets. add_special_tokens then
        defaults to False (the template writes BOS itself)."""
        req = _requests.tokenize_request(
            self._ids, self.api_key, self.timeout, text, model=model,
            add_special_tokens=add_special_tokens, request_id=request_id, api_key=api_key,
            timeout=timeout, messages=messages, tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs)
        return self._one_shot(req, _requests.tokenize_answer)

    def detokenize(self, token_ids: Sequence[int], *, model: str = "",
                   skip_special_tokens: bool = False, request_id: Optional[str] = None,
                   api_key: Optional[str] = None, timeout: Optional[float] = None) -> str:
        """The text of `token_ids` with the model's tokenizer, as Hugging Face's decode
        (special tokens kept unless skip_special_tokens). Raises InvalidArgument for an id
        outside the vocabulary; otherwise as tokenize."""
        req = _requests.detokenize_request(
            self._ids, self.api_key, self.timeout, token_ids, model=model,
            skip_special_tokens=skip_special_tokens, request_id=request_id, api_key=api_key,
            timeout=timeout)
        return self._one_shot(req, _requests.detokenize_answer)

    # ---- batch jobs (docs/batch.md). Each call takes api_key and timeout as generate does.
    # With tenants a batch is its creator's tenant's: other keys get NotFound for its ids.
    # Errors: NotFound, InvalidArgument (a bad endpoint, window or metadata), OutOfRange (a file
    # over the router's --batch-max-file-bytes), FailedPrecondition (a cancel of a batch that
    # ended; a router without a batch store).

    def upload_file(self, content: _batch.Content, filename: str = "batch.jsonl", *,
                    api_key: Optional[str] = None,
                    timeout: Optional[float] = None) -> FileObject:
        """Uploads a batch input file: JSONL (str or bytes, one request a line: {"custom_id",
        "method": "POST", "url", "body"}) or a list of such request dicts."""
        reply = self._batch_call("create_file", api_key, timeout, filename=filename,
                                 purpose="batch", content=_batch.jsonl(content))
        return _batch.file_from(_batch.reply_json(reply, "create_file"))

    def get_file(self, file_id: str, *, api_key: Optional[str] = None,
                 timeout: Optional[float] = None) -> FileObject:
        reply = self._batch_call("get_file", api_key, timeout, id=file_id)
        return _batch.file_from(_batch.reply_json(reply, "get_file"))

    def file_content(self, file_id: str, *, api_key: Optional[str] = None,
                     timeout: Optional[float] = None) -> bytes:
        """The file's bytes. ResourceExhausted, before asking for them, when the file is larger
        than this client's max_message_bytes takes (the connection would drop)."""
        file = self.get_file(file_id, api_key=api_key, timeout=timeout)
        too_large = _batch.too_large_for_client(file, self._max_message_bytes)
        if too_large is not None:
            raise too_large
        return bytes(self._batch_call("file_content", api_key, timeout, id=file_id).content)

    def delete_file(self, file_id: str, *, api_key: Optional[str] = None,
                    timeout: Optional[float] = None) -> None:
        self._batch_call("delete_file", api_key, timeout, id=file_id)

    def submit_batch(self, input_file_id: str, endpoint: str, *,
                     completion_window: str = "24h",
                     metadata: Optional[Mapping[str, str]] = None,
                     api_key: Optional[str] = None, timeout: Optional[float] = None) -> Batch:
        """Starts a batch of an uploaded file. endpoint: "/v1/chat/completions",
        "/v1/completions" or "/v1/embeddings", the url of every line. completion_window: "24h"
        (or "Ns", "Nm", "Nh" up to 24h); past it the batch ends expired. metadata: up to 16
        str values kept with the batch. The batch starts in validating: a bad line fails it
        with every error listed (Batch.errors) before any request runs."""
        reply = self._batch_call("create_batch", api_key, timeout, input_file_id=input_file_id,
                                 endpoint=endpoint, completion_window=completion_window,
                                 metadata_json=_batch.metadata_json(metadata))
        return _batch.batch_from(_batch.reply_json(reply, "create_batch"))

    def submit_batch_file(self, content: _batch.Content, endpoint: Optional[str] = None, *,
                          filename: str = "batch.jsonl", completion_window: str = "24h",
                          metadata: Optional[Mapping[str, str]] = None,
                          api_key: Optional[str] = None,
                          timeout: Optional[float] = None) -> Batch:
        """upload_file then submit_batch; endpoint None: the first line's url (InvalidArgument,
        before sending, when it has none)."""
        data = _batch.jsonl(content)
        if endpoint is None:
            endpoint = _batch.first_line_url(data)
        file = self.upload_file(data, filename, api_key=api_key, timeout=timeout)
        return self.submit_batch(file.id, endpoint, completion_window=completion_window,
                                 metadata=metadata, api_key=api_key, timeout=timeout)

    def get_batch(self, batch_id: str, *, api_key: Optional[str] = None,
                  timeout: Optional[float] = None) -> Batch:
        reply = self._batch_call("get_batch", api_key, timeout, id=batch_id)
        return _batch.batch_from(_batch.reply_json(reply, "get_batch"))

    def list_batches(self, after: str = "", limit: int = 0, *, api_key: Optional[str] = None,
                     timeout: Optional[float] = None) -> BatchList:
        """This tenant's batches, newest first: `limit` (1..100; 0: 20) after the batch
        `after` ("": from the newest)."""
        reply = self._batch_call("list_batches", api_key, timeout, after=after, limit=limit)
        return _batch.list_from(_batch.reply_json(reply, "list_batches"))

    def cancel_batch(self, batch_id: str, *, api_key: Optional[str] = None,
                     timeout: Optional[float] = None) -> Batch:
        """validating or in_progress: cancelling, then cancelled once its requests in flight
        ended, what finished kept. FailedPrecondition when it already ended otherwise."""
        reply = self._batch_call("cancel_batch", api_key, timeout, id=batch_id)
        return _batch.batch_from(_batch.reply_json(reply, "cancel_batch"))

    def wait_batch(self, batch_id: str, *, poll_interval: float = 1.0,
                   timeout: Optional[float] = None,
                   on_poll: Optional[Callable[[Batch], None]] = None,
                   api_key: Optional[str] = None) -> Batch:
        """Polls the batch every poll_interval seconds until it is finished (timeout: seconds in
        all, None: no limit; Timeout past it), calling on_poll with each state read."""
        interval = _wire.check_timeout(poll_interval)
        end = None if timeout is None else time.monotonic() + _wire.check_timeout(timeout)
        while True:
            batch = self.get_batch(batch_id, api_key=api_key)
            if on_poll is not None:
                on_poll(batch)
            if batch.finished:
                return batch
            if end is not None and time.monotonic() + interval >= end:
                raise _batch.wait_timeout(batch, timeout)
            time.sleep(interval)

    def batch_results(self, batch_id: str, *, api_key: Optional[str] = None,
                      timeout: Optional[float] = None) -> BatchResults:
        """The output and error files of a finished batch (b"" for one it has none of).
        FailedPrecondition while it still runs."""
        batch = self.get_batch(batch_id, api_key=api_key, timeout=timeout)
        if not batch.finished:
            raise _batch.not_finished(batch)
        files = [self.file_content(f, api_key=api_key, timeout=timeout) if f else b""
                 for f in (batch.output_file_id, batch.error_file_id)]
        return BatchResults(*files)

    def _batch_call(self, op: str, api_key: Optional[str], timeout: Optional[float],
                    **fields: Any) -> Any:
        req = _batch.call_request(self._ids, self.api_key, self.timeout, op, api_key=api_key,
                                  timeout=timeout, **fields)
        # A call that may have changed the store is not sent to another router after a loss.
        return self._one_shot(req, _batch.reply_answer, resend=op in _READ_ONLY_BATCH_OPS)

    def _one_shot(self, req: _requests.Request, answer: Any, resend: bool = True) -> Any:
        """Sends a one-shot call and waits for the answer `answer` finds in its events."""
        deadline = time.monotonic() + req.timeout
        call = self._core.start(req.request_id, req.frame, resend)
        while True:
            result = answer(self._core.wait(call, deadline, req.timeout))
            if result is not None:
                return result

    def close(self) -> None:
        """Ends every call in flight with Cancelled (telling the router) and closes the socket.
        Idempotent."""
        self._core.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._core.close()
        except Exception:
            pass
