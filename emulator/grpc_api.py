"""google.cloud.tpu.v2.Tpu and google.longrunning.Operations over gRPC, backed by a Cloud.

google-cloud-tpu ships the messages but no servicer base class, so the methods of
`emulator.api` are registered with generic handlers using the raw protobuf classes'
(de)serializers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc_status import rpc_status

from emulator.api import Method, services
from emulator.cloud import Cloud
from emulator.errors import ApiError


def build_handlers(cloud: Cloud) -> list[grpc.GenericRpcHandler]:
    return [_service(name, methods) for name, methods in services(cloud).items()]


def _service(name: str, methods: dict[str, Method]) -> grpc.GenericRpcHandler:
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(_wrap(m.call), request_deserializer=m.request.FromString, response_serializer=m.response.SerializeToString)
        for method, m in methods.items()
    }
    return grpc.method_handlers_generic_handler(name, handlers)


def _wrap(fn: Callable[[Any], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request)
        except ApiError as exc:  # with google.rpc.Status details (ErrorInfo), as Google sends them
            context.abort_with_status(rpc_status.to_status(exc.status()))

    return handler
