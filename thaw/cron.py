"""Cron expressions for scheduled pre-warm (``models[].prewarm[].cron``). Pure: time in,
time out, in UTC seconds since the epoch.

Five fields, ``minute hour day-of-month month day-of-week``, each ``*``, a number, a
range ``a-b``, a step ``*/n`` or ``a-b/n``, or a comma list of those. Day of week is
0-6 from Sunday (7 is Sunday too). As in Vixie cron, when both day fields are
restricted a day matches either. No names, no ``@daily``: what the expression means is
what it says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# (name, lowest, highest) per field, in order.
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
# How far a search looks: a valid expression (say 29 February on a Monday) can be
# years from a match; one that never matches (31 February) is reported as none.
_SEARCH_DAYS = 366 * 8
# The most days each month can have (February in a leap year).
_MONTH_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(ValueError):
    pass


def _field(text: str, name: str, lo: int, hi: int) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{name}: step {step_text!r} is not a whole number > 0")
            step = int(step_text)
        if body == "*":
            first, last = lo, hi
        else:
            a, dash, b = body.partition("-")
            if not a.isdigit() or (dash and not b.isdigit()):
                raise CronError(f"{name}: {part!r} is not a number, a range a-b, * or a step")
            first, last = int(a), int(b) if dash else int(a)
            if step_text and not dash:
                last = hi  # "5/15": from 5 on, every 15
            if not lo <= first <= hi or not lo <= last <= hi:
                raise CronError(f"{name}: {part!r} is outside {lo}-{hi}")
            if first > last:
                raise CronError(f"{name}: range {part!r} runs backwards")
        out.update(range(first, last + 1, step))
    return frozenset(out)


@dataclass(frozen=True)
class Cron:
    text: str
    minutes: tuple[int, ...]  # ascending
    hours: tuple[int, ...]  # ascending
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is *
    any_weekday: bool  # day of week is *

    def _day_matches(self, d: datetime) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.weekday() + 1) % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def last_fire(self, now: float) -> float | None:
        """The latest time at or before ``now`` the expression fires (to the minute),
        within :data:`_SEARCH_DAYS`; None when there is none."""
        t = datetime.fromtimestamp(math.floor(now / 60) * 60, UTC)
        day = t.replace(hour=0, minute=0)
        for back in range(_SEARCH_DAYS):
            d = day - timedelta(days=back)
            if not self._day_matches(d):
                continue
            for hour in reversed(self.hours):
                for minute in reversed(self.minutes):
                    at = d.replace(hour=hour, minute=minute)
                    if at <= t:
                        return at.timestamp()
        return None

    def next_fire(self, after: float) -> float | None:
        """The earliest time strictly after ``after`` the expression fires, within
        :data:`_SEARCH_DAYS`; None when there is none."""
        t = datetime.fromtimestamp(after, UTC)
        day = t.replace(hour=0, minute=0, second=0, microsecond=0)
        for ahead in range(_SEARCH_DAYS):
            d = day + timedelta(days=ahead)
            if not self._day_matches(d):
                continue
            for hour in self.hours:
                for minute in self.minutes:
                    at = d.replace(hour=hour, minute=minute)
                    if at.timestamp() > after:
                        return at.timestamp()
        return None


def parse(text: str) -> Cron:
    """The expression ``text``; raises :class:`CronError` saying which field is wrong."""
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"{text!r}: a cron expression has 5 fields (minute hour day-of-month month day-of-week), "
                        f"not {len(parts)}")
    sets = [_field(p, name, lo, hi) for p, (name, lo, hi) in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[4])
    days = sets[2]
    if parts[2] != "*" and not any(d <= max(_MONTH_DAYS[m] for m in sets[3]) for d in days):
        raise CronError(f"{text!r}: no month it names has day {min(days)}")
    return Cron(text, tuple(sorted(sets[0])), tuple(sorted(sets[1])), days, sets[3], weekdays, parts[2] == "*",
                parts[4] == "*")
