"""The asyncio client (zmq.asyncio): the same calls as Client, awaited, with async-iterable streams.

Thread safety: an AsyncClient belongs to one event loop (the loop of its first call) and one
thread; use a separate AsyncClient per loop. Any number of coroutines on that loop may use it at
once: one reader task per client routes the router's messages by request_id.
"""

import asyncio
import collections
import time
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Sequence, Set, Union

import zmq
import zmq.asyncio

from . import _batch
from . import _failover
from . import _requests
from . import _wire
from . import errors
from .client import (DEFAULT_URL, ConnectionWatch, SocketOptions, close_monitor,
                     configure_socket, router_lost_error)
from .sampling import SamplingParams
from .types import (Batch, BatchList, BatchResults, Chunk, EmbedResult, FileObject,
                    GenerateResult, Stats, TokenizeResult)


class _Call(_failover.Call):
    """One call in flight: the reader task puts what arrives for it in `events`."""
    __slots__ = ("events",)

    def __init__(self, request_id: str, frame: bytes, resend: bool) -> None:
        super().__init__(request_id, frame, resend)
        # ServerMessage (chunk, final, error) or a CarpoolError made in this client.
        self.events: "asyncio.Queue[Any]" = asyncio.Queue()


class AsyncStream:
    """One streaming request: `async for chunk in stream`; `result` is complete at the end.

    From AsyncClient.generate(..., stream=True) the request is already sent; from
    AsyncClient.stream(...) it is sent on the first iteration (or `await stream.start()`, or
    `async with`). Iteration raises the request's CarpoolError (Timeout past the call's timeout,
    Cancelled after cancel()). Closing an unfinished stream cancels its request.
    """

    def __init__(self, client: "AsyncClient", request: _requests.Request) -> None:
        self._client = client
        self._request_id = request.request_id
        self._frame = request.frame
        self._timeout = request.timeout
        self._deadline = 0.0
        self._call: Optional[_Call] = None
        self._reader = _requests.StreamReader(request.request_id)

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def done(self) -> bool:
        return self._reader.done

    @property
    def result(self) -> GenerateResult:
        """Everything received so far; the complete result once the stream ended normally."""
        return self._reader.result

    async def start(self) -> None:
        """Sends the request (once; later calls do nothing)."""
        if self._call is not None or self._reader.done:
            return
        self._deadline = time.monotonic() + self._timeout
        self._call = await self._client._start(self._request_id, self._frame, self._deadline,
                                               self._timeout)

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Chunk:
        while not self._reader.check_ended():
            try:
                await self.start()
                event = await self._client._wait(self._call, self._deadline, self._timeout)
            except errors.CarpoolError as e:
                event = e
            except asyncio.CancelledError:  # the awaiting task was cancelled: so is the request
                self._client._cancel_nowait(self._request_id)
                self._reader.end(errors.Cancelled("the awaiting task was cancelled",
                                                  request_id=self._request_id))
                raise
            chunk = self._reader.feed(event)
            if chunk is not None:
                return chunk
        raise StopAsyncIteration

    async def wait(self) -> GenerateResult:
        """Reads the remaining chunks and returns the whole result (raises the stream's error)."""
        async for _ in self:
            pass
        return self._reader.result

    async def cancel(self) -> bool:
        """Ends the request; iteration raises Cancelled once the chunks already received are read.
        False when the request had already ended (or was never sent)."""
        return await self._client.cancel(self._request_id)

    async def aclose(self) -> None:
        """Cancels the request if it has not ended."""
        if not self._reader.done:
            if self._call is not None:
                await self._client.cancel(self._request_id)
            self._reader.end(errors.Cancelled("the stream was closed",
                                              request_id=self._request_id))

    async def __aenter__(self) -> "AsyncStream":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __del__(self) -> None:
        try:
            if not self._reader.done and self._call is not None:
                self._client._cancel_nowait(self._request_id)
        except Exception:
            pass


