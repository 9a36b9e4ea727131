"""AsyncClient against the in-test fake router. Each test runs its own event loop with a bound."""

import asyncio
import time

import pytest

import carpool
from fake_router import FakeRouter, chunk, error, keyed_stats_handler


def run(coro, limit=20):
    return asyncio.run(asyncio.wait_for(coro, limit))


def silent(router, client, msg):
    pass


def test_generate(fake_router):
    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            return await client.generate("hi!", sampling=carpool.SamplingParams(max_tokens=2))

    result = run(main())
    assert result.text == "hi"
    assert result.token_ids == [104, 105]
    assert result.finish_reason == "length"


def test_stream_as_async_iterator(fake_router):
    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            stream = client.stream("abc")
            assert fake_router.messages("generate") == []  # sent on the first iteration
            chunks = [c async for c in stream]
            sent = await client.generate([7, 8], stream=True)  # already sent
            rest = await sent.wait()
            return chunks, stream.result, rest

    chunks, result, rest = run(main())
    assert [c.token_ids for c in chunks] == [[97], [98], [99]]
    assert "".join(c.text for c in chunks) == result.text == "abc"
    assert result.usage.prompt_tokens == 3
    assert rest.token_ids == [7, 8]
    assert all(m.generate.stream for m in fake_router.messages("generate"))


def test_concurrent_calls_on_one_client(fake_router):
    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            return await asyncio.gather(*(client.generate([i, i + 1]) for i in range(20)))

    results = run(main())
    assert [r.token_ids for r in results] == [[i, i + 1] for i in range(20)]


