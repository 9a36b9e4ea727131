"""Batch jobs through Client and AsyncClient against the fake router's in-memory batch store."""

import asyncio
import json

import pytest

import carpool
from carpool import carpool_pb2 as pb
from fake_batch_store import FakeBatchStore
from fake_router import FakeRouter


def line(custom_id, url="/v1/chat/completions"):
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


def jsonl(*lines):
    return "".join(json.dumps(x) + "\n" for x in lines)


@pytest.fixture
def store():
    return FakeBatchStore()


@pytest.fixture
def router(store):
    r = FakeRouter(store.handler)
    yield r
    r.stop()


def batch_calls(router):
    return [m.batch for m in router.messages("batch")]


def test_upload_get_content_delete(router):
    with carpool.Client(router.url, timeout=10, api_key="key-1") as client:
        content = jsonl(line("a"), line("b"))
        f = client.upload_file(content, "in.jsonl")
        assert f.id.startswith("file-")
        assert (f.bytes, f.filename, f.purpose) == (len(content), "in.jsonl", "batch")
        assert f.created_at > 0
        sent = batch_calls(router)[0]
        assert sent.op == pb.BatchCall.CREATE_FILE
        assert sent.purpose == "batch"
        assert sent.content == content.encode()
        assert sent.api_key == "key-1"
        assert client.get_file(f.id, api_key="key-2").bytes == f.bytes
        assert batch_calls(router)[-1].api_key == "key-2"
        assert client.file_content(f.id) == content.encode()
        client.delete_file(f.id)
        with pytest.raises(carpool.NotFound) as info:
            client.get_file(f.id)
        assert info.value.reason == "not_found"
        assert f.id in info.value.message


def test_upload_takes_a_list_of_requests_as_jsonl(router):
    with carpool.Client(router.url, timeout=10) as client:
        client.upload_file([line("a"), line("b")])
        sent = batch_calls(router)[0].content.decode().splitlines()
        assert [json.loads(x)["custom_id"] for x in sent] == ["a", "b"]
        with pytest.raises(TypeError):
            client.upload_file([line("a"), "not a dict"])
        with pytest.raises(TypeError):
            client.upload_file({"custom_id": "a"})
        assert len(batch_calls(router)) == 1  # refused before sending


def test_submit_batch_file_takes_the_endpoint_from_the_first_line(router, store):
    with carpool.Client(router.url, timeout=10) as client:
        b = client.submit_batch_file([line("a", "/v1/embeddings"), line("b", "/v1/embeddings")],
                                     completion_window="2h", metadata={"run": "7"})
        assert b.id.startswith("batch_")
        assert (b.status, b.endpoint, b.completion_window) == ("in_progress", "/v1/embeddings",
                                                               "2h")
        assert not b.finished
        assert b.request_counts == carpool.BatchRequestCounts(2, 0, 0)
        assert b.metadata == {"run": "7"}
        assert b.expires_at > b.created_at > 0
        assert b.completed_at == 0 and b.output_file_id == ""
        create = batch_calls(router)[1]
        assert create.op == pb.BatchCall.CREATE_BATCH
        assert (create.endpoint, create.completion_window) == ("/v1/embeddings", "2h")
        assert json.loads(create.metadata_json) == {"run": "7"}
        assert store.files[create.input_file_id]["content"].count(b"\n") == 2
        with pytest.raises(carpool.InvalidArgument) as info:
            client.submit_batch_file("not json\n")
        assert "first line" in info.value.message
        assert len(batch_calls(router)) == 2


def test_wait_then_results_hold_both_files(router):
    with carpool.Client(router.url, timeout=10) as client:
        b = client.submit_batch_file([line("a"), line("bad-1"), line("c")])
        with pytest.raises(carpool.FailedPrecondition) as info:
            client.batch_results(b.id)  # polls once: one request answered
        assert "in_progress" in info.value.message
        seen = []
        done = client.wait_batch(b.id, poll_interval=0.005,
                                 on_poll=lambda x: seen.append(
                                     x.request_counts.completed + x.request_counts.failed))
        assert done.status == "completed" and done.finished
        assert done.request_counts == carpool.BatchRequestCounts(3, 2, 1)
        assert seen == [2, 3, 3]
        results = client.batch_results(b.id)
        assert [x["custom_id"] for x in results.output] == ["a", "c"]
        assert [x["custom_id"] for x in results.errors] == ["bad-1"]
        assert results.output[0]["response"]["status_code"] == 200


def test_wait_batch_times_out(router, store):
    with carpool.Client(router.url, timeout=10) as client:
        b = client.submit_batch_file([line("a")])
        store.set_status(b.id, "validating")
        with pytest.raises(carpool.Timeout) as info:
            client.wait_batch(b.id, poll_interval=0.02, timeout=0.2)
        assert "validating" in info.value.message


