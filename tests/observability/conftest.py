"""Operating the services: real `ledger` processes scraped over HTTP on free ports, and
Prometheus's promtool on the shipped alert rules."""

from __future__ import annotations

import shutil
import socket

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    """The promtool binary (Debian's prometheus package; scripts/test-services.sh installs it)."""
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; scripts/test-services.sh does it)")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
