"""A batch's ends other than completed, against a real carpool-router (issue 16): cancelled while
it runs, and expired at the end of a short completion_window (carpool takes "Ns" durations). Both
keep what finished in the output file and list every request that did not run in the error file
(batch_cancelled, batch_expired): each custom_id appears once across the two; also when the
router is killed after the cancel, or is down when the window ends. And what a router stopped
cleanly leaves in its --state-dir (finished batches, their files) is served by the next one, and
/metrics counts its batches by status.

The batch lane is one request wide with 64 tokens each, so a 2,000-line batch runs for many
seconds on synthetic:tiny (130 to 210 requests a second on the 2-core VM) and the cancel or the
window's end lands well inside it."""

import re
import time

import pytest

from harness import BUILT, MODEL, Cluster, jsonl, request_line
from processes import stop

pytestmark = pytest.mark.skipif(not BUILT, reason="carpool binaries not built")

LINES = 2000
URL = "/v1/completions"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("lifecycle"),
                router_args=["--batch-max-in-flight", "1", "--batch-max-queued", "1"])
    try:
        c.add_worker(MODEL)
        yield c
    finally:
        c.close()


def batch_file(prefix):
    return jsonl([request_line("%s-%d" % (prefix, i),
                               {"model": MODEL, "prompt": "Request %d:" % i, "temperature": 0,
                                "max_tokens": 64, "ignore_eos": True}, url=URL)
                  for i in range(LINES)])


def split_results(c, b, prefix, code):
    """Asserts that the output and error files of an ended batch cover every custom_id once: the
    output holds the answers (as many as request_counts.completed), the error file `code` for
    every other line. The number answered."""
    out = c.content_lines(b["output_file_id"]) if b["output_file_id"] else []
    err = c.content_lines(b["error_file_id"])
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    assert all(e["response"] is None and e["error"]["code"] == code and e["error"]["message"]
               for e in err), err[:3]
    ids = [o["custom_id"] for o in out + err]
    assert len(ids) == len(set(ids)), "a custom_id listed twice"
    assert sorted(ids) == sorted("%s-%d" % (prefix, i) for i in range(LINES))
    counts = b["request_counts"]
    assert counts["total"] == LINES and counts["completed"] == len(out), b
    return len(out)


def test_cancel_a_running_batch(cluster):
    b = cluster.submit(batch_file("cancel"), URL)
    running = cluster.wait_batch(b["id"], 60, until=("in_progress",))
    deadline = time.monotonic() + 60
    while running["request_counts"]["completed"] < 5:
        assert time.monotonic() < deadline, running
        time.sleep(0.02)
        running = cluster.get("/v1/batches/" + b["id"]).json()
    r = cluster.post("/v1/batches/%s/cancel" % b["id"])
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("cancelling", "cancelled"), r.text
    # Cancelling again changes nothing.
    assert cluster.post("/v1/batches/%s/cancel" % b["id"]).status_code == 200
    ended = cluster.wait_batch(b["id"], 60)
    assert ended["status"] == "cancelled", ended
    assert ended["cancelling_at"] and ended["cancelled_at"] >= ended["cancelling_at"], ended
    answered = split_results(cluster, ended, "cancel", "batch_cancelled")
    print("cancelled with %d of %d answered" % (answered, LINES))
    assert 5 <= answered < LINES


def test_a_batch_expires_at_the_end_of_its_window(cluster):
    b = cluster.submit(batch_file("expire"), URL, window="2s")
    assert b["completion_window"] == "2s"
    ended = cluster.wait_batch(b["id"], 60)
    assert ended["status"] == "expired", ended
    # Timestamps are whole seconds; the runner notices the end of the window soon after it.
    assert 2 <= ended["expired_at"] - ended["created_at"] <= 5, ended
    answered = split_results(cluster, ended, "expire", "batch_expired")
    print("expired with %d of %d answered" % (answered, LINES))
    assert 0 < answered < LINES


def test_a_cancel_survives_a_router_crash(cluster):
    b = cluster.submit(batch_file("crash-cancel"), URL)
    cluster.wait_batch(b["id"], 60, until=("in_progress",))
    r = cluster.post("/v1/batches/%s/cancel" % b["id"])
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled"), r.text
    cluster.kill_router()  # SIGKILL, whether or not the cancel had ended
    cluster.start_router()
    cluster.wait_ready()
    ended = cluster.wait_batch(b["id"], 60)
    assert ended["status"] == "cancelled", ended
    print("cancelled across a crash with %d of %d answered" % (
        split_results(cluster, ended, "crash-cancel", "batch_cancelled"), LINES))


def test_a_window_ends_while_the_router_is_down(cluster):
    b = cluster.submit(batch_file("crash-expire"), URL, window="3s")
    running = cluster.wait_batch(b["id"], 60, until=("in_progress",))
    deadline = time.monotonic() + 60
    while running["request_counts"]["completed"] < 5:
        assert time.monotonic() < deadline, running
        time.sleep(0.02)
        running = cluster.get("/v1/batches/" + b["id"]).json()
    cluster.kill_router()
    # Down past the end of the window: the next router ends the batch expired, keeping what the
    # last one recorded.
    time.sleep(max(0, b["created_at"] + 4 - time.time()))
    cluster.start_router()
    cluster.wait_ready()
    ended = cluster.wait_batch(b["id"], 60)
    assert ended["status"] == "expired", ended
    answered = split_results(cluster, ended, "crash-expire", "batch_expired")
    assert running["request_counts"]["completed"] <= answered < LINES
    print("expired while the router was down with %d of %d answered" % (answered, LINES))


def test_a_restarted_router_serves_what_the_last_one_stored(cluster):
    f = cluster.upload(jsonl([request_line("kept", {"model": MODEL, "prompt": "kept",
                                                    "max_tokens": 2}, url=URL)]))
    assert f.status_code == 200, f.text
    b = cluster.wait_batch(cluster.create_batch(f.json()["id"], URL).json()["id"], 60)
    assert b["status"] == "completed", b
    listed = cluster.get("/v1/batches?limit=100").json()["data"]
    output = cluster.get("/v1/files/%s/content" % b["output_file_id"]).text
    stop(cluster.router)  # SIGTERM: a clean stop
    cluster.start_router()
    assert cluster.get("/v1/batches/" + b["id"]).json() == b
    assert cluster.get("/v1/batches?limit=100").json()["data"] == listed
    assert cluster.get("/v1/files/" + f.json()["id"]).json() == f.json()
    assert cluster.get("/v1/files/%s/content" % b["output_file_id"]).text == output
    # /metrics counts the batches in the state dir by status (this module's five; the service
    # counts them every 500 ms, so the new router's first count may take a moment), and the lane
    # is idle.
    want = {"completed": "1", "cancelled": "2", "expired": "2"}
    deadline = time.monotonic() + 5
    while True:
        metrics = cluster.get("/metrics").text
        jobs = re.findall(r'^carpool_batch_jobs\{status="(\w+)"\} (\d+)$', metrics, re.M)
        if {k: v for k, v in jobs if v != "0"} == want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(jobs) == 8 and {k: v for k, v in jobs if v != "0"} == want, metrics
    assert re.search(r'^carpool_batch_requests\{state="running"\} 0$', metrics, re.M), metrics
    assert re.search(r'^carpool_batch_requests\{state="pending"\} 0$', metrics, re.M), metrics
