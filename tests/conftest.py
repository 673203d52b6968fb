"""Shared test setup: hardware markers skip, with their reason, what this machine cannot run.

``@pytest.mark.cuda`` needs an NVIDIA GPU (skipped with "no NVIDIA GPU"), ``@pytest.mark.hip`` an
AMD GPU ("no AMD GPU").  Availability is probed once, only when a marked test is collected.
"""
import functools

import pytest


@functools.cache
def _have(marker: str) -> bool:
    if marker == "cuda":
        from taskmap.backends.cuda.driver import cuda_available

        return cuda_available()
    from taskmap.backends.hip.runtime import hip_available

    return hip_available()


_REASONS = {"cuda": "no NVIDIA GPU", "hip": "no AMD GPU"}


def pytest_runtest_setup(item):
    for marker, reason in _REASONS.items():
        if item.get_closest_marker(marker) is not None and not _have(marker):
            pytest.skip(reason)
