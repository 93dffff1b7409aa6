"""Serve's fast path (cluster/fastpath.py): what `vaultvec serve` sets when it is on."""

from __future__ import annotations

import os

import pytest

from cluster import fastpath


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*fastpath.ENV, *fastpath.PORTS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_applied_it_sets_every_switch(clean_env: pytest.MonkeyPatch) -> None:
    assert fastpath.apply() == fastpath.ENV


def test_each_service_gets_its_own_haproxy_ports(clean_env: pytest.MonkeyPatch) -> None:
    fastpath.apply()
    ports = {os.environ[name] for name in fastpath.PORTS}
    assert len(ports) == 2 and not ports & {"8404", "9101"}
    assert not set(fastpath.without_ports(dict(os.environ))) & set(fastpath.PORTS)


def test_a_switch_set_in_the_environment_is_kept(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    used = fastpath.apply()
    assert used["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    assert used["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


def test_turned_off_it_leaves_serve_stock(clean_env: pytest.MonkeyPatch) -> None:
    assert set(fastpath.apply(enabled=False).values()) == {"0"}
