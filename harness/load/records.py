"""Raw per-request records: the contract between the load generator, metrics and the store.

Everything a summary reports is derived from these stamps (see k2bench.harness.measure.metrics),
so a stored run can always be re-summarised. Stamps are client-side monotonic nanoseconds
(time.monotonic_ns) taken when each SSE message arrived, before any parsing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    index: int  # position within its level (warmup requests included)
    concurrency: int  # closed: requests in flight; rate: the in-flight cap (see openloop)
    warmup: bool
    requested_input_tokens: int  # prompt length the workload asked for
    requested_output_tokens: int  # max_tokens = min_tokens = OSL
    send_ns: int  # just before the request was written to the connection
    token_ns: list[int] = field(default_factory=list)  # arrival of each token-carrying SSE message
    end_ns: int | None = None  # stream finished (after the usage-only tail, if any)
    prompt_tokens: int | None = None  # server's usage.prompt_tokens
    output_tokens: int | None = None  # server's usage.completion_tokens (never replaced by a count)
    success: bool = False
    error: str | None = None  # first error message, for failed requests
    cached_tokens: int | None = None  # server's usage.prompt_tokens_details.cached_tokens (prefix-cache hits)
    session: int | None = None  # conversations: which session (user) the request belongs to
    turn: int | None = None  # conversations: its turn in the session, from 1
    # rate levels (k2bench.harness.load.openloop); None in closed-loop levels
    mode: str = "closed"  # its level's kind: "closed" (N in flight) or "rate" (sent on a schedule)
    rate: float | None = None  # its level's requests/s as asked (inf: all at once); None when closed
    intended_ns: int | None = None  # when the schedule said to send it (same clock as send_ns)
    queue_ns: int | None = None  # time held back by the in-flight cap (0 when not held)

    @property
    def osl_mismatch(self) -> bool:
        """True when the server reports a different output length than was asked for."""
        return self.success and self.output_tokens is not None and self.output_tokens != self.requested_output_tokens