class AsyncClient:
    """An asyncio carpool client over one zmq.asyncio DEALER socket.

      async with carpool.AsyncClient("tcp://10.0.0.1:5555") as client:
          result = await client.generate("Hello", sampling=carpool.SamplingParams(max_tokens=16))
          async for chunk in client.stream("Once upon a time"):
              print(chunk.text, end="")

      async with carpool.AsyncClient(["tcp://10.0.0.5:5555", "tcp://10.0.0.6:5555"]) as c:
          ...  # two routers: calls open when one is lost go on at the other

    Arguments as for Client, url and connect_timeout included: one router endpoint, or several
    (a list, or one string separated by commas), between which the client fails over exactly
    as Client does (docs/cluster.md, "Two routers"). Connecting does not wait for the router.
    """

    def __init__(self, url: Union[str, Sequence[str]] = DEFAULT_URL, *, timeout: float = 60.0,
                 api_key: str = "", max_message_bytes: int = 16 << 20, heartbeat_ms: int = 1000,
                 curve_server_key: str = "", curve_public_key: str = "",
                 curve_secret_key: str = "",
                 context: Optional["zmq.asyncio.Context"] = None,
                 connect_timeout: float = 1.0) -> None:
        self.url = url
        self._urls = _failover.router_urls(url)
        self._url = self._urls[0]  # the router in use
        self.timeout = _wire.check_timeout(timeout)
        self.api_key = api_key
        self._connect_timeout = float(connect_timeout)
        if self._connect_timeout <= 0:
            raise ValueError("connect_timeout must be > 0")
        self._ids = _wire.RequestIds()
        options = SocketOptions(max_message_bytes, heartbeat_ms, curve_server_key,
                                curve_public_key, curve_secret_key)
        self._options = options
        self._max_message_bytes = options.max_message_bytes
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        try:
            self._sock = self._context.socket(zmq.DEALER)
            self._monitor = configure_socket(self._sock, self._url, options)
        except BaseException:
            if self._own_context:
                self._context.term()
            raise
        self._connecting_since = time.monotonic()
        self._watch = ConnectionWatch()
        self._calls: Dict[str, _Call] = {}
        self._stats_calls: Deque["asyncio.Future[Any]"] = collections.deque()
        self._reader: Optional["asyncio.Task[None]"] = None
        self._background: Set["asyncio.Future[Any]"] = set()
        self._closed = False
        self._broken: Optional[errors.CarpoolError] = None
        self._problems = _requests.Problems()

    async def generate(self, prompt: Optional[_wire.Prompt] = None, *,
                       token_ids: Optional[Sequence[int]] = None,
                       sampling: Optional[SamplingParams] = None,
                       priority: Union[str, int] = "default", deadline_ms: int = 0,
                       add_bos: bool = True, request_id: Optional[str] = None,
                       api_key: Optional[str] = None, timeout: Optional[float] = None,
                       stream: bool = False,
                       model: str = "") -> Union[GenerateResult, AsyncStream]:
        """As Client.generate. stream=False: the GenerateResult. stream=True: an AsyncStream
        whose request is already sent."""
        s = AsyncStream(self, _requests.generate_request(
            self._ids, self.api_key, self.timeout, prompt, token_ids=token_ids, sampling=sampling,
            priority=priority, deadline_ms=deadline_ms, add_bos=add_bos, request_id=request_id,
            api_key=api_key, timeout=timeout, stream=stream, model=model))
        if stream:
            await s.start()
            return s
        return await s.wait()

    def stream(self, prompt: Optional[_wire.Prompt] = None, **kwargs: Any) -> AsyncStream:
        """An AsyncStream (not awaited: `async for chunk in client.stream(...)`), sent on its first
        iteration. Keyword arguments as for generate."""
        kwargs["stream"] = True
        return AsyncStream(self, _requests.generate_request(
            self._ids, self.api_key, self.timeout, prompt, **kwargs))

    async def chat(self, messages: Sequence[Mapping[str, Any]], *,
                   tools: Optional[Sequence[Any]] = None, add_generation_prompt: bool = True,
                   chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                   sampling: Optional[SamplingParams] = None,
                   priority: Union[str, int] = "default", deadline_ms: int = 0,
                   request_id: Optional[str] = None, api_key: Optional[str] = None,
                   timeout: Optional[float] = None, stream: bool = False,
                   model: str = "") -> Union[GenerateResult, AsyncStream]:
        """As Client.chat: the assistant's turn of a conversation rendered by the model's chat
        template. stream=False: the GenerateResult. stream=True: an AsyncStream whose request
        is already sent."""
        s = AsyncStream(self, _requests.chat_request(
            self._ids, self.api_key, self.timeout, messages, tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs, sampling=sampling, priority=priority,
            deadline_ms=deadline_ms, request_id=request_id, api_key=api_key, timeout=timeout,
            stream=stream, model=model))
        if stream:
            await s.start()
            return s
        return await s.wait()

    async def cancel(self, request_id: str) -> bool:
        """Cancels a call of this client in flight: it raises Cancelled and the router frees the
        request's resources. False when no call with that id is in flight."""
        call = self._calls.pop(request_id, None)
        if call is None:
            return False
        call.events.put_nowait(errors.Cancelled("cancelled by the client", request_id=request_id))
        await self._send(_wire.cancel_frame(request_id))
        return True

    async def stats(self, timeout: Optional[float] = None,
                    api_key: Optional[str] = None) -> Stats:
        """As Client.stats: the router's view of the cluster (a router with tenants answers
        only to a key, by default the client's api_key)."""
        timeout = self.timeout if timeout is None else _wire.check_timeout(timeout)
        self._check_open("")
        self._ensure_reader()
        deadline = time.monotonic() + timeout
        answer: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self._stats_calls.append(answer)
        try:
            frame = _wire.stats_frame(self.api_key if api_key is None else api_key)
            await asyncio.wait_for(self._send(frame), timeout)
            # On timeout wait_for cancels `answer`, and the reader skips cancelled answers.
            s = await asyncio.wait_for(answer, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            answer.cancel()
            raise _wire.timeout_error("", "stats answer", timeout,
                                      self._problems.suffix()) from None
        if isinstance(s, errors.CarpoolError):
            raise s
        return _wire.stats_from(s)

    async def embed(self, inputs: _wire.EmbedInputs, *, normalize: bool = True,
                    pooling: str = "mean", priority: Union[str, int] = "default",
                    deadline_ms: int = 0, add_bos: bool = True,
                    request_id: Optional[str] = None, api_key: Optional[str] = None,
                    timeout: Optional[float] = None, model: str = "") -> EmbedResult:
        """As Client.embed: one embedding per input, in order."""
        req = _requests.embed_request(
            self._ids, self.api_key, self.timeout, inputs, normalize=normalize, pooling=pooling,
            priority=priority, deadline_ms=deadline_ms, add_bos=add_bos, request_id=request_id,
            api_key=api_key, timeout=timeout, model=model)
        return await self._one_shot(req, _requests.embed_answer)

    async def tokenize(self, text: Optional[Union[str, bytes]] = None, *, model: str = "",
                       add_special_tokens: Optional[bool] = None,
                       request_id: Optional[str] = None, api_key: Optional[str] = None,
                       timeout: Optional[float] = None,
                       messages: Optional[Sequence[Mapping[str, Any]]] = None,
                       tools: Optional[Sequence[Any]] = None,
                       add_generation_prompt: bool = True,
                       chat_template_kwargs: Optional[Mapping[str, Any]] = None
                       ) -> TokenizeResult:
        """As Client.tokenize: the token ids of `text`, or of `messages` as the model's chat
        template renders them, with the model's tokenizer."""
        req = _requests.tokenize_request(
            self._ids, self.api_key, self.timeout, text, model=model,
            add_special_tokens=add_special_tokens, request_id=request_id, api_key=api_key,
            timeout=timeout, messages=messages, tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs)
        return await self._one_shot(req, _requests.tokenize_answer)

    async def detokenize(self, token_ids: Sequence[int], *, model: str = "",
                         skip_special_tokens: bool = False, request_id: Optional[str] = None,
                         api_key: Optional[str] = None, timeout: Optional[float] = None) -> str:
        """As Client.detokenize: the text of `token_ids` with the model's tokenizer."""
        req = _requests.detokenize_request(
            self._ids, self.api_key, self.timeout, token_ids, model=model,
            skip_special_tokens=skip_special_tokens, request_id=request_id, api_key=api_key,
            timeout=timeout)
        return await self._one_shot(req, _requests.detokenize_answer)

    # ---- batch jobs: as Client's (docs/batch.md)

    async def upload_file(self, content: _batch.Content, filename: str = "batch.jsonl", *,
                          api_key: Optional[str] = None,
                          timeout: Optional[float] = None) -> FileObject:
        """As Client.upload_file."""
        reply = await self._batch_call("create_file", api_key, timeout, filename=filename,
                                       purpose="batch", content=_batch.jsonl(content))
        return _batch.file_from(_batch.reply_json(reply, "create_file"))

    async def get_file(self, file_id: str, *, api_key: Optional[str] = None,
                       timeout: Optional[float] = None) -> FileObject:
        reply = await self._batch_call("get_file", api_key, timeout, id=file_id)
        return _batch.file_from(_batch.reply_json(reply, "get_file"))

    async def file_content(self, file_id: str, *, api_key: Optional[str] = None,
                           timeout: Optional[float] = None) -> bytes:
        """As Client.file_content."""
        file = await self.get_file(file_id, api_key=api_key, timeout=timeout)
        too_large = _batch.too_large_for_client(file, self._max_message_bytes)
        if too_large is not None:
            raise too_large
        reply = await self._batch_call("file_content", api_key, timeout, id=file_id)
        return bytes(reply.content)

    async def delete_file(self, file_id: str, *, api_key: Optional[str] = None,
                          timeout: Optional[float] = None) -> None:
        await self._batch_call("delete_file", api_key, timeout, id=file_id)

    async def submit_batch(self, input_file_id: str, endpoint: str, *,
                           completion_window: str = "24h",
                           metadata: Optional[Mapping[str, str]] = None,
                           api_key: Optional[str] = None,
                           timeout: Optional[float] = None) -> Batch:
        """As Client.submit_batch."""
        reply = await self._batch_call(
            "create_batch", api_key, timeout, input_file_id=input_file_id, endpoint=endpoint,
            completion_window=completion_window, metadata_json=_batch.metadata_json(metadata))
        return _batch.batch_from(_batch.reply_json(reply, "create_batch"))

    async def submit_batch_file(self, content: _batch.Content, endpoint: Optional[str] = None,
                                *, filename: str = "batch.jsonl",
                                completion_window: str = "24h",
                                metadata: Optional[Mapping[str, str]] = None,
                                api_key: Optional[str] = None,
                                timeout: Optional[float] = None) -> Batch:
        """As Client.submit_batch_file."""
        data = _batch.jsonl(content)
        if endpoint is None:
            endpoint = _batch.first_line_url(data)
        file = await self.upload_file(data, filename, api_key=api_key, timeout=timeout)
        return await self.submit_batch(file.id, endpoint, completion_window=completion_window,
                                       metadata=metadata, api_key=api_key, timeout=timeout)

    async def get_batch(self, batch_id: str, *, api_key: Optional[str] = None,
                        timeout: Optional[float] = None) -> Batch:
        reply = await self._batch_call("get_batch", api_key, timeout, id=batch_id)
        return _batch.batch_from(_batch.reply_json(reply, "get_batch"))

    async def list_batches(self, after: str = "", limit: int = 0, *,
                           api_key: Optional[str] = None,
                           timeout: Optional[float] = None) -> BatchList:
        """As Client.list_batches."""
        reply = await self._batch_call("list_batches", api_key, timeout, after=after,
                                       limit=limit)
        return _batch.list_from(_batch.reply_json(reply, "list_batches"))

    async def cancel_batch(self, batch_id: str, *, api_key: Optional[str] = None,
                           timeout: Optional[float] = None) -> Batch:
        """As Client.cancel_batch."""
        reply = await self._batch_call("cancel_batch", api_key, timeout, id=batch_id)
        return _batch.batch_from(_batch.reply_json(reply, "cancel_batch"))

    async def wait_batch(self, batch_id: str, *, poll_interval: float = 1.0,
                         timeout: Optional[float] = None,
                         on_poll: Optional[Callable[[Batch], None]] = None,
                         api_key: Optional[str] = None) -> Batch:
        """As Client.wait_batch."""
        interval = _wire.check_timeout(poll_interval)
        end = None if timeout is None else time.monotonic() + _wire.check_timeout(timeout)
        while True:
            batch = await self.get_batch(batch_id, api_key=api_key)
            if on_poll is not None:
                on_poll(batch)
            if batch.finished:
                return batch
            if end is not None and time.monotonic() + interval >= end:
                raise _batch.wait_timeout(batch, timeout)
            await asyncio.sleep(interval)

    async def batch_results(self, batch_id: str, *, api_key: Optional[str] = None,
                            timeout: Optional[float] = None) -> BatchResults:
        """As Client.batch_results."""
        batch = await self.get_batch(batch_id, api_key=api_key, timeout=timeout)
        if not batch.finished:
            raise _batch.not_finished(batch)
        files = []
        for file_id in (batch.output_file_id, batch.error_file_id):
            files.append(await self.file_content(file_id, api_key=api_key, timeout=timeout)
                         if file_id else b"")
        return BatchResults(*files)

    async def _batch_call(self, op: str, api_key: Optional[str], timeout: Optional[float],
                          **fields: Any) -> Any:
        req = _batch.call_request(self._ids, self.api_key, self.timeout, op, api_key=api_key,
                                  timeout=timeout, **fields)
        # A call that may have changed the store is not sent to another router after a loss.
        return await self._one_shot(req, _batch.reply_answer,
                                    resend=op in _failover.READ_ONLY_BATCH_OPS)

    async def _one_shot(self, req: _requests.Request, answer: Any, resend: bool = True) -> Any:
        """Sends a one-shot call and waits for the answer `answer` finds in its events."""
        deadline = time.monotonic() + req.timeout
        call = await self._start(req.request_id, req.frame, deadline, req.timeout, resend)
        while True:
            try:
                event = await self._wait(call, deadline, req.timeout)
            except asyncio.CancelledError:  # the awaiting task was cancelled: so is the request
                self._cancel_nowait(req.request_id)
                raise
            result = answer(event)
            if result is not None:
                return result

    async def aclose(self) -> None:
        """Ends every call in flight with Cancelled (telling the router) and closes the socket.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        calls, self._calls = self._calls, {}
        for request_id, call in calls.items():
            call.events.put_nowait(errors.Cancelled("the client was closed",
                                                    request_id=request_id))
        if calls:  # tell the router, allowing the cancels ~200 ms to leave
            sends = [self._send_quietly(_wire.cancel_frame(rid)) for rid in calls]
            try:
                await asyncio.wait_for(asyncio.gather(*sends), 0.2)
            except asyncio.TimeoutError:
                pass
        while self._stats_calls:
            f = self._stats_calls.popleft()
            if not f.done():
                f.set_result(errors.Cancelled("the client was closed"))
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        close_monitor(self._sock, self._monitor)
        self._sock.close(linger=200)
        if self._own_context:
            self._context.term()

    close = aclose

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failover(self) -> bool:
        """Several routers: calls open when one is lost go to the next."""
        return len(self._urls) > 1

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ---- internals

    def _check_open(self, request_id: str) -> None:
        if self._closed:
            raise errors.Cancelled("the client is closed", request_id=request_id)
        if self._broken is not None:
            raise self._broken

    async def _start(self, request_id: str, frame: bytes, deadline: float, timeout: float,
                     resend: bool = True) -> _Call:
        """Sends `frame` as a new call. resend: with several routers, it may be sent to the
        next router when its router is lost (not for batch calls that change the store)."""
        self._check_open(request_id)
        if request_id in self._calls:
            raise errors.InvalidArgument(
                "request_id %r is already in flight on this client" % request_id,
                code="ALREADY_EXISTS", request_id=request_id)
        self._ensure_reader()
        call = _Call(request_id, _failover.seeded(frame, self.failover), resend)
        self._calls[request_id] = call
        # The socket of the router in use now: should a failover replace it before the frame
        # leaves, the failover sends the call to the next router itself.
        sock = self._sock
        try:
            await asyncio.wait_for(self._send(call.frame, sock),
                                   max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            self._forget(call)
            raise _wire.timeout_error(request_id, "room to send", timeout) from None
        except BaseException:
            self._forget(call)
            raise
        return call

    async def _wait(self, call: _Call, deadline: float, timeout: float) -> Any:
        events = call.events
        if not events.empty():
            return events.get_nowait()
        try:
            return await asyncio.wait_for(events.get(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            pass
        self._forget(call)
        raise _wire.timeout_error(call.request_id, "answer", timeout, self._problems.suffix())

    def _forget(self, call: _Call) -> None:
        """Drops a call (if still in flight) and tells the router to cancel it."""
        if self._calls.get(call.request_id) is call:
            del self._calls[call.request_id]
            self._cancel_frame_soon(call.request_id)

    def _cancel_nowait(self, request_id: str) -> None:
        """cancel() without waiting; on the client's loop only (elsewhere, e.g. in a finalizer,
        it does nothing and aclose() cancels the call)."""
        if not self._on_running_loop():
            return
        call = self._calls.pop(request_id, None)
        if call is not None:
            call.events.put_nowait(errors.Cancelled("cancelled", request_id=request_id))
            self._cancel_frame_soon(request_id)

    def _cancel_frame_soon(self, request_id: str) -> None:
        if self._closed or not self._on_running_loop():
            return
        self._in_background(self._send_quietly(_wire.cancel_frame(request_id)))

    def _in_background(self, coro: Any) -> None:
        f = asyncio.ensure_future(coro)
        self._background.add(f)
        f.add_done_callback(self._background.discard)

    @staticmethod
    def _on_running_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    async def _send_quietly(self, frame: bytes) -> None:
        """_send for best-effort messages (cancels): a failure is not worth an exception."""
        try:
            await self._send(frame)
        except errors.CarpoolError:
            pass

    async def _send(self, frame: bytes, sock: Optional["zmq.asyncio.Socket"] = None) -> None:
        """Sends `frame` on `sock` (default: the socket in use). A frame for a socket that a
        failover replaced is not sent (the failover sent its call to the next router)."""
        if sock is None:
            sock = self._sock
        elif sock is not self._sock:
            return
        try:
            await sock.send(frame)
        except zmq.ZMQError as e:
            if sock is not self._sock:
                return  # closed by a failover under the send
            raise errors.CarpoolError("cannot send to the router: %s" % e,
                                      code="UNAVAILABLE") from None
        except asyncio.CancelledError:
            # Closing a socket cancels the sends waiting on it: one closed by a failover is not
            # a cancel of this task (which, if also asked for, still propagates).
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)  # Python 3.11+
            if sock is not self._sock and not (cancelling is not None and cancelling()):
                return
            raise

    def _ensure_reader(self) -> None:
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            while True:
                # One socket at a time: a failover replaces it and its monitor.
                sock, monitor = self._sock, self._monitor
                poller = zmq.asyncio.Poller()
                poller.register(sock, zmq.POLLIN)
                if monitor is not None:
                    poller.register(monitor, zmq.POLLIN)
                while sock is self._sock:
                    events = dict(await poller.poll(self._poll_timeout_ms()))
                    # Answers that arrived before a disconnect are routed before calls are
                    # ended.
                    while True:
                        try:
                            frame = await sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._route(frame)
                    if monitor is not None and monitor in events:
                        await self._read_monitor()
                    if sock is self._sock and self._poll_timeout_ms() == 0:
                        self._router_lost("no connection to the router at %s within %g s "
                                          "(connect_timeout)" % (self._url,
                                                                 self._connect_timeout))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken socket or context: fail every call, never hang them
            self._fail_all(errors.InternalError("the client's reader failed: %r" % (e,)))

    def _poll_timeout_ms(self) -> Optional[int]:
        """None (no limit), or with several routers while the connection is not up, the ms
        until it counts as failed (connect_timeout)."""
        if not self.failover or self._watch.up or self._monitor is None:
            return None
        left = self._connecting_since + self._connect_timeout - time.monotonic()
        return max(0, int(left * 1000))

    async def _read_monitor(self) -> None:
        monitor = self._monitor
        while True:
            try:
                parts = await monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if self._watch.lost(parts):
                self._router_lost()
                if self.failover:
                    return  # the monitor was replaced

    def _switch_router(self) -> None:
        """Closes the connection to the current router and connects to the next."""
        close_monitor(self._sock, self._monitor)
        self._sock.close(linger=0)  # what it still holds was for the lost router
        self._url = _failover.next_url(self._urls, self._url)
        self._sock = self._context.socket(zmq.DEALER)
        self._monitor = configure_socket(self._sock, self._url, self._options)
        self._connecting_since = time.monotonic()
        self._watch = ConnectionWatch()

    def _router_lost(self, why: str = "") -> None:
        """Ends every call and stats query in flight with RouterLost; the client goes on. With
        several routers it first connects to the next, and the calls that may go there are
        sent again instead, as Client does: a stream resuming after the tokens it received
        (resume_tokens), any other as it was, at most once per router each."""
        lost = self._url
        why = _failover.lost_why(lost, why)
        if self.failover:
            self._switch_router()
            why += "; failing over to %s" % self._url
        ended = []
        for request_id, call in list(self._calls.items()):
            frame = call.failover_frame(len(self._urls))
            if frame is None:
                del self._calls[request_id]
                ended.append(call)
            else:
                self._in_background(self._resend(call, frame, self._sock))
        for call in ended:
            call.events.put_nowait(router_lost_error(lost, call.request_id, why))
        while self._stats_calls:
            f = self._stats_calls.popleft()
            if not f.done():
                f.set_result(router_lost_error(lost, "", why))

    async def _resend(self, call: _Call, frame: bytes, sock: "zmq.asyncio.Socket") -> None:
        """Sends an open call to the router that `sock` connects to after a failover (nothing
        when the call ended meanwhile, or `sock` was replaced: that failover sends it)."""
        if self._calls.get(call.request_id) is not call:
            return
        try:
            await self._send(frame, sock)
        except errors.CarpoolError as e:
            if self._calls.get(call.request_id) is call:
                del self._calls[call.request_id]
                call.events.put_nowait(e)

    def _route(self, frame: bytes) -> None:
        try:
            msg = _wire.parse_server(frame)
        except ValueError as e:
            self._problems.note(str(e))
            return
        kind = msg.WhichOneof("body")
        if kind == "stats":
            while self._stats_calls:
                f = self._stats_calls.popleft()
                if not f.done():
                    f.set_result(msg.stats)
                    return
            return
        request_id = _wire.request_id_of(msg)
        if kind == "error" and not request_id:  # a refusal naming no request answers a stats
            while self._stats_calls:              # query (one without a key, say)
                f = self._stats_calls.popleft()
                if not f.done():
                    f.set_result(errors.from_error(msg.error))
                    return
            self._problems.note_unmatched(msg)
            return
        call = self._calls.get(request_id)
        if call is not None:
            if kind != "chunk":
                del self._calls[request_id]
            if self.failover:
                call.received(kind, msg)
            call.events.put_nowait(msg)
        else:
            self._problems.note_unmatched(msg)

    def _fail_all(self, error: errors.CarpoolError) -> None:
        self._broken = error
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.events.put_nowait(error)
        while self._stats_calls:
            f = self._stats_calls.popleft()
            if not f.done():
                f.set_result(error)

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._closed = True
                if self._reader is not None:
                    self._reader.cancel()
                close_monitor(self._sock, self._monitor)
                self._sock.close(linger=0)
        except Exception:
            pass
