"""The Cloud TPU API adapter (google-cloud-tpu). Thin: translates, never decides.

The endpoint comes from configuration: unset = Google Cloud with application default
credentials; `host:port` = a TPU API speaking gRPC without TLS (the local emulator).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ledger import defaults
from ledger.errors import LedgerError
from ledger.tpu_types import DEFAULT_RUNTIME, lookup
from reconciler.model import NodeObs, QueuedObs

# Preferred host-key types, as published in the `hostkeys/` guest attributes.
HOST_KEY_TYPES = ("ecdsa-sha2-nistp256", "ssh-ed25519", "ssh-rsa")
TPU_RUNTIME_PORT = 8470  # what Google Cloud reports as a TPU VM endpoint's port; SSH is on 22


class CapacityError(LedgerError):
    """The zone has no capacity (or quota) for this accelerator now: wait and retry."""


class PermanentTpuError(LedgerError):
    """A request Google will refuse again as it is: permission, quota, invalid argument."""


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


def _exceptions():
    from google.api_core import exceptions

    return exceptions


class TpuApi:
    def __init__(self, project: str, endpoint: str | None = None, *, use_external_ip: bool = False) -> None:
        from google.cloud import tpu_v2

        self.project = project
        self.endpoint = endpoint
        self.use_external_ip = use_external_ip
        self._types = tpu_v2
        if endpoint:
            import grpc
            from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

            self._channel = grpc.insecure_channel(endpoint)
            self.client = tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=self._channel))
        else:  # pragma: no cover - needs Google Cloud credentials
            self._channel = None
            self.client = tpu_v2.TpuClient()
        self.calls = 0  # API calls made, for the benchmark's calls-per-pass figure

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def node_path(self, zone: str, name: str) -> str:
        return f"{self.parent(zone)}/nodes/{name}"

    # -- observing ------------------------------------------------------------------------
    def list_nodes(self, zone: str) -> list[NodeObs]:
        self.calls += 1
        return [self._node_obs(zone, n) for n in self.client.list_nodes(parent=self.parent(zone))]

    def list_queued(self, zone: str) -> list[QueuedObs]:
        self.calls += 1
        out = []
        for qr in self.client.list_queued_resources(parent=self.parent(zone)):
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            message = ""
            if qr.state and qr.state.failed_data and qr.state.failed_data.error:
                message = qr.state.failed_data.error.message
            node_name = qr.tpu.node_spec[0].node_id if qr.tpu and qr.tpu.node_spec else ""
            out.append(QueuedObs(qr.name.rsplit("/", 1)[-1], zone, state, node_name, message))
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
        )

    def host_keys(self, zone: str, name: str) -> list[str | None]:
        """Each worker's SSH host key ('type base64') from guest attributes, to pin it."""
        self.calls += 1
        try:
            resp = self.client.get_guest_attributes(request={"name": self.node_path(zone, name), "query_path": "hostkeys/"})
        except _exceptions().GoogleAPICallError:
            return []
        keys: list[str | None] = []
        for attrs in resp.guest_attributes:
            found = {e.key: e.value for e in attrs.query_value.items}
            keys.append(next((f"{t} {found[t]}" for t in HOST_KEY_TYPES if t in found), None))
        return keys

    def get_node(self, zone: str, name: str) -> NodeObs | None:
        self.calls += 1
        try:
            return self._node_obs(zone, self.client.get_node(name=self.node_path(zone, name)))
        except _exceptions().NotFound:
            return None

    def queued_exists(self, zone: str, name: str) -> bool:
        self.calls += 1
        try:
            self.client.get_queued_resource(name=f"{self.parent(zone)}/queuedResources/{name}")
            return True
        except _exceptions().NotFound:
            return False

    # -- acting ---------------------------------------------------------------------------
    def create(self, req: CreateRequest) -> str:
        """Ask for the TPU; returns 'created' or 'adopted' (our own name already exists).
        Raises CapacityError (retry later) or PermanentTpuError (fix the spec or IAM)."""
        t = self._types
        ex = _exceptions()
        node = self._node_message(req)
        self.calls += 1
        try:
            if req.queued:
                spot = {"spot": t.QueuedResource.Spot()} if req.pricing in ("spot", "preemptible") else {}
                if req.wait_s:
                    from google.protobuf import duration_pb2  # with the client: lazily

                    spot["queueing_policy"] = t.QueuedResource.QueueingPolicy(
                        valid_until_duration=duration_pb2.Duration(seconds=int(req.wait_s)))
                if req.slices > 1:  # one node spec for every slice, as the API asks
                    spec = t.QueuedResource.Tpu.NodeSpec(
                        parent=self.parent(req.zone), node=node,
                        multislice_params=t.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                            node_count=req.slices, node_id_prefix=req.name))
                else:
                    spec = t.QueuedResource.Tpu.NodeSpec(parent=self.parent(req.zone), node_id=req.name, node=node)
                qr = t.QueuedResource(
                    tpu=t.QueuedResource.Tpu(node_spec=[spec]),
                    reservation_name=req.reservation,
                    **spot,
                )
                op = self.client.create_queued_resource(
                    parent=self.parent(req.zone), queued_resource_id=req.name, queued_resource=qr)
            else:
                op = self.client.create_node(parent=self.parent(req.zone), node_id=req.name, node=node)
            # Google may report a stock-out only in the operation: look once, without waiting.
            if op.done() and op.exception() is not None:
                raise op.exception()
            return "created"
        except ex.AlreadyExists:
            return "adopted"
        except ex.ResourceExhausted as exc:
            raise CapacityError(f"no capacity for {req.accelerator} in {req.zone}: {exc.message}") from exc
        except ex.PermissionDenied as exc:
            raise PermanentTpuError(
                f"permission denied creating {req.name}: {exc.message}",
                hint="grant the reconciler's service account roles/tpu.admin on the project",
            ) from exc
        except (ex.InvalidArgument, ex.FailedPrecondition, ex.NotFound) as exc:
            raise PermanentTpuError(
                f"Google refused {req.accelerator} in {req.zone}: {exc.message}",
                hint="check tpu.accelerator, tpu.zone and tpu.version in the job spec",
            ) from exc

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
        ex = _exceptions()
        gone = True
        self.calls += 1
        if queued:
            try:
                self.client.delete_queued_resource(
                    request={"name": f"{self.parent(zone)}/queuedResources/{name}", "force": True})
                gone = False
            except ex.NotFound:
                pass
        try:
            op = self.client.delete_node(name=self.node_path(zone, name))
            gone = False
        except ex.NotFound:
            return not gone
        try:
            op.result(timeout=defaults.TPU_DELETE_WAIT_S)
        except ex.NotFound:
            pass  # deleted by someone else (the queued resource's force delete) meanwhile
        except ex.GoogleAPICallError as exc:
            raise DeleteFailedError(f"deleting TPU {name} in {zone} failed: {exc.message}") from exc
        return True

    def await_gone(self, zone: str, name: str, *, timeout: float = defaults.TPU_DELETE_WAIT_S) -> bool:
        """Wait while a deletion someone else asked for is under way: True once the node is
        gone, False when it left DELETING without going (the delete failed: ask again)."""
        deadline = time.monotonic() + timeout
        while (node := self.get_node(zone, name)) is not None and node.state == "DELETING":
            if time.monotonic() > deadline:
                raise DeleteFailedError(f"TPU {name} in {zone} is still being deleted after {timeout:.0f} s")
            time.sleep(defaults.TPU_DELETE_POLL_S)
        return node is None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
