"""Remote execution on TPU hosts over SSH (paramiko): setup modules, detached command,
status probe with incremental output fetch and pattern scan, stop.

    runner = RemoteRunner(private_key_path=..., known_hosts_path=..., log_dir=...)
    runner.setup(job, attempt, hosts, spec); runner.start(...); runner.probe(...); runner.stop(...)
"""

from reconciler.remote.errors import (
    AuthFailed,
    ChannelLost,
    CommandTimeout,
    HostKeyMismatch,
    HostUnreachable,
    RemoteError,
    StartFailed,
)
from reconciler.remote.patterns import DEFAULT_PATTERNS, classify
from reconciler.remote.runner import RemoteRunner
from reconciler.remote.types import CommandResult, Host, HostStatus, SetupReport

__all__ = [
    "DEFAULT_PATTERNS", "AuthFailed", "ChannelLost", "CommandResult", "CommandTimeout", "Host", "HostKeyMismatch",
    "HostStatus", "HostUnreachable", "RemoteError", "RemoteRunner", "SetupReport", "StartFailed", "classify",
]
