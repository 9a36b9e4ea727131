"""The Batch API's refusals over HTTP against a real carpool-router (issue 16, "Bad input matrix"):
every validation error of router/batch/batch_input.h (alone, and all in one file, each listed by
its line), the file limits (413 above --batch-max-file-bytes, 400 above --batch-max-lines),
unknown ids (404), cancelling a finished batch (409), another tenant's ids (404, with --tenants of
two tenants), unknown and missing API keys (401), bad batch parameters and malformed requests
(400, 405), and a --state-dir that cannot be created (the router exits at start naming it; an
unusable default one turns batch jobs off instead)."""

import json
import subprocess

import pytest
import requests

from harness import BUILT, MODEL, ROUTER_BIN, Cluster, jsonl, request_line
from processes import stop, wait_for_log

pytestmark = pytest.mark.skipif(not BUILT, reason="carpool binaries not built")

KEY_A, KEY_B = "batch-key-alpha", "batch-key-beta"
MAX_FILE_BYTES = 8192
MAX_LINES = 40
CHAT = "/v1/chat/completions"


def chat_body(text="hi", **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": 2}
    body.update(extra)
    return body


GOOD = request_line("good-1", chat_body())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-input")
    tenants = tmp / "tenants.textproto"
    tenants.write_text('tenant { key: "%s" name: "alpha" }\n'
                       'tenant { key: "%s" name: "beta" }\n' % (KEY_A, KEY_B))
    c = Cluster(tmp, router_args=["--tenants", str(tenants),
                                  "--batch-max-file-bytes", str(MAX_FILE_BYTES),
                                  "--batch-max-lines", str(MAX_LINES)])
    try:
        c.add_worker(MODEL)
        yield c
    finally:
        c.close()


def error_of(resp, status, code=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["message"] and err["type"], err
    if code is not None:
        assert err["code"] == code, err
    return err


def failed_batch(c, content, endpoint=CHAT):
    """The batch of `content` once final: it must have failed in validation, running nothing."""
    b = c.wait_batch(c.submit(content, endpoint, key=KEY_A)["id"], 60, key=KEY_A)
    assert b["status"] == "failed", b
    assert b["output_file_id"] is None, b
    assert b["request_counts"]["completed"] == 0, b
    for e in b["errors"]["data"]:
        assert e["message"] and e["param"] is None, e
    return b


# (the validation error, a file whose line 2 has it, after a good line 1)
ONE_BAD_LINE = [
    ("invalid_json", '{"custom_id": "x", "method": "POST",'),
    ("not_an_object", '["custom_id", "x"]'),
    ("missing_custom_id", json.dumps({"method": "POST", "url": CHAT, "body": chat_body()})),
    ("missing_custom_id", request_line("", chat_body())),
    ("missing_custom_id", json.dumps({"custom_id": 7, "method": "POST", "url": CHAT,
                                      "body": chat_body()})),
    ("duplicate_custom_id", request_line("good-1", chat_body("again"))),
    ("invalid_method", json.dumps({"custom_id": "x", "method": "GET", "url": CHAT,
                                   "body": chat_body()})),
    ("invalid_method", json.dumps({"custom_id": "x", "url": CHAT, "body": chat_body()})),
    ("invalid_url", request_line("x", chat_body(), url="/v1/completions")),
    ("invalid_url", request_line("x", chat_body(), url="/v1/unknown")),
    ("missing_body", json.dumps({"custom_id": "x", "method": "POST", "url": CHAT})),
    ("missing_body", json.dumps({"custom_id": "x", "method": "POST", "url": CHAT,
                                 "body": "not an object"})),
    ("invalid_body", request_line("x", {"model": MODEL, "messages": "hi"})),
    ("invalid_body", request_line("x", chat_body(max_tokens=-1))),
    ("invalid_body", request_line("x", chat_body(stream=True))),
    ("missing_model", request_line("x", {"messages": [{"role": "user", "content": "hi"}]})),
    ("mismatched_model", request_line("x", chat_body() | {"model": "synthetic:small"})),
    ("empty_line", "   "),
]


@pytest.mark.parametrize("code,bad", ONE_BAD_LINE,
                         ids=["%s-%d" % (c, i) for i, (c, _) in enumerate(ONE_BAD_LINE)])
def test_one_bad_line_fails_the_batch(cluster, code, bad):
    b = failed_batch(cluster, jsonl([GOOD, bad, request_line("good-3", chat_body())]))
    assert [(e["line"], e["code"]) for e in b["errors"]["data"]] == [(2, code)], b["errors"]


def test_every_bad_line_is_listed(cluster):
    lines = [GOOD] + [bad for _, bad in ONE_BAD_LINE]
    # Each line a custom_id of its own, but for the lines whose error is about their custom_id.
    lines = [l.replace('"x"', '"x%d"' % i) for i, l in enumerate(lines)]
    b = failed_batch(cluster, jsonl(lines))
    want = [(i + 2, code) for i, (code, _) in enumerate(ONE_BAD_LINE)]
    assert [(e["line"], e["code"]) for e in b["errors"]["data"]] == want, b["errors"]


def test_a_blank_line_at_the_end_is_an_error(cluster):
    # The newline ending the last line is not a blank line; a second one is.
    b = failed_batch(cluster, jsonl([GOOD]) + "\n")
    assert [(e["line"], e["code"]) for e in b["errors"]["data"]] == [(2, "empty_line")]


def test_file_limits(cluster):
    # One byte over --batch-max-file-bytes: 413, naming the limit.
    line = request_line("big", chat_body("x" * 200))
    content = jsonl([line] * (MAX_FILE_BYTES // len(line) + 1))
    content = content[:MAX_FILE_BYTES + 1]
    err = error_of(cluster.upload(content, key=KEY_A), 413)
    assert str(MAX_FILE_BYTES) in err["message"], err
    # At the limit it is taken (validation of its lines comes with a batch).
    ok = cluster.upload(content[:MAX_FILE_BYTES], key=KEY_A)
    assert ok.status_code == 200, ok.text
    assert ok.json()["bytes"] == MAX_FILE_BYTES
    # More lines than --batch-max-lines: 400, naming the limit.
    small = request_line("s", chat_body())
    err = error_of(cluster.upload(jsonl([small] * (MAX_LINES + 1)), key=KEY_A), 400)
    assert str(MAX_LINES) in err["message"], err
    assert cluster.upload(jsonl([small] * MAX_LINES), key=KEY_A).status_code == 200
    # An empty file, another purpose: 400.
    error_of(cluster.upload("", key=KEY_A), 400)
    error_of(cluster.upload(jsonl([GOOD]), key=KEY_A, purpose="fine-tune"), 400)


def test_bad_batch_parameters(cluster):
    fid = cluster.upload(jsonl([GOOD]), key=KEY_A).json()["id"]
    error_of(cluster.create_batch(fid, endpoint="/v1/unknown", key=KEY_A), 400)
    error_of(cluster.create_batch(fid, window="forever", key=KEY_A), 400)
    error_of(cluster.create_batch(fid, window="48h", key=KEY_A), 400)
    error_of(cluster.create_batch(fid, metadata=["not", "an", "object"], key=KEY_A), 400)
    error_of(cluster.create_batch(fid, metadata={"n": 1}, key=KEY_A), 400)
    error_of(cluster.post("/v1/batches", {"endpoint": CHAT, "completion_window": "24h"},
                          key=KEY_A), 400)


def test_unknown_ids_are_404(cluster):
    error_of(cluster.get("/v1/files/file-unknown", key=KEY_A), 404)
    error_of(cluster.get("/v1/files/file-unknown/content", key=KEY_A), 404)
    error_of(cluster.get("/v1/batches/batch_unknown", key=KEY_A), 404)
    error_of(cluster.post("/v1/batches/batch_unknown/cancel", key=KEY_A), 404)
    error_of(cluster.create_batch("file-unknown", key=KEY_A), 404)


def test_cancelling_a_finished_batch_is_409(cluster):
    done = cluster.wait_batch(cluster.submit(jsonl([GOOD]), key=KEY_A)["id"], 60, key=KEY_A)
    assert done["status"] == "completed", done
    error_of(cluster.post("/v1/batches/%s/cancel" % done["id"], key=KEY_A), 409)
    failed = failed_batch(cluster, jsonl([GOOD, "{"]))
    error_of(cluster.post("/v1/batches/%s/cancel" % failed["id"], key=KEY_A), 409)
    # Neither changed.
    assert cluster.get("/v1/batches/" + done["id"], key=KEY_A).json()["status"] == "completed"
    assert cluster.get("/v1/batches/" + failed["id"], key=KEY_A).json()["status"] == "failed"


def test_another_tenants_ids_are_404(cluster):
    f = cluster.upload(jsonl([GOOD]), key=KEY_A).json()
    b = cluster.wait_batch(cluster.create_batch(f["id"], key=KEY_A).json()["id"], 60, key=KEY_A)
    assert b["status"] == "completed", b
    for path in ("/v1/files/" + f["id"], "/v1/files/%s/content" % f["id"],
                 "/v1/files/%s/content" % b["output_file_id"], "/v1/batches/" + b["id"]):
        error_of(cluster.get(path, key=KEY_B), 404)
    error_of(cluster.post("/v1/batches/%s/cancel" % b["id"], key=KEY_B), 404)
    error_of(cluster.create_batch(f["id"], key=KEY_B), 404)
    r = cluster.get("/v1/batches?limit=100", key=KEY_B)
    assert r.status_code == 200 and b["id"] not in [x["id"] for x in r.json()["data"]], r.text
    error_of(cluster.delete("/v1/files/" + f["id"], key=KEY_B), 404)
    # The owner still sees all of it.
    assert cluster.get("/v1/files/" + f["id"], key=KEY_A).status_code == 200
    r = cluster.get("/v1/batches?limit=100", key=KEY_A)
    assert b["id"] in [x["id"] for x in r.json()["data"]], r.text


def test_unknown_or_missing_key_is_401(cluster):
    error_of(cluster.upload(jsonl([GOOD]), key="not-a-key"), 401)
    error_of(cluster.upload(jsonl([GOOD])), 401)
    error_of(cluster.get("/v1/batches", key="not-a-key"), 401)
    error_of(cluster.get("/v1/batches/batch_unknown"), 401)
    error_of(cluster.create_batch("file-unknown", key="not-a-key"), 401)


def test_an_unusable_state_dir_stops_the_start(tmp_path):
    """Refused at start, before the gateway listens, with a message naming the path."""
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory\n")
    # Under a regular file, a regular file itself, and a folder no one may create even as root
    # (the tests may run as root, who writes into any directory of a normal filesystem).
    for state_dir in (plain / "state", plain, "/proc/carpool-state"):
        run = subprocess.run([ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*",
                              "--backend", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0",
                              "--state-dir", str(state_dir)],
                             capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
        assert run.returncode != 0, run.stderr
        assert str(state_dir) in run.stderr, run.stderr
        assert "http gateway listening" not in run.stderr + run.stdout
    assert plain.read_text() == "not a directory\n"


def test_malformed_requests(cluster):
    auth = cluster.headers(KEY_A)
    for query in ("limit=0", "limit=101", "limit=abc"):
        error_of(cluster.get("/v1/batches?" + query, key=KEY_A), 400)
    error_of(cluster.get("/v1/batches?after=batch_unknown", key=KEY_A), 404)
    error_of(requests.put(cluster.url + "/v1/batches", headers=auth, timeout=30), 405)
    error_of(requests.post(cluster.url + "/v1/files", data=b"{}", timeout=30,
                           headers=dict(auth, **{"Content-Type": "application/json"})), 400)
    err = error_of(requests.post(cluster.url + "/v1/files", files={"purpose": (None, "batch")},
                                 headers=auth, timeout=30), 400)
    assert err["param"] == "file", err
    error_of(requests.post(cluster.url + "/v1/batches", data=b"{not json", headers=auth,
                           timeout=30), 400)


def test_an_unusable_default_state_dir_turns_batch_jobs_off(tmp_path):
    """Without --state-dir the default ("carpool-state" in the working directory) is only a
    convenience: where it cannot be made the router serves on without batch jobs, says why, and
    the Batch API's routes answer 404."""
    (tmp_path / "carpool-state").write_text("a regular file where the state dir would go\n")
    log = tmp_path / "router.log"
    with open(log, "w") as out:
        router = subprocess.Popen([ROUTER_BIN, "--frontend", "tcp://127.0.0.1:*",
                                   "--backend", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0"],
                                  cwd=str(tmp_path), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    try:
        m = wait_for_log(str(log), r"http gateway listening on (http://127\.0\.0\.1:\d+)", 30)
        assert m, log.read_text()
        assert "batch jobs off" in log.read_text() and "carpool-state" in log.read_text()
        err = error_of(requests.get(m.group(1) + "/v1/batches", timeout=30), 404)
        assert "state" in err["message"], err
        assert requests.get(m.group(1) + "/health", timeout=30).status_code == 200
    finally:
        stop(router)
