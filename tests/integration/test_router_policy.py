"""The vLLM router starts with the policy and thresholds governor gives it (no engines needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.pool import free_port
from engines.router import RouterClient, start_router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SPEC = "cache_aware,cache_threshold=0.5,balance_abs_threshold=4,balance_rel_threshold=1.2"


async def test_the_router_runs_with_cache_aware_and_its_thresholds(tmp_path: Path) -> None:
    router = start_router(free_port(), free_port(), tmp_path / "router.log", SPEC)
    client = RouterClient(router.url)
    try:
        await router.wait_healthy()
        assert await client.list_workers() == []
        # the router logs the policy it runs (its process title hides the arguments)
        want = "CacheAware { cache_threshold: 0.5, balance_abs_threshold: 4, balance_rel_threshold: 1.2"
        assert want in (tmp_path / "router.log").read_text(), router.tail()
    finally:
        await client.close()
        router.stop()


def test_a_bad_policy_starts_no_router(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        start_router(free_port(), free_port(), tmp_path / "router.log", "cache_aware,balance_rel_threshold=0")
    assert not (tmp_path / "router.log").exists()
