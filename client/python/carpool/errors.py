"""carpool's exceptions: one class per error reason of the wire protocol (docs/protocol.md).

Every exception the SDK raises for a failed request is a CarpoolError carrying the server's
canonical code (an absl status code name such as "RESOURCE_EXHAUSTED"), its machine-readable
reason ("queue_full", ...), the message and, for overload refusals, retry_after_ms (0 when the
server named none). Catch a subclass for one reason, or CarpoolError for all of them.
"""

from typing import Dict, Optional, Type


class CarpoolError(Exception):
    """A request failed: refused or ended by the router, or failed in this client.

    Attributes:
      code: absl status code name ("INVALID_ARGUMENT", "UNAVAILABLE", ...).
      reason: machine-readable reason ("queue_full", ...); "" when the server gave none.
      message: human-readable explanation.
      retry_after_ms: for overload refusals, how long the server asks the client to wait; 0: none.
      request_id: the request it belongs to; "" when none (stats, unattributed errors).
    """

    default_code = "UNKNOWN"
    default_reason = ""

    def __init__(self, message: str = "", *, code: Optional[str] = None,
                 reason: Optional[str] = None, retry_after_ms: int = 0, request_id: str = ""):
        super().__init__(message)
        self.message = message
        self.code = code if code else self.default_code
        self.reason = reason if reason is not None else self.default_reason
        self.retry_after_ms = int(retry_after_ms)
        self.request_id = request_id

    def __str__(self) -> str:
        head = self.code + (" (" + self.reason + ")" if self.reason else "")
        tail = "; retry after %d ms" % self.retry_after_ms if self.retry_after_ms else ""
        return "%s: %s%s" % (head, self.message, tail)

    def __repr__(self) -> str:
        return "%s(code=%r, reason=%r, message=%r, retry_after_ms=%d, request_id=%r)" % (
            type(self).__name__, self.code, self.reason, self.message, self.retry_after_ms,
            self.request_id)


class QueueFull(CarpoolError):
    """The router's queue is at its limit; retry after retry_after_ms."""
    default_code, default_reason = "UNAVAILABLE", "queue_full"


class TokenBudget(CarpoolError):
    """The cluster's token budget cannot hold the request now; retry after retry_after_ms."""
    default_code, default_reason = "RESOURCE_EXHAUSTED", "token_budget"


class TenantQuota(CarpoolError):
    """The tenant (API key) is over its concurrency or token-rate limit."""
    default_code, default_reason = "RESOURCE_EXHAUSTED", "tenant_quota"


class DeadlineUnmeetable(CarpoolError):
    """The request's deadline_ms cannot be met at the cluster's measured service rate."""
    default_code, default_reason = "DEADLINE_EXCEEDED", "deadline_unmeetable"


class DeadlineExceeded(CarpoolError):
    """The request's deadline passed (the router's deadline_ms, or, as Timeout, this client's)."""
    default_code, default_reason = "DEADLINE_EXCEEDED", "deadline_exceeded"


class InvalidArgument(CarpoolError, ValueError):
    """The request is malformed; the message names the field."""
    default_code, default_reason = "INVALID_ARGUMENT", "invalid_argument"


class PromptTooLong(InvalidArgument):
    """The prompt (plus max_tokens) does not fit the model's context (max_model_len)."""
    default_code, default_reason = "INVALID_ARGUMENT", "prompt_too_long"


class UnknownModel(CarpoolError):
    """No worker serves the requested model."""
    default_code, default_reason = "NOT_FOUND", "unknown_model"


class WorkerLost(CarpoolError):
    """The request's worker died more often than the router's max_migrations allows."""
    default_code, default_reason = "UNAVAILABLE", "worker_lost"


class RouterLost(CarpoolError):
    """The connection to the router dropped with the call open: the router died, closed it or
    stopped answering heartbeats. Raised by this client; the client redials by itself."""
    default_code, default_reason = "UNAVAILABLE", "router_lost"


class Cancelled(CarpoolError):
    """The request was cancelled (cancel(), Stream.cancel(), or the client was closed)."""
    default_code, default_reason = "CANCELLED", "cancelled"


