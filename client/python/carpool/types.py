"""What the SDK returns: generation and embedding results, stream chunks and cluster stats
(plain dataclasses)."""

from dataclasses import dataclass, field
from typing import Dict, List


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
