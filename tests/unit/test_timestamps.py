"""Kubernetes times, read and written in one place (contract/timestamps.py)."""

from datetime import UTC, datetime

from kimik3_operator.contract import timestamps


def test_a_time_the_api_server_wrote_reads_back_as_the_same_moment() -> None:
    assert timestamps.parse("2026-12-03T01:10:04Z") == datetime(2026, 12, 3, 1, 10, 4, tzinfo=UTC)
    assert timestamps.parse("2026-12-03T01:10:04.250000Z") == datetime(2026, 12, 3, 1, 10, 4, 250000, tzinfo=UTC)
    moment = datetime(2026, 1, 2, tzinfo=UTC)
    assert timestamps.parse(moment) is moment  # the client library's own datetimes pass through


def test_what_is_not_a_time_is_none_not_an_error() -> None:
    for value in (None, "", "yesterday", 1733187004, {"time": "x"}):
        assert timestamps.parse(value) is None
        assert timestamps.seconds(value) is None


def test_a_stamp_is_whole_seconds_in_utc_and_parses_back() -> None:
    written = timestamps.stamp(1733187004.9)
    assert written == "2024-12-03T00:50:04Z"
    assert timestamps.seconds(written) == 1733187004.0
