"""`Emulator`: the gRPC and REST APIs, the control service and the hosts, started and stopped as one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.auth.credentials import AnonymousCredentials
from google.cloud.tpu_v2 import TpuClient
from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

from emulator.cloud import Cloud, Timings
from emulator.control import ControlServer
from emulator.grpc_api import build_handlers
from emulator.hosts import reap_orphans
from emulator.rest_api import RestServer


class Emulator:
    """A local Cloud TPU API, over gRPC (`endpoint`) and REST (`rest_url`), one state behind both.

        with Emulator(state_dir=tmp) as emu:
            client = emu.client()          # or TpuClient on grpc.insecure_channel(emu.endpoint)
            rest = emu.client("rest")      # the same API over HTTP/JSON, as gcloud uses it

    `state_dir` holds the hosts' sandboxes, `faults.jsonl` and `emulator.json` (endpoint,
    REST and control URLs, pid); without one a temporary directory is used and removed on stop.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        control_port: int = 0,
        rest_port: int = 0,
        timings: Timings | None = None,
        capacity: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self._given_dir = Path(state_dir) if state_dir is not None else None
        self.state_dir: Path | None = None
        self.host = host
        self.port = port
        self.control_port = control_port
        self.rest_port = rest_port
        self.timings = timings or Timings()
        self._initial_capacity = dict(capacity or {})
        self.cloud: Cloud | None = None
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._control: ControlServer | None = None
        self._rest: RestServer | None = None
        self._tmp: str | None = None

    # ---------------------------------------------------------------- life cycle
    def start(self) -> Emulator:
        if self._given_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="tpu-emulator-")
            self.state_dir = Path(self._tmp).resolve()
        else:
            self.state_dir = self._given_dir.resolve()
            self.state_dir.mkdir(parents=True, exist_ok=True)
        # jobs left by an emulator that was killed outright (SIGKILL) die now, not never
        reap_orphans(self.state_dir)
        self.cloud = Cloud(self.state_dir, self.timings, host_bind=self.host)
        for (zone, family), chips in self._initial_capacity.items():
            self.cloud.set_capacity(zone, family, chips)
        self._executor = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="emulator-grpc")
        server = grpc.server(self._executor, handlers=build_handlers(self.cloud), options=[("grpc.so_reuseport", 0)])
        try:
            bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:  # grpc raises rather than returning 0 in recent versions
            bound = 0
        if bound == 0:
            self._teardown()
            raise OSError(f"cannot listen on {self.host}:{self.port}: address in use")
        self.port = bound
        self._server = server
        server.start()
        self._rest = self._listen("REST API", RestServer, self.rest_port)
        self._control = self._listen("control API", ControlServer, self.control_port)
        self.rest_port = self._rest.port
        self._rest.start()
        self._control.start()
        info = {"endpoint": self.endpoint, "rest": self.rest_url, "control": self.control_url, "pid": os.getpid(), "started": time.time()}
        (self.state_dir / "emulator.json").write_text(json.dumps(info, indent=2) + "\n")
        return self

    def _listen(self, what: str, server: type[RestServer] | type[ControlServer], port: int) -> Any:
        try:
            return server(self._cloud(), self.host, port)
        except OSError as exc:
            self._teardown()
            raise OSError(f"cannot listen on {self.host}:{port} for the {what}: {exc.strerror}") from None

    def stop(self) -> None:
        self._teardown()

    def _teardown(self) -> None:
        for http in (self._control, self._rest):
            if http is not None:
                http.stop()
        self._control = self._rest = None
        if self._server is not None:
            self._server.stop(grace=0.5).wait(10)
            self._server = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self.cloud is not None:
            self.cloud.close()
            self.cloud = None
        if self.state_dir is not None:
            with contextlib.suppress(OSError):
                (self.state_dir / "emulator.json").unlink()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- addresses
    @property
    def endpoint(self) -> str:
        """host:port of the gRPC API (LEDGER_TPU_ENDPOINT)."""
        return f"{self.host}:{self.port}"

    @property
    def rest_url(self) -> str:
        """http://host:port of the REST API: the root gcloud's endpoint override points at."""
        assert self._rest is not None, "emulator not started"
        return self._rest.url

    def gcloud_env(self, project: str) -> dict[str, str]:
        """The settings that point gcloud's `compute tpus` commands at this emulator."""
        return {
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{self.rest_url}/",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": project,
        }

    @property
    def control_url(self) -> str:
        assert self._control is not None, "emulator not started"
        return self._control.url

    def client(self, transport: str = "grpc") -> TpuClient:
        """A real `TpuClient` on this emulator (close its transport): gRPC on an insecure
        channel, or "rest" over plain HTTP with anonymous credentials."""
        if transport == "rest":
            return TpuClient(transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": self.rest_url})
        if transport != "grpc":
            raise ValueError(f"transport must be 'grpc' or 'rest', not {transport!r}")
        return TpuClient(transport=TpuGrpcTransport(channel=grpc.insecure_channel(self.endpoint)))

    # ---------------------------------------------------------------- control API
    def _cloud(self) -> Cloud:
        if self.cloud is None:
            raise RuntimeError("emulator not started")
        return self.cloud

    @property
    def faults(self) -> list[dict[str, Any]]:
        """Every injected fault, in order: {"time": unix seconds, "iso", "fault", ...}."""
        return list(self._cloud().armed.log)

    def preempt(self, node: str, *, at: float | None = None, rate: float | None = None, state: str = "PREEMPTED") -> float:
        return self._cloud().preempt(node, at=at, rate=rate, state=state)

    def maintenance_event(self, node: str, *, duration: float | None = None) -> None:
        self._cloud().maintenance_event(node, duration=duration)

    def set_capacity(self, zone: str, family: str, chips: int | None, pricing: str | None = None) -> None:
        self._cloud().set_capacity(zone, family, chips, pricing)

    def capacity_schedule(self, steps: list[dict[str, Any]], *, repeat_s: float | None = None) -> int:
        return self._cloud().capacity_schedule(steps, repeat_s=repeat_s)

    def kill_host(self, node: str, worker: int) -> None:
        self._cloud().kill_host(node, worker)

    # Host hygiene: what a previous run leaves on a TPU VM (see emulator.hosts).
    def stale_process(self, node: str, worker: int, *, env: dict[str, str] | None = None, lock: bool = True) -> int:
        return self._cloud().host_fault("stale_process", node, worker, env=env, lock=lock)["pid"]

    def stale_lock(self, node: str, worker: int) -> str:
        return self._cloud().host_fault("stale_lock", node, worker)["path"]

    def unmount(self, node: str, worker: int, path: str | None = None) -> list[str]:
        return self._cloud().host_fault("unmount", node, worker, path=path)["unmounted"]

    def fill_disk(self, node: str, worker: int, free: int | None = 0) -> None:
        self._cloud().host_fault("fill_disk", node, worker, free=free)

    def fail_creations(self, n: int = 1, *, zone: str | None = None, code: str = "INTERNAL", message: str | None = None,
                       reason: str = "") -> None:
        self._cloud().armed.fail_creations(n, zone=zone, code=code, message=message, reason=reason)

    def fail_calls(self, method: str, code: str, *, n: int = 1, zone: str | None = None, reason: str = "",
                   message: str | None = None) -> None:
        self._cloud().armed.fail_calls(method, code, n=n, zone=zone, reason=reason, message=message)

    def outage(self, mode: str | None) -> None:
        self._cloud().armed.outage(mode)

    def slow_creations(self, seconds: float | None) -> None:
        self._cloud().armed.slow_creations(seconds)

    def fail_next_operation(self, code: str = "INTERNAL", message: str | None = None) -> None:
        self._cloud().armed.fail_next_operation(code, message)

    def status(self) -> dict[str, Any]:
        return self._cloud().status()

    def host_ports(self, node: str) -> list[int]:
        """SSH ports of a node's running hosts, worker 0 first (same as network_endpoints)."""
        st = self._cloud().status()
        name = self._cloud().resolve_node(node)
        return next(n["ports"] for n in st["nodes"] if n["name"] == name)
