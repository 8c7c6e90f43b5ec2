"""A busy model's hot requests handled a window at a time (the default mode's lanes).

In the exact mode every request is two events: it arrives and takes the least-loaded
ready replica with a free slot (or waits), and its answer frees the slot. At 10,000
requests a second that is most of a run's cost, while the controller looks at a model
only at its ticks, and then only at counts: arrivals, requests in flight and queued,
the last request's time, the first TTFT samples. A lane takes a model's arrivals out of
the one-at-a-time stream while the model has a ready replica and no queue, and handles
them in bulk between the moments anything else reads or changes the model: the
controller's ticks, a replica of it joining the rotation or leaving it, the end of a
chunk of the trace. In between nothing else touches the model, and a request that finds
a free slot is answered at its own pace (its first token after its prefill, its answer
``tpot_s`` per output token later), whichever replica serves it. So a window's
admissions, answers, TTFTs and counts are array arithmetic, the same numbers the exact
mode finds one at a time.

A request finds a free slot while fewer than ``ready replicas x max_concurrency`` are in
flight on the ready replicas (the least-loaded replica has room exactly then). The lane
counts, for each arrival of the window ahead, the requests still in flight when it comes
(:func:`in_flight_at`); the first arrival that would find every slot full is its barrier:
there the lane stops, that request and the model's later ones go back to the
one-at-a-time path, which queues them, and the requests in flight go back to the event
heap. A lane also stops when its model's last ready replica leaves the rotation (the next
request is a cold start, which wakes the controller at once). A model takes a lane again
when a chunk of the trace starts, if it is busy enough in it (:data:`LANE_MIN_ARRIVALS`).

What differs from the exact mode is which replica serves which request: a window's
arrivals fill the least-loaded replicas as they were loaded at the window's start
(:func:`fill`), not as each arrival finds them. The controller never reads it; it only
shows when a replica with requests in flight leaves the rotation: how long it drains
(those requests go back to the event heap and finish there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from simulator.clock import DONE, INF
from thaw.wire import MAX_TTFT_SAMPLES

if TYPE_CHECKING:
    from simulator.fleet import SimWorker
    from simulator.traffic import SimModel, Traffic

# A model takes a lane for a chunk where it has at least this many arrivals (fewer are
# cheaper one at a time than the lane's array work per window).
LANE_MIN_ARRIVALS = 256

_EMPTY_F = np.empty(0, dtype=np.float64)
_EMPTY_I = np.empty(0, dtype=np.int64)


def in_flight_at(arrivals: np.ndarray, done: np.ndarray, before: np.ndarray) -> np.ndarray:
    """How many requests are in flight as each of ``arrivals`` (sorted) comes, if every
    earlier one of them was admitted: those of ``before`` (done times of requests already
    in flight) and of ``done`` (the arrivals' own done times) not done by then. A request
    done at the very instant of an arrival is done before it (answers come first, as in
    the event heap)."""
    n = len(arrivals)
    # A done time d is at or before arrival j exactly when searchsorted(left) <= j.
    gone_before = np.bincount(np.searchsorted(arrivals, before, "left"), minlength=n + 1)[:n].cumsum()
    gone_own = np.bincount(np.searchsorted(arrivals, done, "left"), minlength=n + 1)[:n].cumsum()
    return len(before) - gone_before + np.arange(n) - gone_own


def fill(counts: np.ndarray, n: int) -> np.ndarray:
    """The replica each of ``n`` arrivals goes to, when each takes the replica with the
    fewest requests in flight (the first in rotation order of those) and none finishes
    meanwhile: ``counts`` are the replicas' requests in flight, in rotation order (as
    of the window's start: answers due in the window are freed at its end)."""
    k = len(counts)
    order = np.argsort(counts, kind="stable")
    cs = counts[order]
    # Raising the lowest j replicas to the j-th lowest's level costs cost[j - 1].
    cost = cs * np.arange(1, k + 1) - np.cumsum(cs)
    j = int(np.searchsorted(cost, n, "right"))  # the replicas that get any (>= 1)
    level = int(cs[j - 1]) + (n - int(cost[j - 1])) // j
    extra = (n - int(cost[j - 1])) % j
    low = order[:j]
    quota = np.zeros(k, dtype=np.int64)
    quota[low] = level - counts[low]
    # At one level, the first in rotation order first.
    quota[np.sort(low)[:extra]] += 1
    who = np.repeat(np.arange(k), quota)
    starts = np.repeat(np.cumsum(quota) - quota, quota)
    levels = np.repeat(counts, quota) + (np.arange(n) - starts)
    # Slots by level, then rotation order: the order least-loaded picks take them (a
    # stable sort of 16-bit levels is a radix sort).
    small = levels.astype(np.int16) if int(levels.max()) < 1 << 15 else levels
    return who[np.argsort(small, kind="stable")]


class Lane:
    """One model's hot requests in bulk: its arrivals of the chunk being read (from
    ``c`` on), the requests it has in flight (done times and replica, in no order), each
    replica's count, and how far it may go before something must look (``at``)."""

    __slots__ = ("m", "tr", "rows", "a", "inp", "out", "c", "clear_to", "at", "full", "ws", "cnt", "done", "who",
                 "planned")

    def __init__(self, m: SimModel, tr: Traffic) -> None:
        self.m, self.tr = m, tr
        self.rows, self.a, self.inp, self.out = _EMPTY_I, _EMPTY_F, _EMPTY_F, _EMPTY_F
        self.c = 0
        self.clear_to = 0  # arrivals before this index find a free slot (as planned)
        self.at = INF  # when it must be brought up to date
        self.full = False  # at ``at`` an arrival finds every slot full: the lane stops there
        self.ws: list[SimWorker] = list(m.ready)
        self.cnt = np.array([w.inflight for w in self.ws], dtype=np.int64)
        self.done, self.who = _EMPTY_F, _EMPTY_I
        self.planned = False

    # -- arrivals and replicas ----------------------------------------------------------

    def take(self, rows: np.ndarray, t: np.ndarray, inp: np.ndarray, out: np.ndarray) -> None:
        """The model's arrivals in the chunk now read (its rows, times and tokens)."""
        self.rows, self.a, self.inp, self.out = rows, t, inp, out
        self.c = self.clear_to = 0
        self.planned = False

    def adopt(self, done: list[float], ws: list[SimWorker]) -> None:
        """Requests in flight taken from the event heap: their done times and replicas."""
        index = {w: k for k, w in enumerate(self.ws)}
        self.done = np.concatenate([self.done, np.asarray(done, dtype=np.float64)])
        self.who = np.concatenate([self.who, np.asarray([index[w] for w in ws], dtype=np.int64)])

    def join(self, w: SimWorker) -> None:
        """``w`` is ready: last in the rotation."""
        self.ws.append(w)
        self.cnt = np.append(self.cnt, w.inflight)
        self.planned = False

    def leave(self, w: SimWorker) -> None:
        """``w`` leaves the rotation: its requests in flight finish on the event heap."""
        k = self.ws.index(w)
        mine = self.who == k
        clock = self.tr.clock
        for d in self.done[mine].tolist():
            clock.push(d, DONE, w)
        keep = ~mine
        self.done, self.who = self.done[keep], self.who[keep]
        self.who[self.who > k] -= 1
        w.inflight = int(self.cnt[k])
        del self.ws[k]
        self.cnt = np.delete(self.cnt, k)
        self.planned = False
        if not self.ws:
            # The next request is a cold start: one at a time, it wakes the controller.
            self.tr.stopped(self)

    def stop(self) -> np.ndarray:
        """Back to one request at a time: every request in flight to the event heap, each
        replica's count to it (``Traffic.stopped`` rebuilds the model's slot heap from
        them); the chunk's rows it had not reached."""
        clock = self.tr.clock
        for d, k in zip(self.done.tolist(), self.who.tolist(), strict=True):
            clock.push(d, DONE, self.ws[k])
        for w, k in zip(self.ws, self.cnt.tolist(), strict=True):
            w.inflight = k
        self.done, self.who = _EMPTY_F, _EMPTY_I
        rest = self.rows[self.c:]
        self.rows, self.a, self.inp, self.out = _EMPTY_I, _EMPTY_F, _EMPTY_F, _EMPTY_F
        self.c = 0
        return rest

    @property
    def consumed(self) -> bool:
        """Every arrival of the chunk is handled."""
        return self.c >= len(self.a)

    # -- planning and catching up ------------------------------------------------------

    def plan(self, tick_due: Callable[[float], float], chunk_end: float) -> None:
        """Find ``at``: the tick that would see its next arrival or answer (capped at the
        chunk's end while arrivals remain), or sooner the first arrival to find every slot
        full, assuming its replicas stay as they are until then (anything that changes
        them brings the lane up to date first)."""
        self.planned = True
        self.full = False
        nxt = self.a[self.c] if self.c < len(self.a) else INF
        first = min(nxt, float(self.done.min()) if len(self.done) else INF)
        if first == INF:
            self.at, self.clear_to = INF, self.c
            return
        horizon = tick_due(first)
        if nxt != INF:
            horizon = min(horizon, chunk_end)
        hi = int(np.searchsorted(self.a, horizon, "right"))
        self.at, self.clear_to = horizon, hi
        n = hi - self.c
        if n == 0:
            return
        slots = len(self.ws) * self.m.max_conc
        if len(self.done) + n < slots:
            return  # even with no answer meanwhile, every one finds a slot
        a = self.a[self.c:hi]
        busy = in_flight_at(a, self._done_of(self.c, hi), self.done)
        over = np.flatnonzero(busy >= slots)
        if len(over):
            j = int(over[0])
            self.at, self.clear_to, self.full = float(a[j]), self.c + j, True

    def _prefill(self, lo: int, hi: int) -> np.ndarray:
        """Arrivals ``lo:hi``'s prefill: the TTFT of each, admitted as it comes."""
        return self.inp[lo:hi] / self.m.prefill_tps

    def _done_of(self, lo: int, hi: int, prefill: np.ndarray | None = None) -> np.ndarray:
        """When arrivals ``lo:hi``, admitted as they come, are answered (the same sum as
        ``Traffic.admit``: arrival, plus prefill, plus the output tokens' time)."""
        if prefill is None:
            prefill = self._prefill(lo, hi)
        return (self.a[lo:hi] + prefill) + self.out[lo:hi] * self.m.tpot_s

    def catch_up(self, t: float, *, arrivals_at_t: bool = True) -> float:
        """Handle its arrivals up to ``t`` (those at ``t`` too unless not
        ``arrivals_at_t``) and its answers up to ``t``; the time of the last of them
        (-INF: none)."""
        m, tr = self.m, self.tr
        hi = int(np.searchsorted(self.a, t, "right" if arrivals_at_t else "left"))
        hi = min(hi, self.clear_to)
        last = -INF
        n = hi - self.c
        if n > 0:
            lo = self.c
            self.c = hi
            last = float(self.a[hi - 1])
            ttft = self._prefill(lo, hi)
            done = self._done_of(lo, hi, ttft)
            who = fill(self.cnt, n)
            self.cnt += np.bincount(who, minlength=len(self.ws))
            self.done = np.concatenate([self.done, done])
            self.who = np.concatenate([self.who, who])
            st = m.stats
            st.requests += n
            st.ttfts.add_many(ttft)
            st.slo_met += int(np.count_nonzero(ttft <= m.slo_s))
            room = MAX_TTFT_SAMPLES - len(m.hot_ttfts)
            if room > 0:
                m.hot_ttfts.extend(ttft[:room].tolist())
            m.arrivals += n
            m.in_flight += n
            tr.open_requests += n
            tr.laned += n
        last = max(last, self._answer(t))
        if last > -INF:
            m.last_request_at = last if m.last_request_at is None else max(m.last_request_at, last)
            tr.changes.touched.add(m)
            self.planned = False
        return last

    def _answer(self, t: float) -> float:
        """The answers due by ``t``: their slots freed; the last one's time (-INF: none)."""
        done = self.done
        if not len(done):
            return -INF
        gone = done <= t
        k = int(np.count_nonzero(gone))
        if not k:
            return -INF
        last = float(done[gone].max())
        self.cnt -= np.bincount(self.who[gone], minlength=len(self.ws))
        keep = ~gone
        self.done, self.who = done[keep], self.who[keep]
        self.m.in_flight -= k
        self.tr.open_requests -= k
        return last
