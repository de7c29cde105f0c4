"""The control API over HTTP+JSON on localhost, for `ledger emulator preempt ...` and friends.

POST /v1/<verb> with a JSON object of keyword arguments; GET /v1/faults, /v1/status.
Verbs: preempt, maintenance, capacity, capacity-schedule, kill-host, fail-creations (in the operation),
fail-calls (in the call), outage (refuse | hang | off), slow-creations, fail-next-operation,
and the host-hygiene faults stale-process, stale-lock, unmount, fill-disk. Answers are JSON; an error is {"error": message, "code": name} with
HTTP 400 (bad request) or 404 (no such node).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import grpc

from emulator.cloud import Cloud
from emulator.errors import ApiError
from emulator.httpd import JsonHandler, JsonServer


def _verbs(cloud: Cloud) -> dict[str, Any]:
    return {
        "preempt": lambda a: {"delay": cloud.preempt(a["node"], at=a.get("at"), rate=a.get("rate"), state=a.get("state", "PREEMPTED"))},
        "maintenance": lambda a: cloud.maintenance_event(a["node"], duration=a.get("duration")),
        "capacity": lambda a: cloud.set_capacity(a["zone"], a["family"], a.get("chips"), a.get("pricing")),
        "capacity-schedule": lambda a: {"steps": cloud.capacity_schedule(list(a.get("steps") or []), repeat_s=a.get("repeat_s"))},
        "kill-host": lambda a: cloud.kill_host(a["node"], int(a["worker"])),
        "fail-creations": lambda a: cloud.armed.fail_creations(int(a.get("n", 1)), zone=a.get("zone"), code=a.get("code", "INTERNAL"),
                                                         message=a.get("message"), reason=a.get("reason", "")),
        "fail-calls": lambda a: cloud.armed.fail_calls(a.get("method", "*"), a["code"], n=int(a.get("n", 1)), zone=a.get("zone"),
                                                 reason=a.get("reason", ""), message=a.get("message")),
        "outage": lambda a: cloud.armed.outage(a.get("mode")),
        "slow-creations": lambda a: cloud.armed.slow_creations(a.get("seconds")),
        "fail-next-operation": lambda a: cloud.armed.fail_next_operation(a.get("code", "INTERNAL"), a.get("message")),
        "stale-process": lambda a: cloud.host_fault("stale_process", a["node"], int(a.get("worker", 0)),
                                                    env={str(k): str(v) for k, v in (a.get("env") or {}).items()},
                                                    lock=bool(a.get("lock", True))),
        "stale-lock": lambda a: cloud.host_fault("stale_lock", a["node"], int(a.get("worker", 0))),
        "unmount": lambda a: cloud.host_fault("unmount", a["node"], int(a.get("worker", 0)), path=a.get("path")),
        "fill-disk": lambda a: cloud.host_fault("fill_disk", a["node"], int(a.get("worker", 0)),
                                                free=None if a.get("free") is None else int(a["free"])),
    }


class ControlServer(JsonServer):
    def __init__(self, cloud: Cloud, host: str = "127.0.0.1", port: int = 0) -> None:
        verbs = _verbs(cloud)

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                if self.path == "/v1/faults":
                    self.send_json(200, {"faults": list(cloud.armed.log)})
                elif self.path == "/v1/status":
                    self.send_json(200, cloud.status())
                else:
                    self.send_json(404, {"error": f"no such path {self.path}", "code": "NOT_FOUND"})

            def do_POST(self) -> None:
                verb = self.path.removeprefix("/v1/")
                fn = verbs.get(verb)
                body = self.read_body()
                if fn is None:
                    self.send_json(404, {"error": f"unknown verb {verb!r}; one of {', '.join(verbs)}", "code": "NOT_FOUND"})
                    return
                try:
                    result = fn(json.loads(body or b"{}"))
                    self.send_json(200, {"ok": True, **(result or {})})
                except ApiError as exc:
                    status = 404 if exc.code == grpc.StatusCode.NOT_FOUND else 400
                    self.send_json(status, {"error": exc.message, "code": exc.code.name})
                except (KeyError, ValueError, TypeError) as exc:
                    self.send_json(400, {"error": f"bad arguments for {verb}: {exc!r}", "code": "INVALID_ARGUMENT"})

        super().__init__(Handler, host, port, "emulator-control")


class ControlError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ControlClient:
    """Drives a running emulator from another process; methods mirror `Emulator`'s."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps({k: v for k, v in body.items() if v is not None}).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                payload = json.loads(exc.read())
            except ValueError:
                payload = {"error": str(exc), "code": "UNKNOWN"}
            raise ControlError(payload.get("code", "UNKNOWN"), payload.get("error", str(exc))) from None

    def preempt(self, node: str, *, at: float | None = None, rate: float | None = None, state: str = "PREEMPTED") -> float:
        return self._call("POST", "/v1/preempt", {"node": node, "at": at, "rate": rate, "state": state})["delay"]

    def maintenance_event(self, node: str, *, duration: float | None = None) -> None:
        self._call("POST", "/v1/maintenance", {"node": node, "duration": duration})

    def set_capacity(self, zone: str, family: str, chips: int | None, pricing: str | None = None) -> None:
        self._call("POST", "/v1/capacity", {"zone": zone, "family": family, "chips": chips, "pricing": pricing})

    def capacity_schedule(self, steps: list[dict[str, Any]], *, repeat_s: float | None = None) -> int:
        return self._call("POST", "/v1/capacity-schedule", {"steps": steps, "repeat_s": repeat_s})["steps"]

    def kill_host(self, node: str, worker: int) -> None:
        self._call("POST", "/v1/kill-host", {"node": node, "worker": worker})

    def fail_creations(self, n: int = 1, *, zone: str | None = None, code: str = "INTERNAL", reason: str = "") -> None:
        self._call("POST", "/v1/fail-creations", {"n": n, "zone": zone, "code": code, "reason": reason or None})

    def fail_calls(self, method: str, code: str, *, n: int = 1, zone: str | None = None, reason: str = "") -> None:
        self._call("POST", "/v1/fail-calls", {"method": method, "code": code, "n": n, "zone": zone, "reason": reason or None})

    def outage(self, mode: str | None) -> None:
        self._call("POST", "/v1/outage", {"mode": mode or "off"})

    def slow_creations(self, seconds: float | None) -> None:
        self._call("POST", "/v1/slow-creations", {"seconds": seconds})

    def fail_next_operation(self, code: str = "INTERNAL", message: str | None = None) -> None:
        self._call("POST", "/v1/fail-next-operation", {"code": code, "message": message})

    def stale_process(self, node: str, worker: int, *, env: dict[str, str] | None = None, lock: bool = True) -> int:
        return self._call("POST", "/v1/stale-process", {"node": node, "worker": worker, "env": env, "lock": lock})["pid"]

    def stale_lock(self, node: str, worker: int) -> str:
        return self._call("POST", "/v1/stale-lock", {"node": node, "worker": worker})["path"]

    def unmount(self, node: str, worker: int, path: str | None = None) -> list[str]:
        return self._call("POST", "/v1/unmount", {"node": node, "worker": worker, "path": path})["unmounted"]

    def fill_disk(self, node: str, worker: int, free: int | None = 0) -> None:
        # `free` None (dropped from the body) restores the real figure.
        self._call("POST", "/v1/fill-disk", {"node": node, "worker": worker, "free": free})

    def faults(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/faults")["faults"]

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")
