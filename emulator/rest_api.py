"""google.cloud.tpu.v2 over HTTP/JSON, as tpu.googleapis.com serves it to gcloud and REST clients.

Routes are the API's HTTP bindings (`google.api.http`), read from google-cloud-tpu's own
REST transport, so paths, verbs and bodies are exactly what the real clients send. Requests
and responses go through protobuf's `json_format`, i.e. the proto3 JSON mapping: camelCase
names, enums by name (by number when the client asks `$alt=json;enum-encoding=int`, as the
Python client does), int64, Durations and Timestamps as strings, `Any` with "@type". Each
route calls the same `emulator.api` method as the gRPC server, on the same `Cloud`.

Errors are Google's JSON error bodies, `{"error": {"code": HTTP, "message", "status"}}`, the
HTTP status following google/rpc/code.proto. A request outside the v2 surface (v1,
v2alpha1 - the `gcloud alpha` track -, unknown paths) answers 501 UNIMPLEMENTED.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import grpc
from google.cloud.tpu_v2.services.tpu.transports.rest_base import _BaseTpuRestTransport
from google.protobuf import json_format

from emulator.api import Method, services
from emulator.cloud import Cloud
from emulator.errors import ApiError
from emulator.httpd import JsonHandler, JsonServer

log = logging.getLogger("emulator.rest")

# google/rpc/code.proto: "HTTP Mapping" of each canonical code.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}

# System parameters every Google API accepts besides the request's fields
# (cloud.google.com/apis/docs/system-parameters); gcloud sends alt=json.
_SYSTEM_PARAMS = frozenset({"alt", "$alt", "prettyPrint", "$prettyPrint", "fields", "$fields", "key", "quotaUser", "callback", "$callback", "uploadType", "upload_protocol", "access_token", "oauth_token", "userIp"})

# A template's `*` is one path segment; a trailing `:verb` is never part of it.
_SEGMENT = {"*": "[^/:]+", "**": "[^:]+"}
_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)(?:=([^}]*))?\}")


@dataclass(frozen=True)
class Route:
    name: str  # "google.cloud.tpu.v2.Tpu/GetNode"
    verb: str  # "GET", "POST", ...
    pattern: re.Pattern[str]
    fields: tuple[str, ...]  # request fields bound by the path's variables, in order
    body: str | None  # "*" (the whole request), one field's name, or None
    method: Method


def compile_template(uri: str) -> tuple[re.Pattern[str], tuple[str, ...]]:
    """An HTTP rule's path template ("/v2/{name=projects/*/locations/*}/operations") as a
    regular expression with one group per variable, and the variables' field paths."""
    parts: list[str] = []
    fields: list[str] = []
    pos = 0
    for m in _VARIABLE.finditer(uri):
        parts.append(re.escape(uri[pos : m.start()]))
        segments = (m.group(2) or "*").split("/")
        parts.append("(" + "/".join(_SEGMENT.get(s, re.escape(s)) for s in segments) + ")")
        fields.append(m.group(1))
        pos = m.end()
    parts.append(re.escape(uri[pos:]))
    return re.compile("".join(parts)), tuple(fields)


def _http_rules(method: str) -> list[dict[str, str]]:
    """The HTTP rules of `method` as google-cloud-tpu's REST transport sends it."""
    base = getattr(_BaseTpuRestTransport, f"_Base{method}", None)
    if base is None:
        raise RuntimeError(f"the installed google-cloud-tpu has no HTTP binding for {method}; the emulator needs google-cloud-tpu >= 1.21 (v2 queued resources and their REST bindings)")
    return base._get_http_options()


# gcloud's `compute tpus locations` and `compute tpus accelerator-types` groups still call
# v1 (the TPU Node API), at the same paths but for the version, and with messages whose
# JSON is the same as v2's for these methods; the rest of v1 is not emulated.
_ALSO_V1 = frozenset({"ListLocations", "GetLocation", "ListAcceleratorTypes", "GetAcceleratorType"})


def routes(cloud: Cloud) -> list[Route]:
    out = []
    for service, methods in services(cloud).items():
        for name, method in methods.items():
            rules = _http_rules(name)
            if name in _ALSO_V1:
                rules = rules + [{**r, "uri": r["uri"].replace("/v2/", "/v1/", 1)} for r in rules]
            for rule in rules:
                pattern, fields = compile_template(rule["uri"])
                out.append(Route(f"{service}/{name}", rule["method"].upper(), pattern, fields, rule.get("body"), method))
    return out


def _merge(data: Any, message: Any) -> None:
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid JSON payload received. {exc}") from None


def _query_fields(descriptor: Any, query: dict[str, list[str]]) -> dict[str, Any]:
    """Query parameters as a JSON object of the request's fields ("a.b=1" -> {"a": {"b": "1"}}).
    Values stay strings, which the JSON mapping accepts for numbers, enums, masks, durations
    and timestamps; booleans are converted here, where a string is not accepted."""
    out: dict[str, Any] = {}
    for key, values in query.items():
        if key in _SYSTEM_PARAMS:
            continue
        desc, node = descriptor, out
        parts = key.split(".")
        for i, part in enumerate(parts):
            field = desc.fields_by_camelcase_name.get(part) or desc.fields_by_name.get(part)
            last = i == len(parts) - 1
            if field is None or (not last and field.message_type is None):
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query parameter. Field \'{part}\' could not be found in request message.')
            if not last:
                node = node.setdefault(field.json_name, {})
                desc = field.message_type
                continue
            if field.type == field.TYPE_BOOL:
                values = [{"true": True, "false": False}.get(v.lower(), v) for v in values]
            node[field.json_name] = values if field.is_repeated else values[-1]
    return out


