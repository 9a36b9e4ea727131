"""Failover between routers, shared by Client and AsyncClient (docs/cluster.md, "Two routers"):
the endpoint list, and what each open call needs to be sent to the next router when its router
is lost (its request, whether it may be sent again, the token ids its chunks carried, its
failovers so far)."""

import random
from typing import Any, List, Optional, Sequence, Union

from . import _wire
from . import errors

# Batch calls that change nothing: with several routers, sent again after a router is lost.
READ_ONLY_BATCH_OPS = frozenset(("get_file", "file_content", "get_batch", "list_batches"))


def router_urls(url: Union[str, Sequence[str]]) -> List[str]:
    """The routers of a client's `url`: one endpoint, several separated by commas, or a list
    of them (blanks trimmed). InvalidArgument for an empty one."""
    parts = url.split(",") if isinstance(url, str) else list(url)
    urls = [str(u).strip() for u in parts]
    if not urls or any(not u for u in urls):
        raise errors.InvalidArgument("url %r has an empty endpoint: give one router endpoint, "
                                     "several separated by commas, or a list" % (url,))
    return urls


def next_url(urls: Sequence[str], url: str) -> str:
    """The router after `url` in `urls` (round the list)."""
    return urls[(list(urls).index(url) + 1) % len(urls)]


def seeded(frame: bytes, failover: bool) -> bytes:
    """`frame` as a client with several routers sends it: a generate without a seed gets one
    drawn here, so a stream resumed on the other router is the one the lost router was
    producing. With one router: `frame` unchanged."""
    return _wire.seeded_frame(frame, random.getrandbits(64)) if failover else frame


def lost_why(url: str, why: str = "") -> str:
    """Why the calls open on the router at `url` were lost (`why`, or a dropped connection)."""
    return why or ("lost the connection to the router at %s with the request open (the router "
                   "closed it, died or stopped answering ZMTP heartbeats)" % url)


class Call:
    """One call in flight, as failover sees it. Subclasses add how its answers are delivered."""
    __slots__ = ("request_id", "frame", "resend", "tokens", "failovers")

    def __init__(self, request_id: str, frame: bytes = b"", resend: bool = False) -> None:
        self.request_id = request_id
        # The request, whether it may be sent to the next router when its router is lost, the
        # token ids its chunks carried so far and its failovers.
        self.frame = frame
        self.resend = resend
        self.tokens: List[int] = []
        self.failovers = 0

    def received(self, kind: str, msg: Any) -> None:
        """Notes a message routed to the call (a chunk's token ids are kept for a resume)."""
        if kind == "chunk":
            self.tokens.extend(t.id for t in msg.chunk.tokens)

    def failover_frame(self, routers: int) -> Optional[bytes]:
        """The frame to send to the next router now that the call's router is lost, counting a
        failover; None when the call ends with RouterLost instead: one router only, a call that
        must not be sent again, one sent to every router already, or a stream whose tokens are
        all it asked for (only its final was lost)."""
        if routers < 2 or not self.resend or self.failovers >= routers:
            return None
        frame = _wire.resume_frame(self.frame, self.tokens) if self.tokens else self.frame
        if frame is not None:
            self.failovers += 1
        return frame
