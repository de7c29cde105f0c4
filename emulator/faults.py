"""The faults armed in the emulated API, and the log of every fault the emulator injected.

What a test or `ledger chaos` arms here answers instead of the API: the next calls of a
method refused (`fail_calls`), the whole API down (`outage`), the next creations failing in
their operation (`fail_creations`), the next mutating call's operation failing
(`fail_next_operation`), creations slowed down (`slow_creations`). The faults that change the
world itself (a preemption, a host killed, capacity gone) are the cloud's (emulator.cloud),
which logs them here too. Thread-safe: one lock, never held while waiting on anything else.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from emulator.errors import ApiError, fault_error, status_code

# A call that hangs in an outage is answered (UNAVAILABLE) after this long at most, so a
# forgotten outage never holds the server's threads for good.
_HANG_LIMIT_S = 600.0


def _zone_in(request: Any) -> str:
    """The zone a request names (its parent or name), or ""."""
    for attr in ("parent", "name"):
        m = re.search(r"/locations/([^/]+)", getattr(request, attr, "") or "")
        if m:
            return m.group(1)
    return ""


def _take(armed: list[dict[str, Any]], matches: Any) -> dict[str, Any] | None:
    """The first armed fault `matches` accepts, one of its `remaining` uses spent."""
    for i, f in enumerate(armed):
        if matches(f):
            f["remaining"] -= 1
            if f["remaining"] <= 0:
                del armed[i]
            return f
    return None


class ArmedFaults:
    def __init__(self, log_path: Path) -> None:
        self._lock = threading.RLock()
        self.log: list[dict[str, Any]] = []  # every fault injected, as `GET /v1/faults` lists them
        self._log_path = log_path  # and as a JSON line each, for a run's report
        self._creations: list[dict[str, Any]] = []
        self._next_operation: dict[str, Any] | None = None
        self._calls: list[dict[str, Any]] = []
        self._outage: str | None = None
        self._outage_over = threading.Event()
        self.create_delay: float | None = None  # None: the configured timing

    def record(self, fault: str, **data: Any) -> dict[str, Any]:
        now = time.time()
        entry = {"time": now, "iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z", "fault": fault, **data}
        with self._lock:
            self.log.append(entry)
            with contextlib.suppress(OSError), self._log_path.open("a") as f:
                f.write(json.dumps(entry, sort_keys=True, default=str) + "\n")
        return entry

    # -- refused calls and outages: answered before the method runs --------------------------
    def fail_calls(self, method: str, code: str, *, n: int = 1, zone: str | None = None, reason: str = "",
                   message: str | None = None) -> None:
        """The next `n` calls of `method` ("CreateNode", or "*" for any; in `zone`, or any)
        are refused with `code`, as the API refuses a request before accepting it."""
        status_code(code)
        with self._lock:
            self._calls.append({"method": method, "code": code, "remaining": int(n), "zone": zone,
                                "reason": reason, "message": message})
            self.record("fail_calls", method=method, code=code, n=n, zone=zone, reason=reason)

    def outage(self, mode: str | None) -> None:
        """The whole API (gRPC and REST) goes down: "refuse" answers every call UNAVAILABLE,
        "hang" answers none until the outage ends; None (or "off") ends it."""
        mode = None if mode in (None, "", "off") else mode
        if mode not in (None, "refuse", "hang"):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "outage mode must be refuse, hang or off")
        with self._lock:
            self._outage = mode
            if mode is None:
                self._outage_over.set()
            else:
                self._outage_over.clear()
            self.record("outage", mode=mode or "off")

    def gate(self, method: str, request: Any) -> None:
        """Before every API call: an outage or an armed fault answers instead of the method."""
        fault = None
        with self._lock:
            mode = self._outage
            if mode is None:
                zone = _zone_in(request)
                fault = _take(self._calls, lambda f: f["method"] in ("*", method) and f["zone"] in (None, zone))
                if fault is not None:
                    self.record("call_refused", method=method, code=fault["code"], zone=zone)
        if mode == "hang":
            self._outage_over.wait(_HANG_LIMIT_S)
            mode = self._outage
        if mode == "refuse" or mode == "hang":
            raise ApiError(grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable.", reason="SERVICE_UNAVAILABLE",
                           domain="googleapis.com")
        if mode is None and fault is not None:
            resource = getattr(request, "parent", "") or getattr(request, "name", "")
            raise fault_error(fault["code"], method, resource, reason=fault["reason"], message=fault["message"])

    # -- accepted calls whose work fails ------------------------------------------------------
    def fail_creations(self, n: int = 1, *, zone: str | None = None, code: str = "INTERNAL", message: str | None = None,
                       reason: str = "") -> None:
        """The next `n` node creations (in `zone`, or any) fail after the creation delay: the
        call is accepted and its operation (or the queued resource) ends in this error."""
        status = status_code(code)
        with self._lock:
            default = "Internal error: the TPU could not be created. Please try again." if code == "INTERNAL" else None
            self._creations.append({"remaining": int(n), "zone": zone, "code": status, "message": message or default,
                                    "reason": reason})
            self.record("fail_creations", n=n, zone=zone, code=code, reason=reason)

    def take_creation(self, zone: str) -> dict[str, Any] | None:
        """The failure armed for a creation in `zone`, spent by this one, if any."""
        with self._lock:
            return _take(self._creations, lambda f: f["zone"] in (None, zone))

    def fail_next_operation(self, code: str = "INTERNAL", message: str | None = None) -> None:
        """The next mutating call returns an operation that ends with this error and changes nothing."""
        with self._lock:
            self._next_operation = {"code": grpc.StatusCode[code], "message": message or "Internal error. Please try again."}
            self.record("fail_next_operation", code=code)

    def take_next_operation(self, verb: str, target: str) -> dict[str, Any] | None:
        """The pending `fail_next_operation` fault, consumed by this operation, if any."""
        with self._lock:
            fault, self._next_operation = self._next_operation, None
            if fault is not None:
                self.record("operation_failed", verb=verb, target=target, code=fault["code"].name)
            return fault

    def slow_creations(self, seconds: float | None) -> None:
        """Creations take `seconds` from now on; None restores the configured timing."""
        with self._lock:
            self.create_delay = seconds
            self.record("slow_creations", seconds=seconds)
