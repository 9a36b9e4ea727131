"""Two routers with AsyncClient (docs/cluster.md, "Two routers"): the same contract as Client's
(test_two_routers.py). Every call open when its router is lost goes to the other one, a stream
resuming after the tokens it received (resume_tokens), any other call as it was, but not a batch
call that changes the store; a router down from the start is skipped. Against fake routers, and
against real carpool-router / carpool-worker processes (kill -9 of the active router under
seeded streams and queued blocking calls; skipped when the binaries are not built). Each test
runs its own event loop with a bound."""

import asyncio
import signal
import time

import pytest

import carpool
from fake_router import FakeRouter
from test_two_routers import (SENT_BEFORE_LOSS, generates, needs_binaries, pair_of_routers,
                              partly, resuming, wait_for_worker)


def run(coro, limit=30):
    return asyncio.run(asyncio.wait_for(coro, limit))


def test_streams_continue_on_the_other_router_after_the_tokens_received():
    first, second = FakeRouter(partly), FakeRouter(resuming)
    prompts = {"s%d" % i: list(range(10, 20 + i)) for i in range(6)}

    async def main():
        async with carpool.AsyncClient([first.url, second.url], timeout=10) as client:
            streams = {rid: client.stream(ids, request_id=rid,
                                          sampling=carpool.SamplingParams(max_tokens=len(ids)))
                       for rid, ids in prompts.items()}
            for s in streams.values():
                for _ in range(SENT_BEFORE_LOSS):
                    await s.__anext__()
            first.stop()  # as kill -9: the connection drops
            out = {}
            for rid, s in streams.items():
                out[rid] = ([c.index async for c in s], [t.id for t in s.result.tokens])
            return out

    try:
        out = run(main())
        for rid, (indexes, tokens) in out.items():
            assert indexes == list(range(SENT_BEFORE_LOSS, len(prompts[rid])))
            assert tokens == prompts[rid]  # no gap, no duplicate
            [resent] = generates(second, rid)
            assert list(resent.resume_tokens) == prompts[rid][:SENT_BEFORE_LOSS]
            [original] = generates(first, rid)
            # The seed was drawn by the client (none given): the same at both routers.
            assert original.sampling.HasField("seed")
            assert resent.sampling.seed == original.sampling.seed
    finally:
        second.stop()


def test_a_call_not_answered_yet_is_sent_again_as_it_was():
    first, second = FakeRouter(partly), FakeRouter(resuming)  # the first answers nothing

    async def main():
        async with carpool.AsyncClient("%s, %s" % (first.url, second.url),
                                       timeout=10) as client:
            sampling = carpool.SamplingParams(max_tokens=4, seed=42)
            task = asyncio.ensure_future(
                client.generate([5, 6, 7, 8], request_id="g1", sampling=sampling))
            assert await asyncio.to_thread(first.wait_for, "generate")
            first.stop()
            return await task

    try:
        result = run(main())
        assert [tok.id for tok in result.tokens] == [5, 6, 7, 8]
        [resent] = generates(second, "g1")
        assert not resent.resume_tokens
        assert resent.sampling.seed == 42  # the caller's seed is kept
    finally:
        second.stop()


def test_a_call_cancelled_before_the_loss_is_not_sent_again():
    first, second = FakeRouter(partly), FakeRouter(resuming)

    async def main():
        async with carpool.AsyncClient([first.url, second.url], timeout=10) as client:
            sampling = carpool.SamplingParams(max_tokens=10)
            gone = client.stream(list(range(10)), request_id="gone", sampling=sampling)
            kept = client.stream(list(range(10)), request_id="kept", sampling=sampling)
            await gone.__anext__()
            await kept.__anext__()
            assert await gone.cancel()
            first.stop()
            rest = [c.index async for c in kept]
            with pytest.raises(carpool.Cancelled):
                await gone.wait()
            await asyncio.sleep(0.2)
            return rest

    try:
        rest = run(main())
        assert rest == list(range(1, 10))  # no gap, no duplicate
        assert not generates(second, "gone")
        assert len(generates(second, "kept")) == 1
    finally:
        second.stop()


def test_a_router_down_from_the_start_is_skipped_after_connect_timeout():
    probe = FakeRouter()
    down = probe.url
    probe.stop()
    up = FakeRouter(resuming)

    async def main():
        async with carpool.AsyncClient([down, up.url], timeout=10,
                                       connect_timeout=0.3) as client:
            start = time.monotonic()
            r = await client.generate([1, 2, 3], sampling=carpool.SamplingParams(max_tokens=3))
            return r, time.monotonic() - start

    try:
        r, took = run(main())
        assert [t.id for t in r.tokens] == [1, 2, 3]
        assert took >= 0.25
    finally:
        up.stop()


def test_a_batch_call_that_changes_the_store_is_not_sent_again():
    first, second = FakeRouter(partly), FakeRouter(resuming)

    async def main():
        async with carpool.AsyncClient([first.url, second.url], timeout=10) as client:
            task = asyncio.ensure_future(client.upload_file(b'{"custom_id": "a"}\n'))
            assert await asyncio.to_thread(first.wait_for, "batch")
            first.stop()
            with pytest.raises(carpool.RouterLost) as e:
                await task
            await asyncio.sleep(0.2)
            return e.value

    try:
        e = run(main())
        assert "failing over to %s" % second.url in str(e)
        assert not second.messages("batch")
    finally:
        second.stop()


