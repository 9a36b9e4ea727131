"""The Batch API of a router, in memory, for the SDK's tests: a FakeRouter handler answering
BatchCall messages with OpenAI's JSON objects in the shapes the router's batch service writes
(everything else goes to echo_handler).

A batch's requests "run" as it is polled: each get_batch of a batch in progress answers one more
request, and the one after the last completes it, writing an output line per request (an error
line for each custom_id starting with "bad"). A file with a line that is not JSON fails its batch
at once, every such line listed (code invalid_json).
"""

import json
import threading
from typing import Any, Dict, List

from carpool import carpool_pb2 as pb
from fake_router import echo_handler, error

_OP_NAMES = {v: k for k, v in pb.BatchCall.Op.items()}


def _reply(request_id: str, obj: Any, content: bytes = b"") -> "pb.ServerMessage":
    m = pb.ServerMessage(protocol_version=1)
    m.batch_reply.request_id = request_id
    m.batch_reply.json = json.dumps(obj)
    m.batch_reply.content = content
    return m


def _error(request_id: str, code: str, message: str) -> "pb.ServerMessage":
    return error(request_id, code, code.lower(), message)


class FakeBatchStore:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._next = 0
        self.files: Dict[str, Dict[str, Any]] = {}   # id -> {"object", "content"}
        self.batches: Dict[str, Dict[str, Any]] = {}
        self._order: List[str] = []                   # newest first
        self._custom_ids: Dict[str, List[str]] = {}

    def handler(self, router, client, msg) -> None:
        if msg.WhichOneof("body") != "batch":
            echo_handler(router, client, msg)
            return
        with self._mu:
            router.send(client, self._answer(msg.batch))

    def set_status(self, batch_id: str, status: str) -> None:
        with self._mu:
            self.batches[batch_id]["status"] = status

    def _add_file(self, filename: str, purpose: str, content: bytes) -> Dict[str, Any]:
        self._next += 1
        fid = "file-%d" % self._next
        obj = {"id": fid, "object": "file", "bytes": len(content),
               "created_at": 1700000000 + self._next, "filename": filename, "purpose": purpose}
        self.files[fid] = {"object": obj, "content": content}
        return obj

    def _answer(self, b) -> "pb.ServerMessage":
        op, rid = _OP_NAMES[b.op], b.request_id
        if op == "CREATE_FILE":
            if b.purpose != "batch":
                return _error(rid, "INVALID_ARGUMENT", "purpose %r is not batch" % b.purpose)
            return _reply(rid, self._add_file(b.filename, "batch", bytes(b.content)))
        if op in ("GET_FILE", "FILE_CONTENT", "DELETE_FILE"):
            f = self.files.get(b.id)
            if f is None:
                return _error(rid, "NOT_FOUND", "no file %r" % b.id)
            if op == "DELETE_FILE":
                del self.files[b.id]
                return _reply(rid, {"id": b.id, "object": "file", "deleted": True})
            return _reply(rid, f["object"], f["content"] if op == "FILE_CONTENT" else b"")
        if op == "CREATE_BATCH":
            return self._create_batch(b)
        if op in ("GET_BATCH", "CANCEL_BATCH"):
            batch = self.batches.get(b.id)
            if batch is None:
                return _error(rid, "NOT_FOUND", "no batch %r" % b.id)
            if op == "CANCEL_BATCH":
                if batch["status"] not in ("validating", "in_progress"):
                    return _error(rid, "FAILED_PRECONDITION",
                                  "batch %r is %s" % (b.id, batch["status"]))
                batch["status"] = "cancelling"
                return _reply(rid, batch)
            self._advance(b.id, batch)
            return _reply(rid, batch)
        if op == "LIST_BATCHES":
            ids = self._order
            if b.after:
                ids = ids[ids.index(b.after) + 1:] if b.after in ids else []
            limit = b.limit or 20
            return _reply(rid, {"object": "list",
                                "data": [self.batches[i] for i in ids[:limit]],
                                "has_more": len(ids) > limit})
        return _error(rid, "INVALID_ARGUMENT", "op is unset")

    def _create_batch(self, b) -> "pb.ServerMessage":
        f = self.files.get(b.input_file_id)
        if f is None:
            return _error(b.request_id, "NOT_FOUND", "no file %r" % b.input_file_id)
        if not b.endpoint.startswith("/v1/"):
            return _error(b.request_id, "INVALID_ARGUMENT",
                          "%r is not a batch endpoint" % b.endpoint)
        self._next += 1
        bid = "batch_%d" % self._next
        custom_ids, errors = [], []
        lines = [line for line in f["content"].split(b"\n") if line.strip()]
        for n, line in enumerate(lines, 1):
            try:
                custom_ids.append(json.loads(line)["custom_id"])
            except ValueError:
                errors.append({"code": "invalid_json", "message": "the line is not JSON",
                               "param": None, "line": n})
        batch = {"id": bid, "object": "batch", "endpoint": b.endpoint, "errors": None,
                 "input_file_id": b.input_file_id, "completion_window": b.completion_window,
                 "status": "in_progress", "output_file_id": None, "error_file_id": None,
                 "created_at": 1700000000 + self._next, "in_progress_at": 1700000001,
                 "expires_at": 1700086400 + self._next, "completed_at": None,
                 "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                 "metadata": json.loads(b.metadata_json) if b.metadata_json else None}
        if errors:
            batch.update(status="failed", failed_at=1700000002,
                         errors={"object": "list", "data": errors})
        self.batches[bid] = batch
        self._order.insert(0, bid)
        self._custom_ids[bid] = custom_ids
        return _reply(b.request_id, batch)

    def _advance(self, bid: str, batch: Dict[str, Any]) -> None:
        if batch["status"] == "cancelling":
            batch.update(status="cancelled", cancelled_at=1700000100)
            return
        if batch["status"] != "in_progress":
            return
        counts, ids = batch["request_counts"], self._custom_ids[bid]
        done = counts["completed"] + counts["failed"]
        if done < len(ids):
            counts["failed" if ids[done].startswith("bad") else "completed"] += 1
            return
        output, failed = b"", b""
        for cid in ids:
            bad = cid.startswith("bad")
            line = json.dumps({"id": "batch_req_" + cid, "custom_id": cid,
                               "response": {"status_code": 400 if bad else 200,
                                            "request_id": "req_" + cid,
                                            "body": {"echo": cid}},
                               "error": None}).encode() + b"\n"
            if bad:
                failed += line
            else:
                output += line
        batch["output_file_id"] = self._add_file("output.jsonl", "batch_output", output)["id"]
        if failed:
            batch["error_file_id"] = self._add_file("errors.jsonl", "batch_output", failed)["id"]
        batch.update(status="completed", completed_at=1700000200)
