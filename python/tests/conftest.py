"""`--slow` runs the learning tests too (the slow tier, as `cargo test -- --include-ignored`)."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the learning tests")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a learning test, run with --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="a learning test: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
