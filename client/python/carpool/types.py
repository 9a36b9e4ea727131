"""What the SDK returns: generation and embedding results, stream chunks, cluster stats and
batch jobs (plain dataclasses)."""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List


@dataclass
class TokenLogprob:
    token: int
    logprob: float


@dataclass
class Token:
    """One generated token: its id, its logprob and the requested top alternatives."""
    id: int
    logprob: float = 0.0
    top_logprobs: List[TokenLogprob] = field(default_factory=list)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Timings:
    """Measured by the router, in milliseconds since it received the request."""
    queue_ms: float = 0.0  # until dispatch to a worker
    ttft_ms: float = 0.0   # until the first token
    total_ms: float = 0.0  # until the last token


@dataclass
class Chunk:
    """The next tokens of a streaming request, in order.

    index: output position of the chunk's first token. text: this chunk's share of the decoded
    text (an incomplete UTF-8 sequence is held back until the chunk that completes it, so the
    chunks' texts concatenate to the result's text); text_bytes: the router's bytes as sent.
    """
    request_id: str
    index: int
    tokens: List[Token]
    text: str = ""
    text_bytes: bytes = b""

    @property
    def token_ids(self) -> List[int]:
        return [t.id for t in self.tokens]


@dataclass
class GenerateResult:
    """A finished request. text is decoded by the router (empty for a model without a
    tokenizer; invalid UTF-8 shows as U+FFFD) and text_bytes holds its raw bytes.
    finish_reason: "length" or "stop"; stop_string: the stop string that ended it (one of
    SamplingParams.stop), "" otherwise."""
    request_id: str
    tokens: List[Token] = field(default_factory=list)
    text: str = ""
    text_bytes: bytes = b""
    finish_reason: str = ""
    stop_string: str = ""
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)

    @property
    def token_ids(self) -> List[int]:
        return [t.id for t in self.tokens]


@dataclass
class EmbedResult:
    """The embeddings of an embed call: one vector per input, in input order (unit length unless
    normalize=False). usage.prompt_tokens counts every input's tokens; timings: queue_ms until
    dispatch, ttft_ms and total_ms until the answer."""
    request_id: str
    embeddings: List[List[float]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)

    def __len__(self) -> int:
        return len(self.embeddings)

    def __getitem__(self, index: int) -> List[float]:
        return self.embeddings[index]


@dataclass
class TokenizeResult:
    """The token ids of a tokenize call, and the model's context length (max_model_len)."""
    request_id: str
    token_ids: List[int] = field(default_factory=list)
    max_model_len: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class WorkerStats:
    """One worker as the router sees it."""
    worker_id: str = ""
    healthy: bool = False
    epoch: int = 0
    model: str = ""
    running: int = 0             # requests dispatched and not finished
    waiting: int = 0             # queued inside the worker (its last load report)
    max_num_seqs: int = 0
    kv_used_blocks: int = 0
    num_kv_blocks: int = 0
    outstanding_tokens: int = 0
    requests_served: int = 0
    draining: bool = False
    heartbeat_age_ms: int = 0    # since the router last heard from it
    cached_prefix_blocks: int = 0
    migrations_in: int = 0       # resumed requests it took over


@dataclass
class TenantStats:
    """Requests admitted and not ended, and refusals, of one tenant (router --tenants)."""
    name: str = ""
    active: int = 0
    rejected: int = 0


@dataclass
class Stats:
    """The router's view of the cluster (docs/cluster.md explains the admission figures)."""
    workers: List[WorkerStats] = field(default_factory=list)
    queued: int = 0
    inflight: int = 0
    requests_total: int = 0
    requests_rejected: int = 0
    rejections_by_reason: Dict[str, int] = field(default_factory=dict)
    queued_interactive: int = 0
    queued_default: int = 0
    queued_batch: int = 0
    queued_tokens: int = 0       # prompt + max_tokens reserved by queued requests
    inflight_tokens: int = 0     # ... and by dispatched ones
    max_queued_tokens: int = 0
    max_inflight_tokens: int = 0
    migrations: int = 0          # streams moved to another worker after theirs died
    draining: bool = False
    placement: str = ""
    tenants: List[TenantStats] = field(default_factory=list)
    service_tokens_per_s: float = 0.0
    # The batch lane (docs/batch.md): its requests queued and dispatched, its limits, batch jobs
    # by status and their requests not answered yet.
    batch_lane_queued: int = 0
    batch_lane_inflight: int = 0
    batch_max_queued: int = 0
    batch_max_inflight: int = 0
    batches_by_status: Dict[str, int] = field(default_factory=dict)
    batch_requests_pending: int = 0


# ---- batch jobs (docs/batch.md): OpenAI's file and batch objects


@dataclass
class FileObject:
    """A stored file: an uploaded batch input ("batch") or a batch's output ("batch_output")."""
    id: str = ""
    bytes: int = 0
    created_at: int = 0  # unix seconds
    filename: str = ""
    purpose: str = ""


@dataclass
class BatchRequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass
class BatchError:
    """A line of a batch's input file that failed validation."""
    code: str = ""     # "invalid_json", "duplicate_custom_id", ...
    message: str = ""
    line: int = 0      # 1-based; 0 when the error names no line


@dataclass
class Batch:
    """A batch job. status: validating, failed, in_progress, finalizing, completed, expired,
    cancelling or cancelled. Timestamps are unix seconds, 0 while not reached; file ids ""
    until written."""
    TIMESTAMPS = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
                  "failed_at", "expired_at", "cancelling_at", "cancelled_at")

    id: str = ""
    status: str = ""
    endpoint: str = ""
    input_file_id: str = ""
    output_file_id: str = ""
    error_file_id: str = ""
    completion_window: str = ""
    request_counts: BatchRequestCounts = field(default_factory=BatchRequestCounts)
    errors: List[BatchError] = field(default_factory=list)
    metadata: Dict[str, str] = field(default_factory=dict)
    created_at: int = 0
    in_progress_at: int = 0
    expires_at: int = 0
    finalizing_at: int = 0
    completed_at: int = 0
    failed_at: int = 0
    expired_at: int = 0
    cancelling_at: int = 0
    cancelled_at: int = 0

    @property
    def finished(self) -> bool:
        """failed, completed, expired or cancelled: nothing changes any more."""
        return self.status in ("failed", "completed", "expired", "cancelled")


@dataclass
class BatchList:
    data: List[Batch] = field(default_factory=list)  # newest first
    has_more: bool = False  # more after data[-1]: list_batches(after=data[-1].id)


@dataclass
class BatchResults:
    """A finished batch's output file (a line per answered request: {"id", "custom_id",
    "response": {"status_code", "request_id", "body"}, "error"}) and error file (the failed
    ones), in input order; b"" when it has none."""
    output_jsonl: bytes = b""
    error_jsonl: bytes = b""

    @property
    def output(self) -> List[Dict[str, Any]]:
        """The output file's lines, parsed."""
        return [json.loads(line) for line in self.output_jsonl.splitlines() if line.strip()]

    @property
    def errors(self) -> List[Dict[str, Any]]:
        """The error file's lines, parsed."""
        return [json.loads(line) for line in self.error_jsonl.splitlines() if line.strip()]
