"""One model's traffic at this activator, as the controller's autoscaler hears of it:
requests accepted (a counter), in flight, the last one's time, and a bounded sample of
hot times to first byte since the last report.

The service reports each request's life through ``activator.routing.router``, the only
writer of these counts.
"""

from __future__ import annotations

from thaw.wire import MAX_TTFT_SAMPLES, ModelActivityReport


class ModelActivity:
    def __init__(self) -> None:
        self.arrivals = 0
        self.in_flight = 0
        self.last_request_at: float | None = None
        self._ttfts: list[float] = []

    def arrived(self, now: float) -> None:
        self.last_request_at = now
        self.arrivals += 1

    def started(self) -> None:
        self.in_flight += 1

    def ended(self, now: float) -> None:
        self.in_flight -= 1
        self.last_request_at = now

    def note_ttft(self, seconds: float) -> None:
        if len(self._ttfts) < MAX_TTFT_SAMPLES:
            self._ttfts.append(seconds)

    def report(self, queued: int) -> ModelActivityReport:
        """The model's report; takes the TTFT samples it carries (a report that fails to
        arrive loses those samples, never the arrival counts)."""
        ttfts, self._ttfts = self._ttfts, []
        return ModelActivityReport(queued=queued, in_flight=self.in_flight, last_request_at=self.last_request_at,
                                   arrivals=self.arrivals, ttft_s=ttfts)