def _request(route: Route, values: tuple[str, ...], query: dict[str, list[str]], body: bytes) -> Any:
    request = route.method.request()
    _merge(_query_fields(request.DESCRIPTOR, query), request)
    if route.body is not None:
        try:
            data = json.loads(body or b"{}")
        except ValueError as exc:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid JSON payload received. {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid JSON payload received. Expected an object, got {type(data).__name__}.")
        _merge(data, request if route.body == "*" else getattr(request, route.body))
    for field, value in zip(route.fields, values, strict=True):
        *outer, last = field.split(".")
        target = request
        for part in outer:
            target = getattr(target, part)
        setattr(target, last, unquote(value))
    return request


def _error(code: grpc.StatusCode, message: str, exc: ApiError | None = None) -> tuple[int, dict[str, Any]]:
    """Google's JSON error body; its `details` carry the google.rpc.ErrorInfo (reason, domain)."""
    status = HTTP_STATUS[code]
    error: dict[str, Any] = {"code": status, "message": message, "status": code.name}
    if exc is not None:
        error["details"] = [json_format.MessageToDict(d, preserving_proto_field_name=False) for d in exc.status().details]
    return status, {"error": error}


Selector = dict[str, "Selector | None"]


def parse_fields(text: str) -> Selector:
    """A partial-response selector (the `fields` system parameter: "nodes(name,state),nextPageToken",
    "a/b") as a tree: name -> sub-selector, or None for the whole value."""
    pos = 0

    def parse(depth: int) -> Selector:
        nonlocal pos
        sel: Selector = {}
        while pos < len(text):
            m = re.compile(r"\s*([A-Za-z_*][A-Za-z0-9_]*)").match(text, pos)
            if m is None:
                raise ValueError(f"expected a field name at {pos}")
            path = [m.group(1)]
            pos = m.end()
            while pos < len(text) and text[pos] == "/":
                m = re.compile(r"([A-Za-z_*][A-Za-z0-9_]*)").match(text, pos + 1)
                if m is None:
                    raise ValueError(f"expected a field name at {pos + 1}")
                path.append(m.group(1))
                pos = m.end()
            sub: Selector | None = None
            if pos < len(text) and text[pos] == "(":
                pos += 1
                sub = parse(depth + 1)
                if pos >= len(text) or text[pos] != ")":
                    raise ValueError("unbalanced parentheses")
                pos += 1
            node: Selector = sel
            for name in path[:-1]:
                child = node.get(name, {})
                if child is None:  # the whole of it is selected already
                    break
                node[name] = child
                node = child
            else:
                node[path[-1]] = sub
            if pos < len(text) and text[pos] == ",":
                pos += 1
                continue
            if pos < len(text) and text[pos] == ")" and depth > 0:
                return sel
            if pos < len(text):
                raise ValueError(f"unexpected {text[pos]!r} at {pos}")
        if depth > 0:
            raise ValueError("unbalanced parentheses")
        return sel

    return parse(0)


def select(value: Any, selector: Selector | None) -> Any:
    """`value` with only what `selector` names (lists: in each element)."""
    if selector is None:
        return value
    if isinstance(value, list):
        return [select(v, selector) for v in value]
    if not isinstance(value, dict):
        return value
    if "*" in selector:
        return {k: select(v, selector["*"]) for k, v in value.items()}
    return {k: select(value[k], sub) for k, sub in selector.items() if k in value}


def answer(table: list[Route], verb: str, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body Google's front end would answer to `verb target`."""
    url = urlsplit(target)
    query = parse_qs(url.query, keep_blank_values=True)
    for route in table:
        m = route.pattern.fullmatch(url.path)
        if m is None or route.verb != verb:
            continue
        try:
            response = route.method.call(_request(route, m.groups(), query, body))
        except ApiError as exc:
            status, payload = _error(exc.code, exc.message, exc)
        else:
            numeric = any("enum-encoding=int" in v for v in query.get("$alt", []))
            status, payload = 200, json_format.MessageToDict(response, use_integers_for_enums=numeric)
            selector = (query.get("fields") or query.get("$fields") or [""])[-1]
            if selector:
                try:
                    payload = select(payload, parse_fields(selector))
                except ValueError as exc:
                    status, payload = _error(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid field selector {selector!r}: {exc}")
        log.info("%s %s -> %d (%s)", verb, target, status, route.name)
        return status, payload
    log.info("%s %s -> 501 (no such method)", verb, target)
    return _error(grpc.StatusCode.UNIMPLEMENTED, f"The TPU emulator does not implement {verb} {url.path}: it serves the Cloud TPU v2 API (tpu.googleapis.com/v2: nodes, queuedResources, operations, locations, acceleratorTypes, runtimeVersions). Use the GA track of gcloud (not alpha/beta) or google-cloud-tpu's tpu_v2 client.")


class RestServer(JsonServer):
    """The REST surface on host:port (0 = any free port), answering from `cloud`."""

    def __init__(self, cloud: Cloud, host: str = "127.0.0.1", port: int = 0) -> None:
        table = routes(cloud)

        class Handler(JsonHandler):
            def _serve(self) -> None:
                try:
                    status, payload = answer(table, self.command, self.path, self.read_body())
                except Exception as exc:  # a bug here must still answer, as Google's 500 would
                    log.exception("%s %s failed", self.command, self.path)
                    status, payload = _error(grpc.StatusCode.INTERNAL, f"Internal error in the TPU emulator: {exc!r}")
                self.send_json(status, payload)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        super().__init__(Handler, host, port, "emulator-rest")