@pytest.mark.parametrize("reason,code,cls", [
    ("queue_full", "UNAVAILABLE", carpool.QueueFull),
    ("prompt_too_long", "INVALID_ARGUMENT", carpool.PromptTooLong),
    ("unauthenticated", "UNAUTHENTICATED", carpool.Unauthenticated),
    ("draining", "UNAVAILABLE", carpool.Draining),
])
def test_typed_errors(reason, code, cls):
    def handler(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            rid = msg.generate.request_id
            router.send(client, chunk(rid, 0, [1]))
            router.send(client, error(rid, code, reason, "no", retry_after_ms=50))

    router = FakeRouter(handler)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            with pytest.raises(cls) as info:
                await client.generate("x")
            assert info.value.retry_after_ms == 50
            got = []
            with pytest.raises(cls):
                async for c in client.stream("x"):
                    got.append(c.token_ids)
            assert got == [[1]]

    try:
        run(main())
    finally:
        router.stop()


def test_timeout_cancels_at_the_router():
    router = FakeRouter(silent)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            start = time.monotonic()
            with pytest.raises(carpool.Timeout):
                await client.generate("x", timeout=0.3, request_id="slow")
            assert 0.25 <= time.monotonic() - start < 3
            with pytest.raises(carpool.Timeout):
                async for _ in client.stream("x", timeout=0.2):
                    pass
            with pytest.raises(carpool.Timeout):
                await client.stats(timeout=0.2)
            await asyncio.sleep(0.1)  # let the cancels leave

    try:
        run(main())
        assert len(router.wait_for("cancel", 2)) == 2
        assert router.messages("cancel")[0].cancel.request_id == "slow"
    finally:
        router.stop()


def test_cancel_from_another_task():
    def one_chunk(router, client, msg):
        if msg.WhichOneof("body") == "generate":
            router.send(client, chunk(msg.generate.request_id, 0, [4]))

    router = FakeRouter(one_chunk)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            stream = await client.generate("x", stream=True, request_id="c1")
            assert (await stream.__anext__()).token_ids == [4]

            async def later():
                await asyncio.sleep(0.1)
                return await client.cancel("c1")

            canceller = asyncio.ensure_future(later())
            with pytest.raises(carpool.Cancelled):
                await stream.__anext__()
            assert await canceller
            assert not await client.cancel("c1")
            assert stream.result.token_ids == [4]

    try:
        run(main())
        assert [m.cancel.request_id for m in router.wait_for("cancel")] == ["c1"]
    finally:
        router.stop()


def test_cancelling_the_awaiting_task_cancels_the_request():
    router = FakeRouter(silent)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            task = asyncio.ensure_future(client.generate("x", request_id="t1"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.1)
            # The id is free again.
            with pytest.raises(carpool.Timeout):
                await client.generate("x", request_id="t1", timeout=0.1)

    try:
        run(main())
        assert "t1" in [m.cancel.request_id for m in router.wait_for("cancel")]
    finally:
        router.stop()


def test_stats(fake_router):
    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            return await asyncio.gather(client.stats(), client.stats())

    for stats in run(main()):
        assert stats.workers[0].worker_id == "w1"
        assert stats.rejections_by_reason == {"queue_full": 1}


def test_stats_send_the_key_and_a_refusal_ends_them_at_once():
    router = FakeRouter(keyed_stats_handler)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            with pytest.raises(carpool.Unauthenticated):
                await client.stats()
            by_arg = await client.stats(api_key="admin")
        async with carpool.AsyncClient(router.url, timeout=10, api_key="admin") as client:
            return by_arg, await client.stats()

    try:
        for stats in run(main()):
            assert stats.workers[0].worker_id == "w1"
        assert [m.stats.api_key for m in router.messages("stats")] == ["", "admin", "admin"]
    finally:
        router.stop()


def test_close_cancels_calls_in_flight():
    router = FakeRouter(silent)

    async def main():
        client = carpool.AsyncClient(router.url, timeout=10)
        stream = await client.generate("x", stream=True, request_id="open")
        task = asyncio.ensure_future(client.generate("y", request_id="waiting"))
        await asyncio.sleep(0.1)
        await client.aclose()
        await client.aclose()  # idempotent
        with pytest.raises(carpool.Cancelled):
            await stream.__anext__()
        with pytest.raises(carpool.Cancelled):
            await task
        with pytest.raises(carpool.Cancelled):
            await client.generate("z")

    try:
        run(main())
        cancels = router.wait_for("cancel", 2)
        assert sorted(m.cancel.request_id for m in cancels) == ["open", "waiting"]
    finally:
        router.stop()


def test_async_embed(fake_router):
    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            one, two = await asyncio.gather(client.embed(["ab", [5, 6, 7]]),
                                            client.embed("xyz", pooling="last"))
            assert one.embeddings == [[2.0, ord("a"), 1.0, 0.0], [3.0, 5.0, 1.0, 0.0]]
            assert one.usage.prompt_tokens == 5
            assert two.embeddings == [[3.0, ord("x"), 1.0, 1.0]]
            with pytest.raises(carpool.InvalidArgument):
                await client.embed(["x"], pooling="max")

    run(main())


def test_async_embed_timeout_cancels_at_the_router():
    router = FakeRouter(lambda *args: None)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            with pytest.raises(carpool.Timeout):
                await client.embed(["x"], timeout=0.3, request_id="slow")

    try:
        run(main())
        assert [m.cancel.request_id for m in router.wait_for("cancel", 1)] == ["slow"]
    finally:
        router.stop()


def test_async_tokenize_detokenize_and_text_options(fake_router):
    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            t, text = await asyncio.gather(
                client.tokenize("ab", add_special_tokens=False, model="m"),
                client.detokenize([256, 120], skip_special_tokens=True))
            plain = await client.detokenize([256, 120])
            result = await client.generate(
                "hi", model="m",
                sampling=carpool.SamplingParams(stop=["x"], include_stop_str_in_output=True))
            return t, text, plain, result

    t, text, plain, result = run(main())
    assert t.token_ids == [97, 98] and t.max_model_len == 2048
    assert text == "x"
    assert plain == "<|256|>x"
    assert result.stop_string == ""
    assert fake_router.messages("tokenize")[0].tokenize.model == "m"
    g = fake_router.messages("generate")[0].generate
    assert g.model == "m" and list(g.stop) == ["x"] and g.include_stop_str_in_output


def test_async_tokenize_timeout_cancels_at_the_router():
    router = FakeRouter(silent)
    try:
        async def main():
            async with carpool.AsyncClient(router.url, timeout=10) as client:
                with pytest.raises(carpool.Timeout):
                    await client.tokenize("x", timeout=0.3, request_id="slow")
        run(main())
        assert [m.cancel.request_id for m in router.wait_for("cancel")] == ["slow"]
    finally:
        router.stop()


def test_async_chat_and_tokenize_messages(fake_router):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "ü"}]
    long = carpool.SamplingParams(max_tokens=500)

    async def main():
        async with carpool.AsyncClient(fake_router.url, timeout=10) as client:
            whole = await client.chat(messages, chat_template_kwargs={"x": True}, sampling=long)
            stream = await client.chat(messages, stream=True, add_generation_prompt=False,
                                       sampling=long)
            chunks = [c async for c in stream]
            ids = await client.tokenize(messages=messages, tools=[])
            with pytest.raises(TypeError):
                await client.chat("not a list")
            return whole, chunks, stream.result, ids

    whole, chunks, streamed, ids = run(main())
    want = '[{"role": "system", "content": "s"}, {"role": "user", "content": "ü"}]'
    assert whole.text == streamed.text == "".join(c.text for c in chunks) == want
    first, second = [m.generate for m in fake_router.messages("generate")]
    assert first.chat.chat_template_kwargs_json == '{"x": true}' and not first.stream
    assert second.stream and not second.chat.add_generation_prompt
    assert ids.token_ids == list(want.encode())
    t = fake_router.messages("tokenize")[0].tokenize
    assert t.chat.tools_json == "[]" and not t.HasField("add_special_tokens")
