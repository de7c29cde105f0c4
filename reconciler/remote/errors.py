"""Errors of the remote layer, told apart so callers never mistake one for another."""

from __future__ import annotations


class RemoteError(Exception):
    """Base class: something went wrong talking to a host (not the command's own exit)."""


class HostUnreachable(RemoteError):
    """Transient failures (refused, reset, banner timeout, EOF in handshake) outlived the retries."""


class ChannelLost(HostUnreachable):
    """The channel or connection closed before the command's exit status arrived: the command
    may or may not have run. Only idempotent commands may be sent again."""


class HostKeyMismatch(RemoteError):
    """The host presented a key other than the pinned or recorded one: never accepted."""


class AuthFailed(RemoteError):
    """The host refused our key."""


class CommandTimeout(RemoteError):
    """The command ran longer than its timeout; the channel was closed."""


class StartFailed(RemoteError):
    """Some hosts did not start. `pids` holds those that did, `errors` the others' reasons;
    starting the same attempt again is safe: started hosts answer with their existing pid."""

    def __init__(self, pids: dict[int, int], errors: dict[int, str]) -> None:
        detail = "; ".join(f"worker {w}: {e}" for w, e in sorted(errors.items()))
        super().__init__(f"start failed on {len(errors)} host(s): {detail}")
        self.pids = pids
        self.errors = errors
