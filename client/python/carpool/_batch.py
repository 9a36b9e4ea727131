"""Batch jobs (docs/batch.md) on the wire: BatchCall frames out, BatchReply answers in, and the
router's OpenAI JSON objects read into the SDK's types. Shared by the sync and asyncio clients;
no sockets here.
"""

import json
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from . import _requests
from . import _wire
from . import errors
from ._wire import pb
from .types import Batch, BatchError, BatchList, BatchRequestCounts, FileObject

OPS = {
    "create_file": pb.BatchCall.CREATE_FILE,
    "get_file": pb.BatchCall.GET_FILE,
    "file_content": pb.BatchCall.FILE_CONTENT,
    "delete_file": pb.BatchCall.DELETE_FILE,
    "create_batch": pb.BatchCall.CREATE_BATCH,
    "get_batch": pb.BatchCall.GET_BATCH,
    "list_batches": pb.BatchCall.LIST_BATCHES,
    "cancel_batch": pb.BatchCall.CANCEL_BATCH,
}

# What a FILE_CONTENT answer adds to the file's bytes: the file object and the envelope.
CONTENT_OVERHEAD_BYTES = 64 << 10

FINAL_STATUSES = frozenset(("failed", "completed", "expired", "cancelled"))

Content = Union[str, bytes, bytearray, Sequence[Mapping[str, Any]]]


def call_request(ids: _wire.RequestIds, client_api_key: str, client_timeout: float, op: str, *,
                 api_key: Optional[str] = None, timeout: Optional[float] = None,
                 **fields: Any) -> _requests.Request:
    """The Request of one batch call: `op` (a key of OPS) with its fields (id, filename,
    purpose, content, input_file_id, endpoint, completion_window, metadata_json, after, limit).
    TypeError for a field of the wrong type."""
    rid = ids.next()
    call_timeout = client_timeout if timeout is None else _wire.check_timeout(timeout)
    msg = pb.ClientMessage(protocol_version=_wire.PROTOCOL_VERSION)
    b = msg.batch
    b.request_id = rid
    b.api_key = client_api_key if api_key is None else api_key
    b.op = OPS[op]
    for name, value in fields.items():
        try:
            setattr(b, name, value)
        except (TypeError, ValueError) as e:
            raise TypeError("%s: %s" % (name, e)) from None
    return _requests.Request(rid, msg.SerializeToString(), call_timeout)


def reply_answer(event: Any) -> Optional[Any]:
    """The BatchReply in an event of a batch call; raises the error it carries; None for
    anything else."""
    return _requests._answer(event, "batch_reply", lambda r: r)


def reply_json(reply: Any, what: str) -> Dict[str, Any]:
    try:
        j = json.loads(reply.json)
    except ValueError:
        j = None
    if not isinstance(j, dict):
        raise errors.InternalError("the router's answer to %s is not a JSON object: %.200s" %
                                   (what, reply.json), request_id=reply.request_id)
    return j


def jsonl(content: Content) -> bytes:
    """A batch input file's bytes: JSONL as given (str as UTF-8, bytes), or a list of request
    dicts ({"custom_id", "method", "url", "body"}) one per line."""
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray)):
        return bytes(content)
    if isinstance(content, Mapping) or not isinstance(content, Sequence):
        raise TypeError("a batch file is JSONL (str or bytes) or a list of request dicts, not %r"
                        % type(content).__name__)
    lines = []
    for i, line in enumerate(content):
        if not isinstance(line, Mapping):
            raise TypeError("requests[%d] must be a dict, not %r" % (i, type(line).__name__))
        lines.append(_wire._json(dict(line), "requests[%d]" % i) + "\n")
    return "".join(lines).encode("utf-8")


def first_line_url(content: bytes) -> str:
    """The url of a batch file's first line; InvalidArgument when it has none."""
    try:
        j = json.loads(content.split(b"\n", 1)[0])
    except ValueError:
        j = None
    if not isinstance(j, dict) or not isinstance(j.get("url"), str):
        raise errors.InvalidArgument(
            "the batch file's first line is not a JSON object with a string url: pass endpoint=")
    return j["url"]


def metadata_json(metadata: Optional[Mapping[str, str]]) -> str:
    if metadata is None:
        return ""
    if not isinstance(metadata, Mapping):
        raise TypeError("metadata must be a dict of str, not %r" % type(metadata).__name__)
    return _wire._json(dict(metadata), "metadata")


def _int(j: Mapping[str, Any], key: str) -> int:
    v = j.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _str(j: Mapping[str, Any], key: str) -> str:
    v = j.get(key)
    return v if isinstance(v, str) else ""


def file_from(j: Mapping[str, Any]) -> FileObject:
    return FileObject(_str(j, "id"), _int(j, "bytes"), _int(j, "created_at"),
                      _str(j, "filename"), _str(j, "purpose"))


def batch_from(j: Mapping[str, Any]) -> Batch:
    counts = j.get("request_counts") if isinstance(j.get("request_counts"), dict) else {}
    errs = j.get("errors") if isinstance(j.get("errors"), dict) else {}
    metadata = j.get("metadata") if isinstance(j.get("metadata"), dict) else {}
    return Batch(
        id=_str(j, "id"), status=_str(j, "status"), endpoint=_str(j, "endpoint"),
        input_file_id=_str(j, "input_file_id"), output_file_id=_str(j, "output_file_id"),
        error_file_id=_str(j, "error_file_id"), completion_window=_str(j, "completion_window"),
        request_counts=BatchRequestCounts(_int(counts, "total"), _int(counts, "completed"),
                                          _int(counts, "failed")),
        errors=[BatchError(_str(e, "code"), _str(e, "message"), _int(e, "line"))
                for e in errs.get("data") or () if isinstance(e, dict)],
        metadata={k: v for k, v in metadata.items() if isinstance(v, str)},
        **{name: _int(j, name) for name in Batch.TIMESTAMPS})


def list_from(j: Mapping[str, Any]) -> BatchList:
    data = j.get("data") if isinstance(j.get("data"), list) else []
    return BatchList([batch_from(b) for b in data if isinstance(b, dict)],
                     bool(j.get("has_more", False)))


def too_large_for_client(file: FileObject, max_message_bytes: int) -> Optional[errors.CarpoolError]:
    """The error for a file whose content would not fit a message this client takes (the
    connection would drop); None when it fits."""
    if file.bytes + CONTENT_OVERHEAD_BYTES <= max_message_bytes:
        return None
    return errors.ResourceExhausted(
        "file %s is %d bytes; this client takes messages of at most %d bytes "
        "(max_message_bytes, with %d for the envelope)" %
        (file.id, file.bytes, max_message_bytes, CONTENT_OVERHEAD_BYTES))


def not_finished(batch: Batch) -> errors.CarpoolError:
    return errors.FailedPrecondition(
        "batch %s is %s: its results are written once it ends (completed, expired, cancelled)"
        % (batch.id, batch.status))


def wait_timeout(batch: Batch, timeout: float) -> errors.Timeout:
    return errors.Timeout("batch %s is still %s after %.3g s" % (batch.id, batch.status, timeout))