def test_failed_validation_lists_every_bad_line(router):
    with carpool.Client(router.url, timeout=10) as client:
        b = client.submit_batch_file(jsonl(line("a")) + "{oops\n" + jsonl(line("b")) + "no\n",
                                     "/v1/chat/completions")
        assert b.status == "failed" and b.finished
        assert [(e.code, e.line) for e in b.errors] == [("invalid_json", 2), ("invalid_json", 4)]
        assert client.batch_results(b.id) == carpool.BatchResults(b"", b"")


def test_cancel_list_and_errors(router):
    with carpool.Client(router.url, timeout=10) as client:
        ids = [client.submit_batch_file([line("a")]).id for _ in range(3)]
        assert client.cancel_batch(ids[0]).status == "cancelling"
        assert client.wait_batch(ids[0], poll_interval=0.005).status == "cancelled"
        with pytest.raises(carpool.FailedPrecondition):
            client.cancel_batch(ids[0])
        page = client.list_batches(limit=2)
        assert [b.id for b in page.data] == [ids[2], ids[1]]
        assert page.has_more
        page = client.list_batches(after=page.data[-1].id)
        assert [b.id for b in page.data] == [ids[0]] and not page.has_more
        assert batch_calls(router)[-1].after == ids[1]
        with pytest.raises(carpool.NotFound):
            client.get_batch("batch_nope")


def test_a_file_too_large_for_the_client_is_refused_before_it_is_sent(router):
    with carpool.Client(router.url, timeout=10, max_message_bytes=256 << 10) as client:
        f = client.upload_file(b"x" * (300 << 10))
        with pytest.raises(carpool.ResourceExhausted) as info:
            client.file_content(f.id)
        assert "max_message_bytes" in info.value.message
        assert all(c.op != pb.BatchCall.FILE_CONTENT for c in batch_calls(router))
        assert client.get_file(f.id).bytes == 300 << 10  # the connection is still good


def test_router_errors_map_to_their_classes(router):
    def refuse(r, client, msg):
        code = {"b1": "UNAUTHENTICATED", "b2": "OUT_OF_RANGE", "b3": "RESOURCE_EXHAUSTED",
                "b4": "FAILED_PRECONDITION"}[msg.batch.id]
        r.send(client, pb.ServerMessage(protocol_version=1, error=pb.Error(
            request_id=msg.batch.request_id, code=code, reason=code.lower(), message="no")))

    refusing = FakeRouter(refuse)
    try:
        with carpool.Client(refusing.url, timeout=10) as client:
            for batch_id, cls in [("b1", carpool.Unauthenticated), ("b2", carpool.OutOfRange),
                                  ("b3", carpool.ResourceExhausted),
                                  ("b4", carpool.FailedPrecondition)]:
                with pytest.raises(cls):
                    client.get_batch(batch_id)
    finally:
        refusing.stop()


def test_async_client_runs_a_batch(router):
    async def main():
        async with carpool.AsyncClient(router.url, timeout=10) as client:
            b = await client.submit_batch_file([line("a"), line("bad-b")], metadata={"k": "v"})
            done = await client.wait_batch(b.id, poll_interval=0.005)
            results = await client.batch_results(b.id)
            page = await client.list_batches()
            f = await client.get_file(done.output_file_id)
            with pytest.raises(carpool.NotFound):
                await client.cancel_batch("batch_nope")
            await client.delete_file(b.input_file_id)
            return b, done, results, page, f

    b, done, results, page, f = asyncio.run(asyncio.wait_for(main(), 20))
    assert b.metadata == {"k": "v"}
    assert done.status == "completed"
    assert done.request_counts == carpool.BatchRequestCounts(2, 1, 1)
    assert [x["custom_id"] for x in results.output] == ["a"]
    assert [x["custom_id"] for x in results.errors] == ["bad-b"]
    assert [x.id for x in page.data] == [b.id]
    assert f.purpose == "batch_output"


def test_stats_carry_the_batch_lane():
    def stats(r, client, msg):
        m = pb.ServerMessage(protocol_version=1)
        m.stats.batch_lane_queued, m.stats.batch_lane_inflight = 40, 8
        m.stats.batch_max_queued, m.stats.batch_max_inflight = 1000, 16
        m.stats.batches_by_status["in_progress"] = 2
        m.stats.batch_requests_pending = 12345
        r.send(client, m)

    router = FakeRouter(stats)
    try:
        with carpool.Client(router.url, timeout=10) as client:
            s = client.stats()
    finally:
        router.stop()
    assert (s.batch_lane_queued, s.batch_lane_inflight) == (40, 8)
    assert (s.batch_max_queued, s.batch_max_inflight) == (1000, 16)
    assert s.batches_by_status == {"in_progress": 2}
    assert s.batch_requests_pending == 12345
