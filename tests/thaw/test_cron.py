"""Cron expressions: parsing, and the fire times either side of a moment (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from thaw.cron import CronError, parse


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("expr", "now", "last", "next_"), [
    # 09:00 every day.
    ("0 9 * * *", "2026-12-03T08:59:59", "2026-12-02T09:00", "2026-12-03T09:00"),
    ("0 9 * * *", "2026-12-03T09:00:00", "2026-12-03T09:00", "2026-12-04T09:00"),
    ("0 9 * * *", "2026-12-03T09:00:30", "2026-12-03T09:00", "2026-12-04T09:00"),
    # Every 15 minutes from minute 5: 5, 20, 35, 50.
    ("5/15 * * * *", "2026-12-03T10:34:00", "2026-12-03T10:20", "2026-12-03T10:35"),
    ("*/20 8-10 * * *", "2026-12-03T10:59:00", "2026-12-03T10:40", "2026-12-04T08:00"),
    # Weekdays at 08:30 (2026-12-03 is a Thursday; 12-05 a Saturday).
    ("30 8 * * 1-5", "2026-12-05T12:00:00", "2026-12-04T08:30", "2026-12-07T08:30"),
    # Sunday as 0 and as 7.
    ("0 0 * * 0", "2026-12-03T00:00:00", "2026-11-29T00:00", "2026-12-06T00:00"),
    ("0 0 * * 7", "2026-12-03T00:00:00", "2026-11-29T00:00", "2026-12-06T00:00"),
    # Both day fields restricted: either matches (the 1st, or any Monday).
    ("0 12 1 * 1", "2026-12-02T00:00:00", "2026-12-01T12:00", "2026-12-07T12:00"),
    # The 29th of February: years apart.
    ("0 0 29 2 *", "2026-12-03T00:00:00", "2024-02-29T00:00", "2028-02-29T00:00"),
    # Lists.
    ("0,30 9,17 * 1,12 *", "2026-12-03T12:00:00", "2026-12-03T09:30", "2026-12-03T17:00"),
])
def test_fire_times(expr: str, now: str, last: str, next_: str) -> None:
    cron = parse(expr)
    assert cron.last_fire(ts(now)) == ts(last)
    assert cron.next_fire(ts(now)) == ts(next_)


@pytest.mark.parametrize(("expr", "says"), [
    ("0 9 * *", "5 fields"),
    ("0 9 * * * *", "5 fields"),
    ("60 9 * * *", "minute: '60' is outside 0-59"),
    ("0 24 * * *", "hour: '24' is outside 0-23"),
    ("0 9 0 * *", "day of month: '0' is outside 1-31"),
    ("0 9 * 13 *", "month: '13' is outside 1-12"),
    ("0 9 * * 8", "day of week: '8' is outside 0-7"),
    ("0 9 * * mon", "day of week: 'mon' is not a number"),
    ("*/0 9 * * *", "minute: step '0'"),
    ("0 17-9 * * *", "hour: range '17-9' runs backwards"),
    ("@daily", "5 fields"),
    ("0 0 31 2 *", "no month it names has day 31"),
])
def test_bad_expressions_say_which_field(expr: str, says: str) -> None:
    with pytest.raises(CronError) as err:
        parse(expr)
    assert says in str(err.value)