class Draining(CarpoolError):
    """The router or worker is shutting down and takes no new requests."""
    default_code, default_reason = "UNAVAILABLE", "draining"


class InternalError(CarpoolError):
    """A bug or an unexpected failure on the server side."""
    default_code, default_reason = "INTERNAL", "internal"


class Unauthenticated(CarpoolError):
    """The API key is missing or unknown."""
    default_code, default_reason = "UNAUTHENTICATED", "unauthenticated"


class Unsupported(CarpoolError):
    """The cluster cannot serve this kind of request (an embed call when no worker embeds)."""
    default_code, default_reason = "FAILED_PRECONDITION", "unsupported"


class TooLarge(CarpoolError):
    """The request reserves more tokens than the cluster could ever run at once (its class's
    in-flight budget, or the largest worker's KV cache): retrying cannot help; send less."""
    default_code, default_reason = "RESOURCE_EXHAUSTED", "too_large"


class NoWorkers(CarpoolError):
    """No worker able to serve the request was there for the router's no-worker timeout."""
    default_code, default_reason = "UNAVAILABLE", "no_workers"


class ClientTooSlow(CarpoolError):
    """This client read its answers too slowly: the router's bounded backlog for it overflowed,
    so its open requests were cancelled."""
    default_code, default_reason = "RESOURCE_EXHAUSTED", "client_too_slow"


class DuplicateRequestId(CarpoolError):
    """A request with the same request_id from this client is still in flight (it goes on)."""
    default_code, default_reason = "ALREADY_EXISTS", "duplicate_request_id"


class NotFound(CarpoolError):
    """No file or batch with that id for this key's tenant (another tenant's ids read so)."""
    default_code, default_reason = "NOT_FOUND", "not_found"


class FailedPrecondition(CarpoolError):
    """The call does not fit the object's state: a cancel of a batch that already ended,
    results of a batch still running, a router without a batch store."""
    default_code, default_reason = "FAILED_PRECONDITION", "failed_precondition"


class OutOfRange(InvalidArgument):
    """A value past a limit: a batch file larger than the router's --batch-max-file-bytes."""
    default_code, default_reason = "OUT_OF_RANGE", "out_of_range"


class ResourceExhausted(CarpoolError):
    """The router's batch store is full, or an answer is too large for this client's
    max_message_bytes."""
    default_code, default_reason = "RESOURCE_EXHAUSTED", "resource_exhausted"


class Timeout(DeadlineExceeded, TimeoutError):
    """This client's timeout passed before the request ended; the router was told to cancel it."""
    default_code, default_reason = "DEADLINE_EXCEEDED", "deadline_exceeded"


_BY_REASON: Dict[str, Type[CarpoolError]] = {
    cls.default_reason: cls
    for cls in (QueueFull, TokenBudget, TenantQuota, DeadlineUnmeetable, DeadlineExceeded,
                PromptTooLong, InvalidArgument, UnknownModel, WorkerLost, RouterLost, Cancelled,
                Draining, InternalError, Unauthenticated, Unsupported, TooLarge, NoWorkers,
                ClientTooSlow, DuplicateRequestId, NotFound, FailedPrecondition, OutOfRange,
                ResourceExhausted)
}

# For reasons this SDK does not know (a newer server), the class of the canonical code.
_BY_CODE: Dict[str, Type[CarpoolError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "OUT_OF_RANGE": OutOfRange,
    "NOT_FOUND": NotFound,
    "CANCELLED": Cancelled,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": Unauthenticated,
    "INTERNAL": InternalError,
    "FAILED_PRECONDITION": Unsupported,
}


def error_class(reason: str, code: str) -> Type[CarpoolError]:
    """The exception class for a server error: by reason, else by code, else CarpoolError."""
    return _BY_REASON.get(reason) or _BY_CODE.get(code) or CarpoolError


def from_error(error) -> CarpoolError:
    """The exception for a carpool.v1.Error message."""
    cls = error_class(error.reason, error.code)
    return cls(error.message, code=error.code or None, reason=error.reason,
               retry_after_ms=error.retry_after_ms, request_id=error.request_id)
