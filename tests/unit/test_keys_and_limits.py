"""Named API keys (serve_app/access/keys.py), the limits of each (serve_app/settings.py: quotas) and the
token buckets that enforce request rates (serve_app/access/limits.py)."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from serve_app.access import keys
from serve_app.access.limits import RateLimiter
from serve_app.settings import Settings


def test_entries_are_name_colon_key_or_a_bare_key_named_by_its_fingerprint() -> None:
    parsed = keys.parse_all(["alice:s3cret", "bare-key"])
    assert parsed[0] == keys.ApiKey("alice", b"s3cret")
    assert parsed[1].name == "key-" + hashlib.sha256(b"bare-key").hexdigest()[:8]
    assert "s3cret" not in repr(parsed) and "bare-key" not in repr(parsed)


@pytest.mark.parametrize(
    "entries",
    [
        ["a:x", "a:y"],
        ["a:x", "b:x"],
        ["bad name:x"],
        ["a:"],
        [":x"],
        ["n" * 65 + ":x"],
        ["cdbk_0000"],  # the prefix of per-index user keys
        ["ops:cdbk_0000"],
    ],
)
def test_bad_key_entries_are_refused(entries: list[str]) -> None:
    with pytest.raises(ValueError):
        keys.parse_all(entries)
    with pytest.raises(ValidationError):
        Settings(api_key=entries)


def test_match_finds_the_key_and_only_an_exact_one() -> None:
    parsed = keys.parse_all(["alice:aaaa", "bob:bbbb"])
    assert keys.match(b"bbbb", parsed) == parsed[1]
    assert keys.match(b"bbb", parsed) is None and keys.match(b"bbbbb", parsed) is None


def test_api_keys_from_a_file_with_names(tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_text("alice:one\nbob:two\n")
    assert [k.name for k in Settings(api_key_file=str(path)).api_keys()] == ["alice", "bob"]


def test_a_key_s_own_quota_overrides_the_service_wide_limits() -> None:
    s = Settings(
        api_key=["alice:a", "bob:b"],
        rate_limit_rps=10,
        max_items_per_index=1000,
        quotas='{"alice": {"rate_limit_rps": 2.5, "max_indexes_per_key": 3}}',
    )
    alice, bob = s.limits("alice"), s.limits("bob")
    assert (alice.rate_limit_rps, alice.rate_limit_burst) == (2.5, 3)  # a second's, rounded up
    assert (alice.max_indexes_per_key, alice.max_items_per_index) == (3, 1000)
    assert (bob.rate_limit_rps, bob.rate_limit_burst, bob.max_indexes_per_key) == (10, 10, 0)
    with pytest.raises(ValidationError):
        Settings(quotas={"alice": {"rate_limit_rsp": 1}})  # a misspelt limit is an error


def test_the_bucket_lets_a_burst_through_then_the_rate() -> None:
    clock = [0.0]
    limiter = RateLimiter(
        Settings(rate_limit_rps=4, rate_limit_burst=2).limits, replicas=1, clock=lambda: clock[0]
    )
    assert [limiter.wait("k") for _ in range(3)] == [0, 0, 1]
    clock[0] += 0.25  # one token at 4/s
    assert [limiter.wait("k"), limiter.wait("k")] == [0, 1]
    assert limiter.wait("other") == 0  # buckets are per key


def test_each_replica_takes_its_share_of_the_rate() -> None:
    clock = [0.0]
    limits = Settings(rate_limit_rps=10, rate_limit_burst=10).limits
    limiter = RateLimiter(limits, replicas=2, clock=lambda: clock[0])
    assert sum(limiter.wait("k") == 0 for _ in range(20)) == 5  # half the burst here
    clock[0] += 1.0
    assert sum(limiter.wait("k") == 0 for _ in range(20)) == 5  # half the rate


def test_no_rate_no_bucket() -> None:
    limiter = RateLimiter(Settings().limits)
    assert all(limiter.wait("k") == 0 for _ in range(1000))
