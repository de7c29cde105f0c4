"""Errors of the remote layer, told apart so callers never mistake one for another."""

from __future__ import annotations


class RemoteError(Exception):
    """Base class: something went wrong talking to a host (not the command's own exit)."""


class HostUnreachable(RemoteError):
    """Transient failures (refused, reset, banner timeout, EOF in handshake) outlived the retries."""


class HostKeyMismatch(RemoteError):
    """The host presented a key other than the pinned or recorded one: never accepted."""


class AuthFailed(RemoteError):
    """The host refused our key."""


class CommandTimeout(RemoteError):
    """The command ran longer than its timeout; the channel was closed."""
