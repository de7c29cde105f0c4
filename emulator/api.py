"""The API's methods as plain functions of request messages, served by both front ends.

`services(cloud)` maps each service (google.cloud.tpu.v2.Tpu, google.longrunning.Operations,
google.cloud.location.Locations) to its methods: a function from the raw protobuf request
to the raw protobuf response, and those two classes. `grpc_api` registers them with a gRPC
server, `rest_api` routes HTTP requests to them by the API's HTTP bindings; neither knows
anything the other does not, so both speak for the same `Cloud`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.cloud.location import locations_pb2
from google.cloud.tpu_v2.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, json_format

from emulator.cloud import Cloud, parse_parent
from emulator.errors import ApiError
from ledger import tpu_types

T = cloud_tpu


@dataclass(frozen=True)
class Method:
    call: Callable[[Any], Any]  # request message -> response message; raises ApiError
    request: Any  # the raw protobuf classes
    response: Any


def _page(items: list[Any], size: int, token: str) -> tuple[list[Any], str]:
    """One page: a token is one this API handed out (the offset of the next item), else refused."""
    if token and not (token.isdigit() and 0 < int(token) <= len(items)):
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid page token: {token!r}", reason="INVALID_PAGE_TOKEN")
    start = int(token) if token else 0
    if size <= 0:
        return items[start:], ""
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


_CONFIG_TYPE = {"v2": 2, "v3": 4, "v4": 7, "v5litepod": 9, "v5p": 10, "v6e": 11}  # AcceleratorConfig.Type


def _accelerator_types(parent: str) -> list[Any]:
    _, zone = parse_parent(parent)
    out = []
    for t in tpu_types.all_types():
        if tpu_types.zone_offers(zone, t.family):
            config = T.AcceleratorConfig.pb()(type_=_CONFIG_TYPE[t.family], topology=tpu_types.topology(t))
            msg = T.AcceleratorType.pb()(name=f"{parent}/acceleratorTypes/{t.name}", type_=t.name, accelerator_configs=[config])
            out.append(msg)
    return out


def _runtime_versions(parent: str) -> list[Any]:
    _, zone = parse_parent(parent)
    return [T.RuntimeVersion.pb()(name=f"{parent}/runtimeVersions/{v}", version=v) for v in tpu_types.runtime_versions(zone)]


_TERM = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(=|!=|:)\s*"?([^"]*?)"?\s*$')


def _filtered(items: list[Any], expression: str) -> list[Any]:
    """AIP-160's simplest form, what gcloud sends: terms `field=value` (`!=`, `:` has) joined
    by AND, on the message's fields by their JSON or proto names. Anything else is refused."""
    if not expression.strip():
        return items
    terms = []
    for part in re.split(r"\s+AND\s+", expression.strip()):
        m = _TERM.match(part)
        if m is None:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid filter: {expression!r}", reason="INVALID_FILTER")
        terms.append(m.groups())

    def value(item: Any, path: str) -> str:
        data = json_format.MessageToDict(item, preserving_proto_field_name=True)
        camel = json_format.MessageToDict(item)
        for source in (data, camel):
            node: Any = source
            for key in path.split("."):
                node = node.get(key) if isinstance(node, dict) else None
            if node is not None:
                return str(node)
        return ""

    def keep(item: Any) -> bool:
        for field, op, want in terms:
            got = value(item, field)
            if op == "=" and got != want or op == "!=" and got == want or op == ":" and want not in got:
                return False
        return True

    return [item for item in items if keep(item)]


def _get_named(items: list[Any], name: str) -> Any:
    for item in items:
        if item.name == name:
            return item
    raise ApiError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")


def _parent_of(name: str) -> str:
    return "/".join(name.split("/")[:4])


