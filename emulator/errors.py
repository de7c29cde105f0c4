"""Errors as the Cloud TPU API returns them: a gRPC status code, Google's wording, and the
google.rpc.ErrorInfo (reason, domain, metadata) in the status's details. Every front end
(gRPC, REST, operations) sends an `ApiError` as `ApiError.status()` says."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from ledger import tpu_types

# google.rpc.ErrorInfo the emulator attaches by code, as Google's front end does
# (reason, domain); a fault may name its own reason.
_INFO = {
    "PERMISSION_DENIED": ("IAM_PERMISSION_DENIED", "iam.googleapis.com"),
    "UNAUTHENTICATED": ("ACCESS_TOKEN_EXPIRED", "googleapis.com"),
}
# What the API says for each code a fault can inject (Google's wording where it is known).
FAULT_MESSAGES = {
    "UNAVAILABLE": "The service is currently unavailable.",
    "DEADLINE_EXCEEDED": "Deadline exceeded.",
    "INTERNAL": "Internal error. Please try again.",
    "ABORTED": "The operation was aborted: concurrent modification. Please try again.",
    "CANCELLED": "The operation was cancelled.",
    "RESOURCE_EXHAUSTED": 'There is no more capacity in the zone; you can try in another zone where Cloud TPU Nodes are offered',
    "PERMISSION_DENIED": "Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
    "UNAUTHENTICATED": "Request had invalid authentication credentials. Expected OAuth 2 access token.",
    "INVALID_ARGUMENT": "Invalid value for field 'node.runtime_version'.",
    "NOT_FOUND": "Location '{resource}' was not found.",
    "ALREADY_EXISTS": "Resource already exists.",
    "FAILED_PRECONDITION": "Precondition check failed.",
}


def pack(msg: Message) -> any_pb2.Any:
    """`msg` in a google.protobuf.Any, as statuses' details and operations carry messages."""
    a = any_pb2.Any()
    a.Pack(msg)
    return a


class ApiError(Exception):
    """An error as the API returns it: a gRPC status code, Google's kind of message, and the
    google.rpc.ErrorInfo (reason, domain, metadata) sent in the status's details."""

    def __init__(self, code: grpc.StatusCode, message: str, *, reason: str = "", domain: str = "",
                 metadata: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        default = _INFO.get(code.name, (code.name, "tpu.googleapis.com"))
        self.reason = reason or default[0]
        self.domain = domain or default[1]
        self.metadata = dict(metadata or {})

    def status(self) -> status_pb2.Status:
        """As google.rpc.Status, with its ErrorInfo in `details` (gRPC trailers, REST body, operations)."""
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=self.domain, metadata=self.metadata)
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=[pack(info)])


def fault_error(code: str, method: str, resource: str, *, reason: str = "", message: str | None = None) -> ApiError:
    """The error a fault injects for `method` on `resource`, worded as the API would."""
    status = grpc.StatusCode[code]
    permission = tpu_types.PERMISSIONS.get(method, "tpu.nodes.get")
    text = message or FAULT_MESSAGES.get(code, f"{code}.").format(permission=permission, resource=resource)
    metadata = {"permission": permission, "resource": resource} if code == "PERMISSION_DENIED" else {}
    if code == "RESOURCE_EXHAUSTED" and reason == "QUOTA_EXCEEDED" and message is None:
        text = f"Quota limit 'TPUV4PodPerProjectPerZoneForTPUAPI' has been exceeded for {resource}."
    return ApiError(status, text, reason=reason, metadata=metadata)


def status_code(code: str) -> grpc.StatusCode:
    """The gRPC status named `code` ("INTERNAL"); a name that is none is the caller's bad argument."""
    try:
        return grpc.StatusCode[code]
    except KeyError:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown status code {code!r}: one of {', '.join(FAULT_MESSAGES)}") from None


def not_found(name: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
