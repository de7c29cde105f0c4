"""The emulated Cloud TPU service: nodes, queued resources, operations, capacity, and the
faults that change them (a preemption, a maintenance event, a host killed, capacity gone).

All their state lives here behind one lock; the faults armed against the API itself (refused
calls, outages, failing operations) are `faults.ArmedFaults`, its errors `errors.ApiError`;
the gRPC layer (`grpc_api`) only translates messages, and the hosts (`hosts`) only serve SSH. Messages are the raw protobuf classes
behind google-cloud-tpu's proto-plus types, so what the client receives is what Google
would send. Timed transitions run on one scheduler thread.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.cloud.tpu_v2.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2

from emulator.errors import ApiError, fault_error, not_found, pack
from emulator.faults import ArmedFaults
from emulator.hosts import Acceptor, SSHHost, new_host_key, parse_ssh_keys
from emulator.scheduler import Scheduler
from ledger import tpu_types

# The raw protobuf classes behind the proto-plus types: proto-plus builds them at run time, so
# no static type names them and annotations of these messages (nodes, queued resources) say Any.
NodePb = cloud_tpu.Node.pb()
QueuedResourcePb = cloud_tpu.QueuedResource.pb()
QRStatePb = cloud_tpu.QueuedResourceState.pb()
OperationMetadataPb = cloud_tpu.OperationMetadata.pb()
S = cloud_tpu.Node.State
H = cloud_tpu.Node.Health
Q = cloud_tpu.QueuedResourceState.State

DEFAULT_CAPACITY = 100_000  # chips per (zone, family): generous unless a test withholds it
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# States in which a node holds its chips (a stopped or preempted node gives them back).
_HOLDING = {S.CREATING, S.READY, S.STARTING, S.STOPPING, S.RESTARTING, S.REPAIRING, S.DELETING}
_ACCEL_CONFIG_FAMILY = {
    cloud_tpu.AcceleratorConfig.Type.V2: "v2",
    cloud_tpu.AcceleratorConfig.Type.V3: "v3",
    cloud_tpu.AcceleratorConfig.Type.V4: "v4",
    cloud_tpu.AcceleratorConfig.Type.V5LITE_POD: "v5litepod",
    cloud_tpu.AcceleratorConfig.Type.V5P: "v5p",
    cloud_tpu.AcceleratorConfig.Type.V6E: "v6e",
}
_FAMILY_CONFIG_TYPE = {v: k for k, v in _ACCEL_CONFIG_FAMILY.items()}


@dataclass
class Timings:
    """Seconds each transition takes; small defaults keep tests fast."""

    create: float = 0.3
    delete: float = 0.1
    stop: float = 0.1
    start: float = 0.2
    queue_step: float = 0.1
    maintenance: float = 1.0


@dataclass
class _Node:
    pb: Any
    project: str
    zone: str
    accel: tpu_types.AcceleratorType
    host_keys: list[Any]
    home: Path
    uid: str
    hosts: list[SSHHost] = field(default_factory=list)
    qr: str | None = None


@dataclass
class _QR:
    pb: Any
    project: str
    zone: str
    specs: list[tuple[str, Any, tpu_types.AcceleratorType]]  # (node name, node pb, type)
    waiting_since: float = 0.0


PRICINGS = ("spot", "preemptible", "ondemand", "reserved")


def pricing_of(node: Any) -> str:
    """A node's pricing model, from its scheduling config (as a job spec spells it)."""
    sc = node.scheduling_config
    return "spot" if sc.spot else "preemptible" if sc.preemptible else "reserved" if sc.reserved else "ondemand"


def _now_ts() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def parse_parent(parent: str) -> tuple[str, str]:
    m = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)", parent or "")
    if not m:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent {parent!r}: expected projects/PROJECT/locations/ZONE")
    return m.group(1), m.group(2)


def _split_name(name: str, collection: str) -> tuple[str, str, str]:
    m = re.fullmatch(rf"projects/([^/]+)/locations/([^/]+)/{collection}/([^/]+)", name or "")
    if not m:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid resource name {name!r}: expected projects/PROJECT/locations/ZONE/{collection}/ID")
    return m.group(1), m.group(2), m.group(3)


def _fill_defaults(pb: Any, project: str, zone: str, index: int) -> None:
    """What the real API always returns on a node, filled where the request left it out."""
    region = zone.rsplit("-", 1)[0]
    given = pb.HasField("network_config")
    net = pb.network_config
    if not net.network:
        net.network = f"projects/{project}/global/networks/default"
    if not net.subnetwork:
        net.subnetwork = f"projects/{project}/regions/{region}/subnetworks/default"
    if not given:
        net.enable_external_ips = True
    pb.scheduling_config.SetInParent()
    pb.shielded_instance_config.SetInParent()
    if not pb.cidr_block:
        pb.cidr_block = f"10.{128 + index // 256 % 64}.{index % 256}.0/29"
    if not pb.service_account.email:
        pb.service_account.email = f"{zlib.crc32(project.encode()):012d}-compute@developer.gserviceaccount.com"
    if not pb.service_account.scope:
        pb.service_account.scope.append("https://www.googleapis.com/auth/cloud-platform")


