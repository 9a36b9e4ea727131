import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import carpool  # noqa: E402
from fake_router import FakeRouter, echo_handler  # noqa: E402


@pytest.fixture
def fake_router():
    router = FakeRouter(echo_handler)
    yield router
    router.stop()


@pytest.fixture
def client(fake_router):
    c = carpool.Client(fake_router.url, timeout=10)
    yield c
    c.close()
