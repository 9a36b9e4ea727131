"""carpool's Python SDK: generate, stream, chat, embed, tokenize, detokenize, cancel, stats and
batch jobs (files and batches) against a carpool router over ZeroMQ.

  import carpool
  with carpool.Client("tcp://127.0.0.1:5555") as client:
      greedy = carpool.SamplingParams(max_tokens=16, temperature=0)
      print(client.generate("Hello", sampling=greedy).text)

Usage: docs/python.md. Wire protocol: docs/protocol.md.
"""

# The generated carpool_pb2 module may sit in another directory named carpool on sys.path (the
# CMake build tree generates it into build/client/python/carpool): look there too.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

from .aio import AsyncClient, AsyncStream  # noqa: E402
from .client import Client, Stream  # noqa: E402
from .errors import (  # noqa: E402
    Cancelled, CarpoolError, ClientTooSlow, DeadlineExceeded, DeadlineUnmeetable, Draining,
    DuplicateRequestId, FailedPrecondition, InternalError, InvalidArgument, NoWorkers, NotFound,
    OutOfRange, PromptTooLong, QueueFull, ResourceExhausted, RouterLost, TenantQuota, Timeout,
    TokenBudget, TooLarge, Unauthenticated, UnknownModel, Unsupported, WorkerLost)
from .sampling import SamplingParams  # noqa: E402
from .types import (  # noqa: E402
    Batch, BatchError, BatchList, BatchRequestCounts, BatchResults, Chunk, EmbedResult,
    FileObject, GenerateResult, Stats, TenantStats, Timings, Token, TokenizeResult, TokenLogprob,
    Usage, WorkerStats)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "AsyncStream", "Batch", "BatchError", "BatchList", "BatchRequestCounts",
    "BatchResults", "Cancelled", "CarpoolError", "Chunk", "Client",
    "ClientTooSlow", "DeadlineExceeded", "DeadlineUnmeetable", "Draining", "DuplicateRequestId",
    "EmbedResult", "FailedPrecondition", "FileObject", "GenerateResult", "InternalError",
    "InvalidArgument", "NoWorkers", "NotFound", "OutOfRange",
    "PromptTooLong", "QueueFull", "ResourceExhausted", "RouterLost", "SamplingParams", "Stats",
    "Stream",
    "TenantQuota", "TenantStats", "Timeout", "Timings", "Token", "TokenBudget", "TokenizeResult",
    "TokenLogprob",
    "TooLarge", "Unauthenticated", "UnknownModel", "Unsupported", "Usage", "WorkerLost",
    "WorkerStats",
]
