"""A local double of GitHub's REST API: the few endpoints tpu-ledger calls, answering with
objects built from GitHub's published OpenAPI description as githubkit carries it (its
pydantic models' JSON schemas): every required field present with a value of its type,
then the fields a test cares about set. The double validates each answer with the same
models before it sends it, and githubkit validates it again on arrival."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from githubkit_schemas.latest.models import PullRequest, PullRequestReview
from pydantic import TypeAdapter

_NOW = "2026-01-01T00:00:00Z"


def example(model: type) -> dict[str, Any]:
    """A minimal instance of `model` that its schema accepts: required fields only."""
    schema = TypeAdapter(model).json_schema()
    defs = schema.get("$defs", {})

    def build(s: dict[str, Any]) -> Any:
        if "$ref" in s:
            return build(defs[s["$ref"].rsplit("/", 1)[-1]])
        for key in ("anyOf", "oneOf", "allOf"):
            if key in s:
                options = [o for o in s[key] if o.get("type") != "null"]
                return build(options[0]) if options else None
        if "const" in s:
            return s["const"]
        if "enum" in s:
            return s["enum"][0]
        kind = s.get("type")
        if kind == "object" or "properties" in s:
            return {k: build(v) for k, v in s.get("properties", {}).items() if k in s.get("required", ())}
        if kind == "array":
            return []
        if kind == "integer":
            return 1
        if kind == "number":
            return 1.0
        if kind == "boolean":
            return False
        if kind == "null":
            return None
        fmt = s.get("format")
        if fmt == "date-time":
            return _NOW
        if fmt in ("uri", "uri-template"):
            return "https://api.github.example/x"
        if fmt == "email":
            return "x@github.example"
        return "x"

    return build(schema)


_REVIEW = example(PullRequestReview)
_USER = dict(example(PullRequest)["user"])
_PULL = example(PullRequest)


@dataclass
class Pull:
    number: int
    head: str
    merged: bool = True
    reviews: list[dict[str, Any]] = field(default_factory=list)


class GitHubDouble:
    """`GET /repos/{o}/{r}/pulls/{n}/reviews` and `GET /repos/{o}/{r}/pulls/{n}`, counted."""

    def __init__(self, repository: str = "lab/jobs") -> None:
        self.repository = repository
        self.pulls: dict[int, Pull] = {}
        self.requests: Counter[str] = Counter()
        self.tokens: list[str | None] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> GitHubDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def review(self, number: int, login: str, state: str, commit: str, at: str | None = None) -> None:
        pull = self.pulls[number]
        review = {**_REVIEW, "id": len(pull.reviews) + 1, "user": {**_USER, "login": login}, "state": state,
                  "commit_id": commit, "submitted_at": at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                  "body": "", "author_association": "MEMBER"}
        PullRequestReview.model_validate(review)  # the published description, before it is sent
        pull.reviews.append(review)

    def _pull(self, pull: Pull) -> dict[str, Any]:
        body = {**_PULL, "number": pull.number, "state": "closed", "merged": pull.merged,
                "merged_at": _NOW if pull.merged else None,
                "head": {**_PULL["head"], "sha": pull.head, "ref": f"pr{pull.number}"}}
        PullRequest.model_validate(body)
        return body

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self
        route = re.compile(r"^/repos/([^/]+)/([^/]+)/pulls/(\d+)(/reviews)?(?:\?(.*))?$")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                m = route.match(self.path)
                double.tokens.append(self.headers.get("Authorization"))
                if not m or f"{m.group(1)}/{m.group(2)}" != double.repository or int(m.group(3)) not in double.pulls:
                    return self._send(404, {"message": "Not Found", "documentation_url": "https://docs.github.com"})
                pull = double.pulls[int(m.group(3))]
                if m.group(4):
                    double.requests["reviews"] += 1
                    page = int(dict(p.split("=", 1) for p in (m.group(5) or "").split("&") if "=" in p).get("page", 1))
                    return self._send(200, pull.reviews[(page - 1) * 100: page * 100])
                double.requests["pull"] += 1
                return self._send(200, double._pull(pull))

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