def test_both_routers_lost_raises_router_lost():
    first, second = FakeRouter(partly), FakeRouter(partly)

    async def main():
        async with carpool.AsyncClient([first.url, second.url], timeout=10,
                                       connect_timeout=0.3) as client:
            s = client.stream(list(range(10)), sampling=carpool.SamplingParams(max_tokens=10))
            for _ in range(SENT_BEFORE_LOSS):
                await s.__anext__()
            first.stop()
            assert await asyncio.to_thread(second.wait_for, "generate")
            second.stop()
            with pytest.raises(carpool.RouterLost):
                async for _ in s:
                    pass

    run(main())


def test_one_router_still_raises_router_lost():
    router = FakeRouter(partly)

    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            s = client.stream(list(range(10)), sampling=carpool.SamplingParams(max_tokens=10))
            await s.__anext__()
            router.stop()
            with pytest.raises(carpool.RouterLost) as e:
                async for _ in s:
                    pass
            return e.value

    e = run(main())
    assert "failing over" not in str(e)
    [sent] = router.messages("generate")
    assert not sent.generate.sampling.HasField("seed")  # one router: the frame as built


def test_an_empty_endpoint_is_invalid():
    with pytest.raises(carpool.InvalidArgument, match="empty endpoint"):
        carpool.AsyncClient("tcp://127.0.0.1:1,")
    with pytest.raises(carpool.InvalidArgument, match="empty endpoint"):
        carpool.AsyncClient([])
    with pytest.raises(ValueError, match="connect_timeout"):
        carpool.AsyncClient(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], connect_timeout=0)


# ---- real processes

STREAMS = 16
BLOCKING = 2
MAX_TOKENS = 400
SEQS = 8  # the worker runs 8 sequences at once: the other requests wait at the router


async def run_calls(client, prompts, on_token=None, done=None):
    """Streams the first STREAMS prompts and sends the rest as blocking generates, all at once
    (the blocking ones last); returns {request_id: (token ids, chunk indexes in order)}. Adds
    each call's request_id to `done` when it ends."""
    done = set() if done is None else done
    def sampling(seed):
        return carpool.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95,
                                      seed=seed, ignore_eos=True)

    async def stream(rid, ids, seed):
        tokens, in_order = [], True
        async for c in client.stream(ids, request_id=rid, sampling=sampling(seed)):
            in_order &= c.index == len(tokens)
            tokens.extend(t.id for t in c.tokens)
            if on_token:
                on_token()
        done.add(rid)
        return rid, (tokens, in_order)

    async def blocking(rid, ids, seed):
        r = await client.generate(ids, request_id=rid, sampling=sampling(seed))
        done.add(rid)
        return rid, ([t.id for t in r.tokens], True)

    calls = [(stream if i < STREAMS else blocking)("p%d" % i, ids, 500 + i)
             for i, ids in enumerate(prompts)]
    return dict(await asyncio.wait_for(asyncio.gather(*calls), 90))


@needs_binaries
def test_kill_nine_of_the_active_router_streams_equal_the_no_fault_run(tmp_path):
    prompts = [[256] + [(7 * i + j) % 256 for j in range(4 + i)]
               for i in range(STREAMS + BLOCKING)]
    with pair_of_routers(tmp_path, "--max-num-seqs", str(SEQS)) as (frontends, routers):
        wait_for_worker(frontends[0])
        killed_at, done = [], set()

        async def main():
            async with carpool.AsyncClient(frontends, timeout=60) as client:
                no_fault = await run_calls(client, prompts)  # both routers up: the first serves
                seen = [0]

                def count():
                    seen[0] += 1
                    if seen[0] >= STREAMS * MAX_TOKENS // 3 and not killed_at:
                        killed_at.append(set(done))  # a third of the way through
                        routers[0].send_signal(signal.SIGKILL)

                faulted = await run_calls(client, prompts, count, done)
                # The client is on the standby now: every call open at the kill went there.
                return no_fault, faulted, await client.stats(timeout=10)

        no_fault, faulted, standby = run(main(), limit=200)
        assert routers[0].wait(timeout=10) == -signal.SIGKILL
    assert killed_at, "the run ended before the kill"
    open_at_kill = set(faulted) - killed_at[0]
    blocking = {"p%d" % i for i in range(STREAMS, STREAMS + BLOCKING)}
    assert blocking <= open_at_kill  # queued behind SEQS sequences when the router died
    assert standby.requests_total == len(open_at_kill)  # each sent there once
    assert len(faulted) == STREAMS + BLOCKING
    for rid, (tokens, in_order) in faulted.items():
        assert in_order, "%s: a gap or a duplicate" % rid
        assert len(tokens) == MAX_TOKENS, rid
        assert tokens == no_fault[rid][0], rid
