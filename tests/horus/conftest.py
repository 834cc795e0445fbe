"""Fixtures for the Horus tests (plain pytest, no Django); builders are in ``helpers``."""

from __future__ import annotations

import pytest

from scheduling.horus.cluster import ClusterSpec, NodeSpec


@pytest.fixture
def small_spec() -> ClusterSpec:
    """Two nodes of two 16 GB GPUs."""
    return ClusterSpec.uniform(2, 2, gpu_model="V100", gpu_mem_mb=16384.0)


@pytest.fixture
def milli_spec() -> ClusterSpec:
    """Alibaba-like: GPU sharing by gpu_milli enforced, two nodes (2 and 4 GPUs)."""
    return ClusterSpec((NodeSpec("a", 2, "V100", 16384.0), NodeSpec("b", 4, "V100", 16384.0)), "milli", enforce_milli=True)
