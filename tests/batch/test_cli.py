"""`carpool batch` (issue 16, ZeroMQ and CLI) against a real carpool-router with --tenants: a
batch submitted with the CLI over ZeroMQ is the one the HTTP Batch API shows to the same tenant
(status, list, output file byte for byte) and no other; one submitted over HTTP is read back with
the CLI; --wait --output writes every custom_id once with the answers of the same requests sent
directly; a file with a bad line and a cancel of a finished batch exit 1 naming the problem."""

import json
import os
import subprocess

import pytest
import requests

from harness import BIN_DIR, BUILT, MODEL, Cluster, jsonl, request_line

CLI_BIN = os.path.join(BIN_DIR, "carpool")
pytestmark = pytest.mark.skipif(not (BUILT and os.access(CLI_BIN, os.X_OK)),
                                reason="carpool binaries not built")

KEY_A, KEY_B = "cli-key-alpha", "cli-key-beta"
URL = "/v1/completions"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    tenants = tmp / "tenants.textproto"
    tenants.write_text('tenant { key: "%s" name: "alpha" }\n'
                       'tenant { key: "%s" name: "beta" }\n' % (KEY_A, KEY_B))
    c = Cluster(tmp, router_args=["--tenants", str(tenants)])
    try:
        c.add_worker(MODEL)
        yield c
    finally:
        c.close()


def cli(c, *args, key=KEY_A, check=True):
    run = subprocess.run([CLI_BIN, "batch"] + list(args) + ["--router", c.frontend,
                                                           "--api-key", key],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if check:
        assert run.returncode == 0, run.stdout + run.stderr
    return run


def body(i):
    return {"model": MODEL, "prompt": "CLI line %d:" % i, "temperature": 0, "max_tokens": 3}


def lines(prefix, n=12):
    return jsonl([request_line("%s-%d" % (prefix, i), body(i), url=URL) for i in range(n)])


def answer(b):
    """What greedy decoding fixes of a completion body."""
    u = b["usage"]
    return b["choices"], (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])


def test_cli_submit_wait_output(cluster, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(lines("cli"))
    out = tmp_path / "out.jsonl"
    run = cli(cluster, "submit", str(path), "--wait", "--poll-ms", "100", "--output", str(out),
              "--metadata", "job=cli")
    batch_id = run.stdout.split()[0]
    assert batch_id.startswith("batch_") and "completed" in run.stdout, run.stdout
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in results) == sorted("cli-%d" % i for i in range(12))
    headers = {"Authorization": "Bearer " + KEY_A}
    for r in results:
        i = int(r["custom_id"].rsplit("-", 1)[1])
        direct = requests.post(cluster.url + URL, json=body(i), headers=headers, timeout=60)
        assert direct.status_code == 200, direct.text
        assert answer(r["response"]["body"]) == answer(direct.json()), r

    # The same batch over HTTP, for its tenant: the object the CLI prints, the same output file.
    http = cluster.get("/v1/batches/" + batch_id, key=KEY_A)
    assert http.status_code == 200, http.text
    assert json.loads(cli(cluster, "status", batch_id, "--json").stdout) == http.json()
    assert http.json()["metadata"] == {"job": "cli"}
    content = cluster.get("/v1/files/%s/content" % http.json()["output_file_id"], key=KEY_A)
    assert content.text == out.read_text()
    assert cli(cluster, "results", batch_id).stdout == content.text
    listed = json.loads(cli(cluster, "list", "--json", "--limit", "100").stdout)["data"]
    assert batch_id in [b["id"] for b in listed]

    # Not for the other tenant, over either.
    assert cluster.get("/v1/batches/" + batch_id, key=KEY_B).status_code == 404
    other = cli(cluster, "status", batch_id, key=KEY_B, check=False)
    assert other.returncode == 1 and "NOT_FOUND" in other.stderr, other.stderr
    assert batch_id not in cli(cluster, "list", key=KEY_B).stdout
    unknown = cli(cluster, "list", key="not-a-key", check=False)
    assert unknown.returncode == 1 and "UNAUTHENTICATED" in unknown.stderr, unknown.stderr

    # Finished: cancel exits 1 naming why, and changes nothing.
    cancel = cli(cluster, "cancel", batch_id, check=False)
    assert cancel.returncode == 1 and "FAILED_PRECONDITION" in cancel.stderr, cancel.stderr
    assert cluster.get("/v1/batches/" + batch_id, key=KEY_A).json()["status"] == "completed"


def test_an_http_batch_read_with_the_cli(cluster):
    b = cluster.submit(lines("http", 4), URL, key=KEY_A)
    done = json.loads(cli(cluster, "status", b["id"], "--wait", "--poll-ms", "100",
                          "--json").stdout)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 4, done
    assert done == cluster.get("/v1/batches/" + b["id"], key=KEY_A).json()
    assert cli(cluster, "results", b["id"]).stdout == cluster.get(
        "/v1/files/%s/content" % done["output_file_id"], key=KEY_A).text


def test_cli_submit_of_a_bad_file_exits_1(cluster, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(lines("bad", 2) + "not json\n")
    run = cli(cluster, "submit", str(path), "--wait", "--poll-ms", "100", check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ended failed" in run.stderr and "line 3: invalid_json" in run.stderr, run.stderr
    batch_id = run.stdout.split()[0]
    status = cli(cluster, "status", batch_id).stdout
    assert "line 3: invalid_json" in status, status
