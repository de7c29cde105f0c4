"""The Cloud TPU API adapter (google-cloud-tpu). Thin: translates, never decides.

The endpoint comes from configuration: unset = Google Cloud with Application Default
Credentials; `host:port` = a TPU API speaking gRPC without TLS (the local emulator).

Every call goes through `TpuApi._call`, the one choke point: it sets the call's deadline,
counts it, tells the observers (method, status code, seconds: metrics hook in there), and
turns any error the API, the channel or the credentials raise into `TpuCallError`, whose
`failure` is plain data (`ledger.failures.ApiFailure`). What a failure means is decided by
`ledger.failures` and `reconciler.react`, never here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ledger import defaults
from ledger.errors import LedgerError, UsageError
from ledger.failures import ApiFailure, kind_of, summary
from ledger.observers import Observers
from ledger.tpu_types import DEFAULT_RUNTIME, lookup
from reconciler.model import NodeObs, OperationObs, QueuedObs

# Preferred host-key types, as published in the `hostkeys/` guest attributes.
HOST_KEY_TYPES = ("ecdsa-sha2-nistp256", "ssh-ed25519", "ssh-rsa")
TPU_RUNTIME_PORT = 8470  # what Google Cloud reports as a TPU VM endpoint's port; SSH is on 22
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# The channel retries a lost connection on its own, quickly (gRPC's default backoff grows to
# 120 s: the API was back for a minute before the loop noticed), and keeps a live connection
# checked so a silently dropped one fails fast instead of hanging until a deadline.
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", int(defaults.TPU_RECONNECT_MAX_S * 1000)),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
)
NO_CREDENTIALS_HINT = ("set up Application Default Credentials: `gcloud auth application-default login`, or "
                       "GOOGLE_APPLICATION_CREDENTIALS=/path/to/service-account.json; "
                       "or --tpu-endpoint HOST:PORT for the local emulator")


class TpuCallError(LedgerError):
    """A call to the TPU API failed; `failure` says how (ledger.failures.ApiFailure)."""

    def __init__(self, failure: ApiFailure) -> None:
        super().__init__(summary(failure))
        self.failure = failure


class DeleteFailedError(LedgerError):
    """Google accepted a delete and then failed it: the TPU is still there (ask again)."""


@dataclass(frozen=True, slots=True)
class CreateRequest:
    zone: str
    name: str
    accelerator: str
    runtime: str
    pricing: str  # spot | preemptible | ondemand | reserved
    labels: dict[str, str]
    metadata: dict[str, str]
    tags: tuple[str, ...] = ()
    reservation: str = ""
    network: dict[str, Any] | None = None
    queued: bool = False
    slices: int = 1  # more than one: a multislice queued resource, nodes <name>-0 .. <name>-(N-1)
    wait_s: float | None = None  # a queued resource waits this long for capacity (valid_until)


@dataclass(frozen=True, slots=True)
class Created:
    """The API accepted a create: `how` 'created', or 'adopted' (our own name already
    exists); `operation` names its long-running operation, when there is one."""

    how: str
    operation: str = ""


def _exceptions() -> ModuleType:
    from google.api_core import exceptions

    return exceptions


def status_failure(status: Any, method: str, *, resource: str = "", in_operation: bool = True) -> ApiFailure:
    """A google.rpc.Status (an operation's or a queued resource's error) as an ApiFailure."""
    import grpc
    from google.rpc import error_details_pb2

    names = {c.value[0]: c.name for c in grpc.StatusCode}
    reason = domain = ""
    metadata: dict[str, str] = {}
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
    return ApiFailure(code=names.get(status.code, "UNKNOWN"), message=status.message, method=method, reason=reason,
                      domain=domain, metadata=metadata, in_operation=in_operation, resource=resource)


def exception_failure(exc: BaseException, method: str, *, resource: str = "", in_operation: bool = False) -> ApiFailure:
    """Whatever a call raised, as an ApiFailure: an API error with its ErrorInfo, a retry or
    wait that ran out (DEADLINE_EXCEEDED), missing or refused credentials (UNAUTHENTICATED)."""
    ex = _exceptions()
    from google.auth import exceptions as auth

    if isinstance(exc, ex.GoogleAPICallError):
        code = exc.grpc_status_code.name if exc.grpc_status_code is not None else "UNKNOWN"
        return ApiFailure(code=code, message=exc.message or str(exc), method=method, reason=exc.reason or "",
                          domain=exc.domain or "", metadata={str(k): str(v) for k, v in (exc.metadata or {}).items()},
                          in_operation=in_operation, resource=resource)
    if isinstance(exc, ex.RetryError | TimeoutError):
        return ApiFailure(code="DEADLINE_EXCEEDED", message=str(exc) or "timed out", method=method,
                          in_operation=in_operation, resource=resource)
    if isinstance(exc, auth.GoogleAuthError):
        return ApiFailure(code="UNAUTHENTICATED", message=" ".join(str(exc).split())[:300], method=method,
                          reason="CREDENTIALS_MISSING", domain="googleapis.com", resource=resource)
    raise exc  # a bug, not the API's answer


class TpuApi:
    def __init__(self, project: str, endpoint: str | None = None, *, use_external_ip: bool = False) -> None:
        import grpc
        from google.cloud import tpu_v2
        from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

        self.project = project
        self.endpoint = endpoint
        self.use_external_ip = use_external_ip
        self._types = tpu_v2
        if endpoint:
            self._channel = grpc.insecure_channel(endpoint, options=list(CHANNEL_OPTIONS))
        else:
            self._channel = TpuGrpcTransport.create_channel(
                credentials=google_credentials(), scopes=list(SCOPES), options=list(CHANNEL_OPTIONS))
        self.client = tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=self._channel))
        self._watchers: list[Callable[[Any], None]] = []  # connectivity callbacks: `on_reconnect`
        self.calls = 0  # API calls made, for the benchmark's calls-per-pass figure
        self.timeout = defaults.TPU_CALL_TIMEOUT_S
        # Told of every call: (method, status code name, seconds). Metrics hook in here.
        self.observers: Observers[[str, str, float]] = Observers()
        self._lock = threading.Lock()

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def node_path(self, zone: str, name: str) -> str:
        return f"{self.parent(zone)}/nodes/{name}"

    # -- the choke point ------------------------------------------------------------------
    def _call(self, method: str, fn: Callable[..., Any], *args: Any, resource: str = "", **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` with the call's deadline and no hidden retries (the loop
        backs off per zone); any failure raised as TpuCallError."""
        with self._lock:
            self.calls += 1
        start = time.monotonic()
        code = "OK"
        try:
            return fn(*args, retry=None, timeout=self.timeout, **kwargs)
        except Exception as exc:
            code = "ERROR"  # not the API's answer (a bug) unless it converts below
            failure = exception_failure(exc, method, resource=resource)
            code = failure.code
            raise TpuCallError(failure) from None
        finally:
            self.observers(method, code, time.monotonic() - start)

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever the channel becomes READY after it was not (the endpoint
        came back): the loop then tries the zones at once instead of at its next backoff step."""
        import grpc

        last = {"state": None}

        def changed(state: Any) -> None:
            if state == grpc.ChannelConnectivity.READY and last["state"] not in (None, grpc.ChannelConnectivity.READY):
                callback()
            last["state"] = state

        self._channel.subscribe(changed, try_to_connect=True)
        self._watchers.append(changed)

    # -- observing ------------------------------------------------------------------------
    def list_nodes(self, zone: str) -> list[NodeObs]:
        parent = self.parent(zone)
        nodes = self._call("ListNodes", lambda **kw: list(self.client.list_nodes(parent=parent, **kw)), resource=parent)
        return [self._node_obs(zone, n) for n in nodes]

    def list_queued(self, zone: str) -> list[QueuedObs]:
        parent = self.parent(zone)
        qrs = self._call("ListQueuedResources", lambda **kw: list(self.client.list_queued_resources(parent=parent, **kw)),
                         resource=parent)
        out = []
        for qr in qrs:
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            message, error = "", None
            if qr.state and qr.state.failed_data and qr.state.failed_data.error and qr.state.failed_data.error.code:
                message = qr.state.failed_data.error.message
                error = status_failure(qr.state.failed_data.error, "CreateQueuedResource", resource=parent)
            node_name = qr.tpu.node_spec[0].node_id if qr.tpu and qr.tpu.node_spec else ""
            out.append(QueuedObs(qr.name.rsplit("/", 1)[-1], zone, state, node_name, message, error))
        return out

    def _node_obs(self, zone: str, node: Any) -> NodeObs:
        hosts = []
        for i, ep in enumerate(node.network_endpoints):
            address = ep.ip_address
            if self.use_external_ip and ep.access_config and ep.access_config.external_ip:
                address = ep.access_config.external_ip
            port = ep.port if ep.port not in (0, TPU_RUNTIME_PORT) else 22
            host = {"worker": i, "address": address, "port": port}
            if address != ep.ip_address:  # the hosts reach each other inside the VPC (Megascale)
                host["internal_address"] = ep.ip_address
            hosts.append(host)
        created = node.create_time.timestamp() if node.create_time else 0.0
        return NodeObs(
            name=node.name.rsplit("/", 1)[-1],
            zone=zone,
            state=node.state.name,
            labels=dict(node.labels),
            hosts=tuple(hosts),
            health=node.health.name if node.health else "",
            create_time=created,
            accelerator=node.accelerator_type,
            queued_resource=node.queued_resource.rsplit("/", 1)[-1],
        )

    def host_keys(self, zone: str, name: str) -> list[str | None]:
        """Each worker's SSH host key ('type base64') from guest attributes, to pin it."""
        path = self.node_path(zone, name)
        try:
            resp = self._call("GetGuestAttributes", self.client.get_guest_attributes,
                              request={"name": path, "query_path": "hostkeys/"}, resource=path)
        except TpuCallError:
            return []
        keys: list[str | None] = []
        for attrs in resp.guest_attributes:
            found = {e.key: e.value for e in attrs.query_value.items}
            keys.append(next((f"{t} {found[t]}" for t in HOST_KEY_TYPES if t in found), None))
        return keys

    def get_node(self, zone: str, name: str) -> NodeObs | None:
        path = self.node_path(zone, name)
        try:
            return self._node_obs(zone, self._call("GetNode", self.client.get_node, name=path, resource=path))
        except TpuCallError as exc:
            if kind_of(exc.failure) == "absent":
                return None
            raise

    def state_of(self, zone: str, name: str, *, queued: bool = False) -> str | None:
        """The state's name of the node `name` (or, `queued`, of the queued resource): None
        when the API no longer knows it."""
        if not queued:
            node = self.get_node(zone, name)
            return None if node is None else node.state
        path = f"{self.parent(zone)}/queuedResources/{name}"
        try:
            qr = self._call("GetQueuedResource", self.client.get_queued_resource, name=path, resource=path)
        except TpuCallError as exc:
            if kind_of(exc.failure) == "absent":
                return None
            raise
        return qr.state.state.name if qr.state else "STATE_UNSPECIFIED"

    def operation(self, name: str) -> OperationObs | None:
        """The long-running operation `name` (a create's): done or not, and its error. None
        when the API no longer knows it."""
        try:
            op = self._call("GetOperation", self.client.get_operation, request={"name": name}, resource=name)
        except TpuCallError as exc:
            if kind_of(exc.failure) == "absent":
                return None
            raise
        return OperationObs(name, op.done, self._op_failure(op) if op.done else None)

    def _op_failure(self, op: Any, method: str = "") -> ApiFailure | None:
        """The error an operation (a google.longrunning.Operation message) ended in, if any."""
        if not op.HasField("error") or not op.error.code:
            return None
        if not method:
            meta = self._types.OperationMetadata.deserialize(op.metadata.value) if op.metadata.value else None
            verb = meta.verb if meta is not None else ""
            kind = "QueuedResource" if meta is not None and "/queuedResources/" in meta.target else "Node"
            method = f"{verb.capitalize()}{kind}" if verb else ""
        return status_failure(op.error, method, resource=op.name)

    # -- acting ---------------------------------------------------------------------------
    def create(self, req: CreateRequest) -> Created:
        """Ask for the TPU. Raises TpuCallError when the call is refused, or when its
        operation comes back already failed (Google may report a stock-out only there)."""
        t = self._types
        node = self._node_message(req)
        parent = self.parent(req.zone)
        if req.queued:
            spot = {"spot": t.QueuedResource.Spot()} if req.pricing in ("spot", "preemptible") else {}
            if req.wait_s:
                from google.protobuf import duration_pb2  # with the client: lazily

                spot["queueing_policy"] = t.QueuedResource.QueueingPolicy(
                    valid_until_duration=duration_pb2.Duration(seconds=int(req.wait_s)))
            if req.slices > 1:  # one node spec for every slice, as the API asks
                spec = t.QueuedResource.Tpu.NodeSpec(
                    parent=parent, node=node, multislice_params=t.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                        node_count=req.slices, node_id_prefix=req.name))
            else:
                spec = t.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=req.name, node=node)
            qr = t.QueuedResource(tpu=t.QueuedResource.Tpu(node_spec=[spec]), reservation_name=req.reservation, **spot)
            method, call = "CreateQueuedResource", lambda **kw: self.client.create_queued_resource(
                parent=parent, queued_resource_id=req.name, queued_resource=qr, **kw)
        else:
            method, call = "CreateNode", lambda **kw: self.client.create_node(parent=parent, node_id=req.name, node=node, **kw)
        try:
            op = self._call(method, call, resource=parent)
        except TpuCallError as exc:
            if kind_of(exc.failure) == "exists":
                return Created("adopted")
            raise
        raw = op.operation  # as returned: looking at op.done() would poll the API
        if raw.done and (failure := self._op_failure(raw, method)) is not None:
            raise TpuCallError(failure)
        return Created("created", raw.name)

    def _node_message(self, req: CreateRequest) -> Any:
        t = self._types
        accel = lookup(req.accelerator)
        runtime = req.runtime or (DEFAULT_RUNTIME.get(accel.family, "") if accel else "")
        net = req.network or {}
        return t.Node(
            accelerator_type=req.accelerator,
            runtime_version=runtime,
            labels=req.labels,
            metadata=req.metadata,
            tags=list(req.tags),
            scheduling_config=t.SchedulingConfig(
                spot=req.pricing == "spot",
                preemptible=req.pricing == "preemptible",
                reserved=req.pricing == "reserved",
            ),
            network_config=t.NetworkConfig(
                network=net.get("network", ""),
                subnetwork=net.get("subnetwork", ""),
                enable_external_ips=bool(net.get("enable_external_ips", True)),
            ),
        )

    def delete(self, zone: str, name: str, *, queued: bool = False) -> bool:
        """Delete the node (and its queued resource). False when it was already gone."""
        gone = True
        if queued:
            path = f"{self.parent(zone)}/queuedResources/{name}"
            try:
                op = self._call("DeleteQueuedResource", self.client.delete_queued_resource,
                                request={"name": path, "force": True}, resource=path)
                gone = False
            except TpuCallError as exc:
                if kind_of(exc.failure) != "absent":
                    raise
            else:
                # Awaited like a node's: a multislice queued resource has no node of its own
                # name, so nothing below would wait, and a force delete whose operation failed
                # leaves its slices READY while the job, told `released`, makes the next one.
                self._await_delete(op, "DeleteQueuedResource", f"queued resource {name} in {zone}")
        path = self.node_path(zone, name)
        try:
            op = self._call("DeleteNode", self.client.delete_node, name=path, resource=path)
        except TpuCallError as exc:
            if kind_of(exc.failure) != "absent":
                raise
            return not gone
        self._await_delete(op, "DeleteNode", f"TPU {name} in {zone}")
        return True

    def _await_delete(self, op: Any, method: str, what: str) -> None:
        """Wait for a delete's operation; DeleteFailedError when it failed (absent is done:
        for a node, the queued resource's force delete won)."""
        failure = self._wait(op.operation, method, defaults.TPU_DELETE_WAIT_S)
        if failure is not None and kind_of(failure) != "absent":
            raise DeleteFailedError(f"deleting {what} failed: {summary(failure)}")

    def _wait(self, op: Any, method: str, timeout: float) -> ApiFailure | None:
        """Poll the operation `op` (as returned) through the choke point until it is done:
        its error, or None. Not the client's own polling, which would bypass `_call`."""
        deadline = time.monotonic() + timeout
        while not op.done:
            if time.monotonic() > deadline:
                return ApiFailure("DEADLINE_EXCEEDED", f"operation {op.name} not done after {timeout:.0f} s", method=method,
                                  in_operation=True, resource=op.name)
            time.sleep(defaults.TPU_DELETE_POLL_S)
            op = self._call("GetOperation", self.client.get_operation, request={"name": op.name}, resource=op.name)
        return self._op_failure(op, method)

    def await_gone(self, zone: str, name: str, *, queued: bool = False,
                   timeout: float = defaults.TPU_DELETE_WAIT_S) -> bool:
        """Wait while a deletion someone else asked for is under way: True once the node (or,
        `queued`, the queued resource with every slice) is gone, False when it left DELETING
        without going (the delete failed: ask again)."""
        deadline = time.monotonic() + timeout
        while (state := self.state_of(zone, name, queued=queued)) == "DELETING":
            if time.monotonic() > deadline:
                what = "queued resource" if queued else "TPU"
                raise DeleteFailedError(f"{what} {name} in {zone} is still being deleted after {timeout:.0f} s")
            time.sleep(defaults.TPU_DELETE_POLL_S)
        return state is None

    def close(self) -> None:
        # Unsubscribed first: closing a channel that still has a connectivity callback lets
        # grpc's polling thread watch the closed channel and print a traceback (grpc#18995).
        for watcher in self._watchers:
            self._channel.unsubscribe(watcher)
        if self._watchers:
            # ... and its polling thread, inside a wait of up to 0.2 s, notices it has nobody to
            # tell only when that wait ends: closing before then still made it raise ("Cannot
            # monitor channel state: Channel closed!", seen again in CI). Its flag says when
            # it is gone (grpc's own state; absent in another grpc, then no wait).
            state = getattr(self._channel, "_connectivity_state", None)
            deadline = time.monotonic() + 1.0
            while getattr(state, "polling", False) and time.monotonic() < deadline:
                time.sleep(0.01)
        self._watchers.clear()
        self._channel.close()


def google_credentials() -> Any:
    """Application Default Credentials, or a one-line error that says how to set them up."""
    import google.auth
    from google.auth import exceptions as auth

    try:
        credentials, _ = google.auth.default(scopes=list(SCOPES))
    except auth.DefaultCredentialsError:
        raise LedgerError("no Google Cloud credentials: Application Default Credentials were not found",
                          hint=NO_CREDENTIALS_HINT) from None
    return credentials


def project_for(project: str | None, endpoint: str | None) -> str:
    """The project to use: the one given, or (only for a local endpoint) the emulator's."""
    if project:
        return project
    if endpoint:
        return defaults.PROJECT
    raise UsageError("the Cloud TPU API needs a project: pass --project or set LEDGER_PROJECT",
                     hint="or --tpu-endpoint HOST:PORT for the local emulator")
