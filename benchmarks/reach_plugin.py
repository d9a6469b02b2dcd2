"""pytest plugin for benchmarks/backend_coverage.py: each test's call phase
measured by etprop's reach meter (etprop/lowering/reach.py), one context per
test, exactly as a campaign measures each example. ETPROP_ANCHOR_EVERY=N runs
every N-th collected test only."""

import os

import pytest

from etprop.lowering import reach


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # The test's file by absolute path: benchmarks/sut_mutation.py runs it again from anywhere.
    # The whole call is one window: a test exports, quantizes, lowers and runs in one go.
    with reach.measured(f"{item.path}::{item.nodeid.partition('::')[2]}"), reach.measuring():
        yield


def pytest_collection_modifyitems(config, items):
    every = int(os.environ.get("ETPROP_ANCHOR_EVERY", "1"))
    if every > 1:
        dropped = [item for index, item in enumerate(items) if index % every]
        items[:] = items[::every]
        config.hook.pytest_deselected(items=dropped)