def services(cloud: Cloud) -> dict[str, dict[str, Method]]:
    # The TPU service's messages are the raw protobuf classes proto-plus builds at run time
    # (`T.X.pb()`): no static type names them, so they are `Any`; the Operations and
    # Locations services' messages are generated classes, named below.
    def list_nodes(req: Any) -> Any:
        items, token = _page(cloud.list_nodes(req.parent), req.page_size, req.page_token)
        return T.ListNodesResponse.pb()(nodes=items, next_page_token=token)

    def list_qrs(req: Any) -> Any:
        items, token = _page(cloud.list_queued_resources(req.parent), req.page_size, req.page_token)
        return T.ListQueuedResourcesResponse.pb()(queued_resources=items, next_page_token=token)

    def list_accel(req: Any) -> Any:
        items, token = _page(_filtered(_accelerator_types(req.parent), req.filter), req.page_size, req.page_token)
        return T.ListAcceleratorTypesResponse.pb()(accelerator_types=items, next_page_token=token)

    def list_runtimes(req: Any) -> Any:
        items, token = _page(_filtered(_runtime_versions(req.parent), req.filter), req.page_size, req.page_token)
        return T.ListRuntimeVersionsResponse.pb()(runtime_versions=items, next_page_token=token)

    def guest(req: Any) -> Any:
        return T.GetGuestAttributesResponse.pb()(guest_attributes=cloud.guest_attributes(req.name, req.query_path, list(req.worker_ids)))

    def list_ops(req: operations_pb2.ListOperationsRequest) -> operations_pb2.ListOperationsResponse:
        items, token = _page(cloud.list_operations(req.name), req.page_size, req.page_token)
        return operations_pb2.ListOperationsResponse(operations=items, next_page_token=token)

    def delete_op(req: operations_pb2.DeleteOperationRequest) -> empty_pb2.Empty:
        cloud.delete_operation(req.name)
        return empty_pb2.Empty()

    def cancel_op(req: operations_pb2.CancelOperationRequest) -> empty_pb2.Empty:
        cloud.cancel_operation(req.name)
        return empty_pb2.Empty()

    def service_identity(req: Any) -> Any:
        project, _ = parse_parent(req.parent)
        ident = T.ServiceIdentity.pb()(email=f"service-{project}@cloud-tpu.iam.gserviceaccount.com")
        return T.GenerateServiceIdentityResponse.pb()(identity=ident)

    def list_locations(req: locations_pb2.ListLocationsRequest) -> locations_pb2.ListLocationsResponse:
        project = req.name.split("/")[1] if req.name.startswith("projects/") else "-"
        locs = [locations_pb2.Location(name=f"projects/{project}/locations/{z}", location_id=z) for z in tpu_types.all_zones()]
        items, token = _page(_filtered(locs, req.filter), req.page_size, req.page_token)
        return locations_pb2.ListLocationsResponse(locations=items, next_page_token=token)

    def get_location(req: locations_pb2.GetLocationRequest) -> locations_pb2.Location:
        zone = req.name.rsplit("/", 1)[-1]
        if zone not in tpu_types.all_zones():
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"Resource '{req.name}' was not found")
        return locations_pb2.Location(name=req.name, location_id=zone)

    Op = operations_pb2.Operation
    tpu = {
        "ListNodes": Method(list_nodes, T.ListNodesRequest.pb(), T.ListNodesResponse.pb()),
        "GetNode": Method(lambda r: cloud.get_node(r.name), T.GetNodeRequest.pb(), T.Node.pb()),
        "CreateNode": Method(lambda r: cloud.create_node(r.parent, r.node_id, r.node), T.CreateNodeRequest.pb(), Op),
        "DeleteNode": Method(lambda r: cloud.delete_node(r.name), T.DeleteNodeRequest.pb(), Op),
        "StopNode": Method(lambda r: cloud.stop_node(r.name), T.StopNodeRequest.pb(), Op),
        "StartNode": Method(lambda r: cloud.start_node(r.name), T.StartNodeRequest.pb(), Op),
        "UpdateNode": Method(lambda r: cloud.update_node(r.node, list(r.update_mask.paths)), T.UpdateNodeRequest.pb(), Op),
        "ListQueuedResources": Method(list_qrs, T.ListQueuedResourcesRequest.pb(), T.ListQueuedResourcesResponse.pb()),
        "GetQueuedResource": Method(lambda r: cloud.get_queued_resource(r.name), T.GetQueuedResourceRequest.pb(), T.QueuedResource.pb()),
        "CreateQueuedResource": Method(lambda r: cloud.create_queued_resource(r.parent, r.queued_resource_id, r.queued_resource), T.CreateQueuedResourceRequest.pb(), Op),
        "DeleteQueuedResource": Method(lambda r: cloud.delete_queued_resource(r.name, r.force), T.DeleteQueuedResourceRequest.pb(), Op),
        "ResetQueuedResource": Method(lambda r: cloud.reset_queued_resource(r.name), T.ResetQueuedResourceRequest.pb(), Op),
        "GenerateServiceIdentity": Method(service_identity, T.GenerateServiceIdentityRequest.pb(), T.GenerateServiceIdentityResponse.pb()),
        "ListAcceleratorTypes": Method(list_accel, T.ListAcceleratorTypesRequest.pb(), T.ListAcceleratorTypesResponse.pb()),
        "GetAcceleratorType": Method(lambda r: _get_named(_accelerator_types(_parent_of(r.name)), r.name), T.GetAcceleratorTypeRequest.pb(), T.AcceleratorType.pb()),
        "ListRuntimeVersions": Method(list_runtimes, T.ListRuntimeVersionsRequest.pb(), T.ListRuntimeVersionsResponse.pb()),
        "GetRuntimeVersion": Method(lambda r: _get_named(_runtime_versions(_parent_of(r.name)), r.name), T.GetRuntimeVersionRequest.pb(), T.RuntimeVersion.pb()),
        "GetGuestAttributes": Method(guest, T.GetGuestAttributesRequest.pb(), T.GetGuestAttributesResponse.pb()),
    }
    ops = {
        "GetOperation": Method(lambda r: cloud.get_operation(r.name), operations_pb2.GetOperationRequest, Op),
        "ListOperations": Method(list_ops, operations_pb2.ListOperationsRequest, operations_pb2.ListOperationsResponse),
        "DeleteOperation": Method(delete_op, operations_pb2.DeleteOperationRequest, empty_pb2.Empty),
        "CancelOperation": Method(cancel_op, operations_pb2.CancelOperationRequest, empty_pb2.Empty),
    }
    locations = {
        "ListLocations": Method(list_locations, locations_pb2.ListLocationsRequest, locations_pb2.ListLocationsResponse),
        "GetLocation": Method(get_location, locations_pb2.GetLocationRequest, locations_pb2.Location),
    }
    return {
        service: {name: Method(_gated(cloud, name, m.call), m.request, m.response) for name, m in methods.items()}
        for service, methods in (("google.cloud.tpu.v2.Tpu", tpu), ("google.longrunning.Operations", ops),
                                 ("google.cloud.location.Locations", locations))
    }


def _gated(cloud: Cloud, name: str, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`call`, answered first by an outage or a fault armed for `name` (ArmedFaults.gate)."""
    def gated(request: Any) -> Any:
        cloud.armed.gate(name, request)
        return call(request)

    return gated