class Cloud:
    """Everything the emulated API knows. Thread-safe; public methods are the API's verbs."""

    def __init__(self, state_dir: Path, timings: Timings | None = None, *, host_bind: str = "127.0.0.1") -> None:
        self.state_dir = state_dir
        self.timings = timings or Timings()
        self.host_bind = host_bind
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._qrs: dict[str, _QR] = {}
        self._ops: dict[str, Any] = {}
        # (zone, family, pricing) -> chips; pricing None: the zone's chips of the family whatever
        # the pricing (a pricing's own limit is checked as well as the zone's).
        self._capacity: dict[tuple[str, str, str | None], int] = {}
        self.armed = ArmedFaults(state_dir / "faults.jsonl")  # and the log of every fault
        self._rng = random.Random()
        self._acceptor = Acceptor()
        self._sched = Scheduler()
        self._closed = False

    # ---------------------------------------------------------------- bookkeeping
    def close(self) -> None:
        with self._lock:
            self._closed = True
            nodes = list(self._nodes.values())
        self._sched.stop()
        self._stop_hosts([h for n in nodes for h in n.hosts])
        self._acceptor.close()

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        self._sched.call_later(delay, fn)

    def _new_op(self, project: str, zone: str, verb: str, target: str) -> operations_pb2.Operation:
        op = operations_pb2.Operation()
        op.name = f"projects/{project}/locations/{zone}/operations/operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
        meta = OperationMetadataPb(create_time=_now_ts(), target=target, verb=verb, api_version="v2")
        op.metadata.CopyFrom(pack(meta))
        self._ops[op.name] = op
        return op

    def _finish_op(self, op: operations_pb2.Operation, response: Message | None = None, error: ApiError | None = None) -> None:
        with self._lock:
            meta = OperationMetadataPb()
            op.metadata.Unpack(meta)
            meta.end_time.CopyFrom(_now_ts())
            op.metadata.CopyFrom(pack(meta))
            if error is not None:
                op.error.CopyFrom(error.status())
            else:
                op.response.CopyFrom(pack(response if response is not None else empty_pb2.Empty()))
            op.done = True

    # ---------------------------------------------------------------- validation
    def _accel(self, node: Any, zone: str) -> tpu_types.AcceleratorType:
        name = node.accelerator_type
        if not name and node.HasField("accelerator_config"):
            family = _ACCEL_CONFIG_FAMILY.get(node.accelerator_config.type_)
            dims = [int(d) for d in node.accelerator_config.topology.split("x") if d.isdigit()]
            if family and dims:
                chips = 1
                for d in dims:
                    chips *= d
                name = f"{family}-{chips if family in ('v5litepod', 'v6e') else chips * 2}"
        if not name:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Field 'accelerator_type' is required")
        accel = tpu_types.lookup(name)
        if accel is None:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid value for field 'accelerator_type': '{name}'. Unknown accelerator type.")
        if zone not in tpu_types.all_zones():
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid value for field 'parent': unknown zone '{zone}'.")
        if not tpu_types.zone_offers(zone, accel.family):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Accelerator type '{name}' is not available in zone '{zone}'; zones offering {accel.family}: {', '.join(tpu_types.ZONES[accel.family])}.")
        if not node.runtime_version:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Field 'runtime_version' is required")
        if node.runtime_version not in tpu_types.runtime_versions(zone):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid value for field 'runtime_version': '{node.runtime_version}'. "
                           f"Runtime version not found in zone {zone}.", reason="RUNTIME_VERSION_NOT_FOUND")
        if not tpu_types.runtime_fits(node.runtime_version, accel.family):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Runtime version '{node.runtime_version}' does not support "
                           f"accelerator type '{name}'; use one of: "
                           f"{', '.join(v for v in tpu_types.runtime_versions(zone) if tpu_types.runtime_fits(v, accel.family))}.",
                           reason="RUNTIME_VERSION_INCOMPATIBLE")
        return accel

    def _check_node_id(self, node_id: str) -> None:
        if not _NAME_RE.match(node_id or ""):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid node id {node_id!r}: use 1-63 lowercase letters, digits and hyphens, starting with a letter")

    # ---------------------------------------------------------------- capacity
    def capacity(self, zone: str, family: str, pricing: str | None = None) -> int:
        """Chips the zone can give the family under `pricing` (its own limit if one is set,
        else the zone's), or in all (None)."""
        own = self._capacity.get((zone, family, pricing)) if pricing is not None else None
        return own if own is not None else self._capacity.get((zone, family, None), DEFAULT_CAPACITY)

    def _used(self, zone: str, family: str, pricing: str | None = None) -> int:
        return sum(n.accel.chips for n in self._nodes.values() if n.zone == zone and n.accel.family == family and n.pb.state in _HOLDING
                   and (pricing is None or pricing_of(n.pb) == pricing))

    def _fits(self, zone: str, accel: tpu_types.AcceleratorType, extra: int = 0, pricing: str | None = None,
              extra_priced: int = 0) -> bool:
        """Room for one more slice: under the zone's chips of its family, and under its
        pricing's own limit when one is set (spot capacity runs out apart from on-demand)."""
        if self._used(zone, accel.family) + extra + accel.chips > self.capacity(zone, accel.family):
            return False
        if pricing is not None and (zone, accel.family, pricing) in self._capacity:
            return self._used(zone, accel.family, pricing) + extra_priced + accel.chips <= self._capacity[(zone, accel.family, pricing)]
        return True

    def _no_capacity(self, zone: str) -> ApiError:
        return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED, f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)',
                        reason="STOCKOUT")

    # ---------------------------------------------------------------- nodes: reads
    def _node(self, name: str) -> _Node:
        _split_name(name, "nodes")
        rec = self._nodes.get(name)
        if rec is None:
            raise not_found(name)
        return rec

    def get_node(self, name: str) -> Any:
        with self._lock:
            out = NodePb()
            out.CopyFrom(self._node(name).pb)
            return out

    def list_nodes(self, parent: str) -> list[Any]:
        project, zone = self._known_parent(parent)
        with self._lock:
            out = []
            for rec in self._nodes.values():
                if rec.project == project and zone in (rec.zone, "-"):
                    c = NodePb()
                    c.CopyFrom(rec.pb)
                    out.append(c)
            return sorted(out, key=lambda n: n.name)

    def _known_parent(self, parent: str) -> tuple[str, str]:
        project, zone = parse_parent(parent)
        if zone != "-" and zone not in tpu_types.all_zones():
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"Location '{parent}' was not found (no Cloud TPU zone {zone!r}).",
                           reason="LOCATION_NOT_FOUND")
        return project, zone

    # ---------------------------------------------------------------- nodes: create
    def create_node(self, parent: str, node_id: str, node: Any) -> operations_pb2.Operation:
        project, zone = parse_parent(parent)
        self._check_node_id(node_id)
        accel = self._accel(node, zone)
        name = f"{parent}/nodes/{node_id}"
        with self._lock:
            if name in self._nodes:
                raise ApiError(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{name}' already exists")
            op = self._new_op(project, zone, "create", name)
            fault = self.armed.take_next_operation("create", name)
            if fault is not None:
                self._later(self._creation_delay(), lambda: self._finish_op(op, error=ApiError(fault["code"], fault["message"])))
                return op
            if not self._fits(zone, accel, pricing=pricing_of(node)):
                # a stock-out is reported in the operation, already done when it is returned
                self._finish_op(op, error=self._no_capacity(zone))
                return op
            self._add_node(name, project, zone, node, accel, op=op)
            return op

    def _creation_delay(self) -> float:
        return self.timings.create if self.armed.create_delay is None else self.armed.create_delay

    def _add_node(self, name: str, project: str, zone: str, node: Any, accel: tpu_types.AcceleratorType, *,
                  op: operations_pb2.Operation | None = None, qr: str | None = None) -> _Node:
        pb = NodePb()
        pb.CopyFrom(node)
        pb.name = name
        pb.accelerator_type = accel.name
        pb.state = S.CREATING
        pb.create_time.CopyFrom(_now_ts())
        pb.id = self._rng.getrandbits(62)
        pb.api_version = cloud_tpu.Node.ApiVersion.V2
        pb.accelerator_config.type_ = _FAMILY_CONFIG_TYPE[accel.family]
        pb.accelerator_config.topology = tpu_types.topology(accel)
        _fill_defaults(pb, project, zone, len(self._nodes))
        pb.ClearField("network_endpoints")
        if qr:
            pb.queued_resource = qr
        uid = uuid.uuid4().hex[:12]
        home = self.state_dir / "hosts" / project / zone / name.rsplit("/", 1)[1] / uid
        rec = _Node(pb=pb, project=project, zone=zone, accel=accel, host_keys=[new_host_key() for _ in range(accel.hosts)], home=home, uid=uid, qr=qr)
        self._nodes[name] = rec
        fail = self.armed.take_creation(zone)
        self._later(self._creation_delay(), lambda: self._finish_create(rec, op, fail))
        return rec

    def _finish_create(self, rec: _Node, op: operations_pb2.Operation | None, fail: dict[str, Any] | None) -> None:
        name = rec.pb.name
        if fail is not None:
            with self._lock:
                if self._nodes.get(name) is rec and rec.pb.state == S.CREATING:
                    del self._nodes[name]
                self.armed.record("creation_failed", node=name, zone=rec.zone, code=fail["code"].name)
            error = fault_error(fail["code"].name, "CreateQueuedResource" if rec.qr else "CreateNode",
                                f"projects/{rec.project}/locations/{rec.zone}", reason=fail.get("reason", ""),
                                message=fail["message"])
            if op is not None:
                self._finish_op(op, error=error)
            if rec.qr:
                self._qr_failed(rec.qr, error)
            return
        with self._lock:
            if self._nodes.get(name) is not rec or rec.pb.state != S.CREATING:
                return
        hosts = self._start_hosts(rec)
        with self._lock:
            if self._nodes.get(name) is not rec or rec.pb.state != S.CREATING:
                stale = hosts
            else:
                stale = []
                self._set_ready(rec, hosts)
                if op is not None:
                    self._finish_op(op, response=rec.pb)
        self._stop_hosts(stale)
        if rec.qr:
            self._qr_node_ready(rec.qr)

    def _set_ready(self, rec: _Node, hosts: list[SSHHost]) -> None:
        rec.hosts = hosts
        rec.pb.state = S.READY
        rec.pb.health = H.HEALTHY
        rec.pb.health_description = ""
        rec.pb.ClearField("network_endpoints")
        for h in hosts:
            ep = rec.pb.network_endpoints.add()
            ep.ip_address = h.bind
            ep.port = h.port
            ep.access_config.external_ip = h.bind

    def _start_hosts(self, rec: _Node) -> list[SSHHost]:
        """Start one SSH server per worker; a restart reuses the keys and, when free, the ports."""
        old = {i: h.port for i, h in enumerate(rec.hosts)}
        n = rec.accel.hosts
        names = ",".join([self.host_bind] * n)
        hosts = []
        for i in range(n):
            env = {
                "HOME": str(rec.home / f"worker-{i}"),
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "SHELL": "/bin/bash",
                "LANG": "C.UTF-8",
                "TPU_WORKER_ID": str(i),
                "TPU_WORKER_HOSTNAMES": names,
                "TPU_ACCELERATOR_TYPE": rec.accel.name,
                "TPU_NAME": rec.pb.name.rsplit("/", 1)[1],
                "TPU_ZONE": rec.zone,
                "TPU_PROJECT": rec.project,
                "TPU_CHIPS_PER_HOST": str(rec.accel.chips_per_host),
                "TPU_RUNTIME_VERSION": rec.pb.runtime_version,
            }
            host = SSHHost(
                acceptor=self._acceptor,
                home=rec.home / f"worker-{i}",
                env=env,
                host_key=rec.host_keys[i],
                authorized=lambda rec=rec: parse_ssh_keys(rec.pb.metadata.get("ssh-keys", "")),
                token=f"{rec.uid}-{i}",
                bind=self.host_bind,
            )
            host.port = old.get(i, 0)
            try:
                host.start()
            except OSError:
                host.port = 0
                host.start()
            hosts.append(host)
        return hosts

    def _stop_hosts(self, hosts: list[SSHHost]) -> None:
        if not hosts:
            return
        threads = [threading.Thread(target=h.stop, daemon=True) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    # ---------------------------------------------------------------- nodes: delete / stop / start / update
    def delete_node(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            rec = self._node(name)
            op = self._new_op(rec.project, rec.zone, "delete", name)
            fault = self.armed.take_next_operation("delete", name)
            if fault is not None:
                self._later(self.timings.delete, lambda: self._finish_op(op, error=ApiError(fault["code"], fault["message"])))
                return op
            rec.pb.state = S.DELETING
            hosts, rec.hosts = rec.hosts, []

        def done() -> None:
            with self._lock:
                if self._nodes.get(name) is rec:
                    del self._nodes[name]
            self._finish_op(op, response=empty_pb2.Empty())
            self._pump_queue()

        self._stop_hosts(hosts)
        self._later(self.timings.delete, done)
        return op

    def stop_node(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            rec = self._node(name)
            if rec.accel.hosts > 1:  # the API's own description: stop is for single TPU nodes only
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Node '{name}' is a multi-host slice ({rec.accel.name}, "
                               f"{rec.accel.hosts} hosts): stop is only available for single TPU nodes")
            if rec.pb.state != S.READY:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Node '{name}' is {S(rec.pb.state).name}; only a READY node can be stopped")
            op = self._new_op(rec.project, rec.zone, "stop", name)
            fault = self.armed.take_next_operation("stop", name)
            if fault is not None:
                self._later(self.timings.stop, lambda: self._finish_op(op, error=ApiError(fault["code"], fault["message"])))
                return op
            rec.pb.state = S.STOPPING
            hosts = list(rec.hosts)

        def done() -> None:
            self._stop_hosts(hosts)
            with self._lock:
                if self._nodes.get(name) is rec and rec.pb.state == S.STOPPING:
                    rec.pb.state = S.STOPPED
                    rec.pb.health = H.HEALTH_UNSPECIFIED
            self._finish_op(op, response=rec.pb)
            self._pump_queue()

        self._later(self.timings.stop, done)
        return op

    def start_node(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            rec = self._node(name)
            if rec.pb.state != S.STOPPED:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Node '{name}' is {S(rec.pb.state).name}; only a STOPPED node can be started")
            op = self._new_op(rec.project, rec.zone, "start", name)
            fault = self.armed.take_next_operation("start", name)
            if fault is not None:
                self._later(self.timings.start, lambda: self._finish_op(op, error=ApiError(fault["code"], fault["message"])))
                return op
            if not self._fits(rec.zone, rec.accel, pricing=pricing_of(rec.pb)):
                self._finish_op(op, error=self._no_capacity(rec.zone))
                return op
            rec.pb.state = S.STARTING

        def done() -> None:
            with self._lock:
                if self._nodes.get(name) is not rec or rec.pb.state != S.STARTING:
                    return
            hosts = self._start_hosts(rec)
            with self._lock:
                if self._nodes.get(name) is rec and rec.pb.state == S.STARTING:
                    self._set_ready(rec, hosts)
                    hosts = []
                    self._finish_op(op, response=rec.pb)
            self._stop_hosts(hosts)

        self._later(self.timings.start, done)
        return op

    def update_node(self, node: Any, paths: list[str]) -> operations_pb2.Operation:
        allowed = {"description", "labels", "metadata", "tags", "scheduling_config", "network_config", "shielded_instance_config", "data_disks"}
        with self._lock:
            rec = self._node(node.name)
            bad = [p for p in paths if p not in allowed]
            if bad or not paths:
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid update_mask {paths!r}: updatable fields are {', '.join(sorted(allowed))}")
            for p in paths:
                rec.pb.ClearField(p)
                if p in ("labels", "metadata"):
                    getattr(rec.pb, p).update(getattr(node, p))
                elif p in ("tags", "data_disks"):
                    getattr(rec.pb, p).extend(getattr(node, p))
                elif rec.pb.DESCRIPTOR.fields_by_name[p].message_type is not None:
                    getattr(rec.pb, p).CopyFrom(getattr(node, p))
                else:
                    setattr(rec.pb, p, getattr(node, p))
            op = self._new_op(rec.project, rec.zone, "update", node.name)
            self._finish_op(op, response=rec.pb)
            return op

    # ---------------------------------------------------------------- guest attributes
    def guest_attributes(self, name: str, query_path: str, worker_ids: list[str]) -> list[Any]:
        with self._lock:
            rec = self._node(name)
            keys = list(rec.host_keys)
        wanted = range(len(keys)) if not worker_ids else [int(w) for w in worker_ids if w.isdigit() and int(w) < len(keys)]
        parts = [p for p in (query_path or "").strip("/").split("/") if p]
        out = []
        for i in wanted:
            ga = cloud_tpu.GuestAttributes.pb()(query_path=query_path)
            key = keys[i]
            entries = [("hostkeys", key.get_name(), key.get_base64())]
            for ns, k, v in entries:
                if parts and parts[0] != ns:
                    continue
                if len(parts) > 1 and parts[1] != k:
                    continue
                ga.query_value.items.add(namespace=ns, key=k, value=v)
            out.append(ga)
        return out

    # ---------------------------------------------------------------- queued resources
    def _qr(self, name: str) -> _QR:
        _split_name(name, "queuedResources")
        rec = self._qrs.get(name)
        if rec is None:
            raise not_found(name)
        return rec

    def get_queued_resource(self, name: str) -> Any:
        with self._lock:
            out = QueuedResourcePb()
            out.CopyFrom(self._qr(name).pb)
            return out

    def list_queued_resources(self, parent: str) -> list[Any]:
        project, zone = self._known_parent(parent)
        with self._lock:
            out = []
            for rec in self._qrs.values():
                if rec.project == project and zone in (rec.zone, "-"):
                    c = QueuedResourcePb()
                    c.CopyFrom(rec.pb)
                    out.append(c)
            return sorted(out, key=lambda q: q.name)

    def _set_qr_state(self, rec: _QR, state: int, initiator: int = cloud_tpu.QueuedResourceState.StateInitiator.SERVICE, error: status_pb2.Status | None = None) -> None:
        st = QRStatePb(state=state, state_initiator=initiator)
        data_field = {Q.CREATING: "creating_data", Q.ACCEPTED: "accepted_data", Q.PROVISIONING: "provisioning_data", Q.FAILED: "failed_data", Q.DELETING: "deleting_data", Q.ACTIVE: "active_data", Q.SUSPENDING: "suspending_data", Q.SUSPENDED: "suspended_data"}.get(state)
        if data_field == "failed_data":
            st.failed_data.error.CopyFrom(error or status_pb2.Status())
        elif data_field:
            getattr(st, data_field).SetInParent()
        rec.pb.state.CopyFrom(st)

    def create_queued_resource(self, parent: str, qr_id: str, qr: Any) -> operations_pb2.Operation:
        project, zone = parse_parent(parent)
        self._check_node_id(qr_id)
        name = f"{parent}/queuedResources/{qr_id}"
        specs = []
        for spec in qr.tpu.node_spec:
            sp_project, sp_zone = parse_parent(spec.parent or parent)
            if (sp_project, sp_zone) != (project, zone):
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"node_spec parent {spec.parent!r} must equal the queued resource's parent {parent!r}")
            accel = self._accel(spec.node, zone)
            if spec.HasField("multislice_params"):
                prefix = spec.multislice_params.node_id_prefix or qr_id
                ids = [f"{prefix}-{i}" for i in range(spec.multislice_params.node_count)]
            else:
                ids = [spec.node_id or qr_id]
            for nid in ids:
                self._check_node_id(nid)
                node = NodePb()
                node.CopyFrom(spec.node)
                if qr.HasField("spot"):
                    node.scheduling_config.spot = True
                if spec.HasField("multislice_params"):
                    node.multislice_node = True  # as Google marks every node of a multislice queued resource
                specs.append((f"{parent}/nodes/{nid}", node, accel))
        if not specs:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Field 'tpu.node_spec' is required")
        with self._lock:
            if name in self._qrs:
                raise ApiError(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{name}' already exists")
            for node_name, _, _ in specs:
                if node_name in self._nodes:
                    raise ApiError(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{node_name}' already exists")
            op = self._new_op(project, zone, "create", name)
            fault = self.armed.take_next_operation("create", name)
            if fault is not None:
                self._later(self.timings.queue_step, lambda: self._finish_op(op, error=ApiError(fault["code"], fault["message"])))
                return op
            pb = QueuedResourcePb()
            pb.CopyFrom(qr)
            pb.name = name
            pb.create_time.CopyFrom(_now_ts())
            rec = _QR(pb=pb, project=project, zone=zone, specs=specs, waiting_since=time.monotonic())
            self._set_qr_state(rec, Q.CREATING, cloud_tpu.QueuedResourceState.StateInitiator.USER)
            self._qrs[name] = rec

        def accepted() -> None:
            with self._lock:
                if self._qrs.get(name) is not rec or rec.pb.state.state != Q.CREATING:
                    return
                self._set_qr_state(rec, Q.ACCEPTED)
                self._finish_op(op, response=rec.pb)
                self._arm_deadline(rec)
            self._later(self.timings.queue_step, self._pump_queue)

        self._later(self.timings.queue_step, accepted)
        return op

    def _arm_deadline(self, rec: _QR) -> None:
        pol = rec.pb.queueing_policy
        limit = None
        if pol.HasField("valid_until_duration"):
            limit = pol.valid_until_duration.ToTimedelta().total_seconds()
        elif pol.HasField("valid_until_time"):
            limit = pol.valid_until_time.ToDatetime().timestamp() - time.time()
        if limit is None:
            return

        def expire() -> None:
            with self._lock:
                if self._qrs.get(rec.pb.name) is rec and rec.pb.state.state in (Q.ACCEPTED, Q.WAITING_FOR_RESOURCES):
                    self._set_qr_state(rec, Q.FAILED, error=status_pb2.Status(code=grpc.StatusCode.DEADLINE_EXCEEDED.value[0], message="The queued resource could not be provisioned before its valid_until time"))

        self._later(max(0.0, limit), expire)

    def _pump_queue(self) -> None:
        """Provision waiting queued resources, oldest first, while their zones have chips."""
        to_create = []
        with self._lock:
            if self._closed:
                return
            waiting = sorted((q for q in self._qrs.values() if q.pb.state.state in (Q.ACCEPTED, Q.WAITING_FOR_RESOURCES)), key=lambda q: q.waiting_since)
            for q in waiting:
                extra: dict[str, int] = {}
                fits = True
                for _, node, accel in q.specs:  # every slice of it, or none
                    if not self._fits(q.zone, accel, extra.get(accel.family, 0), pricing_of(node), extra.get(accel.family, 0)):
                        fits = False
                        break
                    extra[accel.family] = extra.get(accel.family, 0) + accel.chips
                if not fits or any(n in self._nodes for n, _, _ in q.specs):
                    if q.pb.state.state != Q.WAITING_FOR_RESOURCES:
                        self._set_qr_state(q, Q.WAITING_FOR_RESOURCES)
                    continue
                self._set_qr_state(q, Q.PROVISIONING)
                to_create.append(q)
            for q in to_create:
                for node_name, node, accel in q.specs:
                    self._add_node(node_name, q.project, q.zone, node, accel, qr=q.pb.name)

    def _qr_node_ready(self, qr_name: str) -> None:
        with self._lock:
            q = self._qrs.get(qr_name)
            if q is None or q.pb.state.state != Q.PROVISIONING:
                return
            if all((n := self._nodes.get(name)) is not None and n.pb.state == S.READY for name, _, _ in q.specs):
                self._set_qr_state(q, Q.ACTIVE)

    def _qr_failed(self, qr_name: str, error: ApiError) -> None:
        with self._lock:
            q = self._qrs.get(qr_name)
            if q is None or q.pb.state.state != Q.PROVISIONING:
                return
            self._set_qr_state(q, Q.FAILED, error=error.status())
            doomed = [self._nodes.pop(n) for n, _, _ in q.specs if n in self._nodes]
        self._stop_hosts([h for r in doomed for h in r.hosts])
        self._pump_queue()

    def _qr_suspend(self, qr_name: str) -> None:
        with self._lock:
            q = self._qrs.get(qr_name)
            if q is None or q.pb.state.state not in (Q.ACTIVE, Q.PROVISIONING):
                return
            self._set_qr_state(q, Q.SUSPENDING)

        def suspended() -> None:
            with self._lock:
                if self._qrs.get(qr_name) is q and q.pb.state.state == Q.SUSPENDING:
                    self._set_qr_state(q, Q.SUSPENDED)

        self._later(self.timings.queue_step, suspended)

    def delete_queued_resource(self, name: str, force: bool) -> operations_pb2.Operation:
        with self._lock:
            q = self._qr(name)
            nodes = [self._nodes[n] for n, _, _ in q.specs if n in self._nodes and self._nodes[n].qr == name]
            if nodes and not force:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Queued resource '{name}' still has node(s) {', '.join(n.pb.name for n in nodes)}: delete them first or pass force=True")
            op = self._new_op(q.project, q.zone, "delete", name)
            fault = self.armed.take_next_operation("delete", name)
            if fault is not None:
                self._later(self.timings.delete, lambda: self._finish_op(op, error=ApiError(fault["code"], fault["message"])))
                return op
            self._set_qr_state(q, Q.DELETING, cloud_tpu.QueuedResourceState.StateInitiator.USER)
            for n in nodes:
                n.pb.state = S.DELETING
            hosts = [h for n in nodes for h in n.hosts]
            for n in nodes:
                n.hosts = []
        self._stop_hosts(hosts)

        def done() -> None:
            with self._lock:
                for n in nodes:
                    if self._nodes.get(n.pb.name) is n:
                        del self._nodes[n.pb.name]
                if self._qrs.get(name) is q:
                    del self._qrs[name]
            self._finish_op(op, response=empty_pb2.Empty())
            self._pump_queue()

        self._later(self.timings.delete, done)
        return op

    def reset_queued_resource(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            q = self._qr(name)
            if q.pb.state.state not in (Q.SUSPENDED, Q.FAILED, Q.ACTIVE):
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Queued resource '{name}' is {Q(q.pb.state.state).name}; only ACTIVE, SUSPENDED or FAILED ones can be reset")
            op = self._new_op(q.project, q.zone, "reset", name)
            doomed = [self._nodes.pop(n) for n, _, _ in q.specs if n in self._nodes]
            self._set_qr_state(q, Q.ACCEPTED, cloud_tpu.QueuedResourceState.StateInitiator.USER)
            q.waiting_since = time.monotonic()
        self._stop_hosts([h for r in doomed for h in r.hosts])

        def done() -> None:
            with self._lock:
                self._finish_op(op, response=q.pb)
            self._pump_queue()

        self._later(self.timings.queue_step, done)
        return op

    # ---------------------------------------------------------------- operations
    def get_operation(self, name: str) -> operations_pb2.Operation:
        with self._lock:
            op = self._ops.get(name)
            if op is None:
                raise not_found(name)
            out = operations_pb2.Operation()
            out.CopyFrom(op)
            return out

    def list_operations(self, name: str) -> list[Any]:
        with self._lock:
            prefix = (name or "").rstrip("/") + "/operations/"
            return [self.get_operation(n) for n in sorted(self._ops) if n.startswith(prefix) or not name]

    def delete_operation(self, name: str) -> None:
        with self._lock:
            if self._ops.pop(name, None) is None:
                raise not_found(name)

    def cancel_operation(self, name: str) -> None:
        with self._lock:
            op = self._ops.get(name)
            if op is None:
                raise not_found(name)
            meta = OperationMetadataPb()
            op.metadata.Unpack(meta)
            meta.cancel_requested = True
            op.metadata.CopyFrom(pack(meta))

    # ---------------------------------------------------------------- control: faults
    def resolve_node(self, node: str) -> str:
        """A full node name, or a bare node id if exactly one node has it."""
        with self._lock:
            if node in self._nodes:
                return node
            hits = [n for n in self._nodes if n.rsplit("/", 1)[1] == node]
            if len(hits) == 1:
                return hits[0]
            if not hits:
                raise not_found(node)
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Node id {node!r} is ambiguous: {', '.join(sorted(hits))}")

    def preempt(self, node: str, *, at: float | None = None, rate: float | None = None, state: str = "PREEMPTED") -> float:
        """Preempt now, `at` seconds from now (or at a UNIX time), or after a random delay drawn
        from `rate` preemptions per hour. Returns the delay in seconds."""
        name = self.resolve_node(node)
        target = S[state]
        if target not in (S.PREEMPTED, S.TERMINATED):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "state must be PREEMPTED or TERMINATED")
        if rate is not None:
            if rate <= 0:
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "rate must be > 0 preemptions per hour")
            delay = self._rng.expovariate(rate / 3600.0)
        elif at is not None:
            delay = at - time.time() if at > 1e9 else at
        else:
            delay = 0.0
        delay = max(0.0, delay)
        if delay > 0:
            self.armed.record("preempt_scheduled", node=name, delay=delay, state=state)
            self._later(delay, lambda: self._preempt_now(name, target))
        else:
            self._preempt_now(name, target)
        return delay

    def _preempt_now(self, name: str, target: int) -> None:
        with self._lock:
            rec = self._nodes.get(name)
            if rec is None or rec.pb.state not in (S.READY, S.CREATING, S.STARTING, S.REPAIRING, S.RESTARTING):
                self.armed.record("preempt_skipped", node=name, reason="node gone or not running")
                return
            rec.pb.state = target
            rec.pb.health = H.HEALTH_UNSPECIFIED
            hosts, rec.hosts = rec.hosts, []
            self.armed.record("preempt", node=name, state=S(target).name)
        self._stop_hosts(hosts)
        if rec.qr:
            self._qr_suspend(rec.qr)
        self._pump_queue()

    def maintenance_event(self, node: str, *, duration: float | None = None) -> None:
        """Health UNHEALTHY_MAINTENANCE and every host's processes killed (the VMs restart),
        then HEALTHY again after `duration` seconds; SSH stays reachable."""
        name = self.resolve_node(node)
        with self._lock:
            rec = self._nodes[name]
            if rec.pb.state != S.READY:
                raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Node '{name}' is {S(rec.pb.state).name}, not READY")
            rec.pb.health = H.UNHEALTHY_MAINTENANCE
            rec.pb.health_description = "The TPU is going through a maintenance event"
            hosts = list(rec.hosts)
            self.armed.record("maintenance", node=name)
        for h in hosts:
            h.kill_processes()

        def over() -> None:
            with self._lock:
                if self._nodes.get(name) is rec and rec.pb.health == H.UNHEALTHY_MAINTENANCE:
                    rec.pb.health = H.HEALTHY
                    rec.pb.health_description = ""
                    self.armed.record("maintenance_over", node=name)

        self._later(self.timings.maintenance if duration is None else duration, over)

    def kill_host(self, node: str, worker: int) -> None:
        """Worker `worker` dies: its processes are killed and its SSH port closes; the node
        stays READY with health TIMEOUT, as a pod with one dead VM reads."""
        name = self.resolve_node(node)
        with self._lock:
            rec = self._nodes[name]
            if not 0 <= worker < len(rec.hosts):
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Node '{name}' has no running worker {worker}")
            host = rec.hosts[worker]
            rec.pb.health = H.TIMEOUT
            rec.pb.health_description = f"Worker {worker} is not responding"
            self.armed.record("kill_host", node=name, worker=worker, port=host.port)
        host.stop()

    def host_of(self, node: str, worker: int) -> SSHHost:
        """The running SSH host of `worker`, for the host-hygiene faults."""
        name = self.resolve_node(node)
        with self._lock:
            rec = self._nodes[name]
            if not 0 <= worker < len(rec.hosts):
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Node '{name}' has no running worker {worker}")
            return rec.hosts[worker]

    def host_fault(self, fault: str, node: str, worker: int, **kwargs: Any) -> dict[str, Any]:
        """stale_process | stale_lock | unmount | fill_disk on one worker (see emulator.hosts)."""
        host = self.host_of(node, worker)
        if fault == "stale_process":
            result: dict[str, Any] = {"pid": host.stale_process(kwargs.get("env"), lock=kwargs.get("lock", True))}
        elif fault == "stale_lock":
            result = {"path": host.stale_lock()}
        elif fault == "unmount":
            result = {"unmounted": host.unmount(kwargs.get("path"))}
        elif fault == "fill_disk":
            host.fill_disk(kwargs.get("free"))
            result = {"free": kwargs.get("free")}
        else:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown host fault {fault!r}")
        self.armed.record(fault, node=self.resolve_node(node), worker=worker, **result)
        return result

    def set_capacity(self, zone: str, family: str, chips: int | None, pricing: str | None = None) -> None:
        """Chips the zone can give that family (under `pricing` alone, when given); None
        restores the generous default."""
        if family not in tpu_types.ZONES:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Unknown TPU family {family!r}: one of {', '.join(tpu_types.ZONES)}")
        if pricing is not None and pricing not in PRICINGS:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Unknown pricing {pricing!r}: one of {', '.join(PRICINGS)}")
        with self._lock:
            if chips is None:
                self._capacity.pop((zone, family, pricing), None)
            else:
                self._capacity[(zone, family, pricing)] = int(chips)
            self.armed.record("capacity", zone=zone, family=family, chips=chips, **({"pricing": pricing} if pricing else {}))
        self._pump_queue()

    def capacity_schedule(self, steps: list[dict[str, Any]], *, repeat_s: float | None = None) -> int:
        """Capacity that comes and goes: each step `{"at": seconds from now, "zone", "family",
        "chips" (null: the default), "pricing" (optional)}` is applied at its time; with
        `repeat_s` the whole schedule starts again every that many seconds. Returns the steps
        scheduled (checked first: a bad step schedules nothing)."""
        for step in steps:
            if not isinstance(step, dict) or not {"at", "zone", "family"} <= set(step):
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"a capacity step needs at, zone, family (and chips): {step!r}")
            if step["family"] not in tpu_types.ZONES or step.get("pricing") not in (None, *PRICINGS):
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown family or pricing in capacity step {step!r}")
        if repeat_s is not None and repeat_s <= max((float(s["at"]) for s in steps), default=0.0):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "repeat_s must be longer than the last step's `at`")

        def run(offset: float) -> None:
            for step in steps:
                chips = step.get("chips")
                self._later(offset + float(step["at"]), lambda s=step, c=chips: None if self._closed else self.set_capacity(
                    s["zone"], s["family"], None if c is None else int(c), s.get("pricing")))
            if repeat_s is not None:
                self._later(offset + repeat_s, lambda: None if self._closed else run(0.0))

        self.armed.record("capacity_schedule", steps=len(steps), repeat_s=repeat_s)
        run(0.0)
        return len(steps)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "nodes": [
                    {"name": n.pb.name, "state": S(n.pb.state).name, "health": H(n.pb.health).name, "accelerator_type": n.accel.name, "ports": [h.port for h in n.hosts], "queued_resource": n.qr or ""}
                    for n in sorted(self._nodes.values(), key=lambda n: n.pb.name)
                ],
                "queued_resources": [{"name": q.pb.name, "state": Q(q.pb.state.state).name} for q in sorted(self._qrs.values(), key=lambda q: q.pb.name)],
                "capacity": [{"zone": z, "family": f, "pricing": p, "chips": c, "used": self._used(z, f, p)}
                             for (z, f, p), c in sorted(self._capacity.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or ""))],
            }
