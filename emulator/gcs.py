"""A small Cloud Storage emulator: the JSON API subset the official client uses for job logs.

The real `google-cloud-storage` client talks to it when STORAGE_EMULATOR_HOST names its URL
(the client then sends no credentials). Served, as Google documents them:
- buckets: insert (`POST /storage/v1/b`), get;
- objects: multipart upload (`POST /upload/storage/v1/b/B/o?uploadType=multipart|media`),
  get metadata, download (`alt=media`, also under `/download/storage/v1`, with a Range
  header), list (`prefix`, `maxResults`, `pageToken`), delete, and compose;
- the preconditions `ifGenerationMatch` (0 = the object must not exist) and
  `ifSourceGenerationMatch` per compose source: 412 when they fail, as Google answers;
- generations that grow with every write, and md5/crc32c in metadata and `x-goog-hash`.
Objects live in memory. Anything else answers 501, so a client call the emulator does not
serve fails loudly instead of seeming to work.

    with GcsEmulator() as gcs:          # gcs.url for STORAGE_EMULATOR_HOST
        gcs.create_bucket("lab-logs")
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from emulator.httpd import JsonHandler, JsonServer

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
PAGE = 1000


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bitwise: objects here are small and this keeps the emulator free
    of native dependencies."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


@dataclass
class _Object:
    name: str
    data: bytes
    generation: int
    content_type: str
    updated: str

    def resource(self, bucket: str, base: str) -> dict[str, Any]:
        return {
            "kind": "storage#object", "id": f"{bucket}/{self.name}/{self.generation}", "bucket": bucket,
            "name": self.name, "generation": str(self.generation), "metageneration": "1",
            "size": str(len(self.data)), "contentType": self.content_type, "md5Hash": self.md5,
            "crc32c": self.crc32c, "timeCreated": self.updated, "updated": self.updated,
            "mediaLink": f"{base}/download/storage/v1/b/{bucket}/o/{quote(self.name, safe='')}"
                         f"?generation={self.generation}&alt=media",
        }

    @property
    def md5(self) -> str:
        return base64.b64encode(hashlib.md5(self.data).digest()).decode()

    @property
    def crc32c(self) -> str:
        return base64.b64encode(_crc32c(self.data).to_bytes(4, "big")).decode()


class _Failure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Storage:
    """Buckets of objects in memory, with Google's generation rules."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, _Object]] = {}
        self.lock = threading.Lock()
        self._generations = itertools.count(int(time.time() * 1e6))
        self.requests: list[tuple[str, str]] = []  # (method, path): what the client asked

    def bucket(self, name: str) -> dict[str, _Object]:
        if name not in self.buckets:
            raise _Failure(404, f"The specified bucket does not exist: {name}")
        return self.buckets[name]

    def get(self, bucket: str, name: str) -> _Object:
        found = self.bucket(bucket).get(name)
        if found is None:
            raise _Failure(404, f"No such object: {bucket}/{name}")
        return found

    @staticmethod
    def _check(current: _Object | None, if_generation_match: str | None) -> None:
        if if_generation_match is None:
            return
        if int(if_generation_match) != (current.generation if current else 0):
            raise _Failure(412, "At least one of the pre-conditions you specified did not hold.")

    def write(self, bucket: str, name: str, data: bytes, content_type: str, if_generation_match: str | None) -> _Object:
        objects = self.bucket(bucket)
        self._check(objects.get(name), if_generation_match)
        obj = _Object(name, data, next(self._generations), content_type,
                      time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()))
        objects[name] = obj
        return obj

    def compose(self, bucket: str, name: str, sources: list[dict[str, Any]], content_type: str,
                if_generation_match: str | None) -> _Object:
        if not 1 <= len(sources) <= 32:
            raise _Failure(400, "The number of source components provided must be between 1 and 32.")
        parts = []
        for source in sources:
            obj = self.get(bucket, source["name"])
            wanted = (source.get("objectPreconditions") or {}).get("ifGenerationMatch")
            if wanted is not None and int(wanted) != obj.generation:
                raise _Failure(412, f"Precondition failed for source {source['name']}")
            parts.append(obj.data)
        return self.write(bucket, name, b"".join(parts), content_type, if_generation_match)


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, Any], bytes, str]:
    """(metadata, media, media content type) of a multipart/related upload."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    parts = list(message.iter_parts())  # type: ignore[attr-defined]
    if len(parts) != 2:
        raise _Failure(400, "a multipart upload has two parts: metadata and media")
    metadata = json.loads(parts[0].get_payload(decode=True) or b"{}")
    return metadata, parts[1].get_payload(decode=True) or b"", parts[1].get_content_type()


class GcsEmulator(JsonServer):
    """The JSON API on host:port (0 = a free port); `url` is STORAGE_EMULATOR_HOST's value."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        storage = self.storage = Storage()
        server = self

        class Handler(JsonHandler):
            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                path = parts.path
                with storage.lock:
                    storage.requests.append((method, path))
                try:
                    with storage.lock:
                        answer = server.route(method, path, query, self)
                except _Failure as exc:
                    self.send_json(exc.status, {"error": {"code": exc.status, "message": str(exc),
                                                          "errors": [{"message": str(exc)}]}})
                    return
                if answer is not None:
                    self.send_json(200, answer)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

        super().__init__(Handler, host, port, "gcs-emulator")

    def create_bucket(self, name: str) -> None:
        with self.storage.lock:
            self.storage.buckets.setdefault(name, {})

    def __enter__(self) -> GcsEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API ---------------------------------------------------------------------------
    def route(self, method: str, path: str, query: dict[str, str], handler: JsonHandler) -> dict[str, Any] | None:
        storage = self.storage
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if segments[:3] == ["download", "storage", "v1"]:
            segments = segments[1:]
            query["alt"] = "media"
        if segments[:3] == ["upload", "storage", "v1"] and method == "POST" and segments[3:4] == ["b"] \
                and segments[5:] == ["o"]:
            return self._upload(segments[4], query, handler)
        if segments[:2] != ["storage", "v1"] or segments[2:3] != ["b"]:
            raise _Failure(501, f"not served by this emulator: {method} {path}")
        rest = segments[3:]
        if not rest and method == "POST":
            name = json.loads(handler.read_body() or b"{}").get("name", "")
            if name in storage.buckets:
                raise _Failure(409, f"bucket {name} already exists")
            storage.buckets[name] = {}
            return {"kind": "storage#bucket", "name": name, "id": name}
        if len(rest) == 1 and method == "GET":
            storage.bucket(rest[0])
            return {"kind": "storage#bucket", "name": rest[0], "id": rest[0]}
        if len(rest) == 2 and rest[1] == "o" and method == "GET":
            return self._list(rest[0], query)
        if len(rest) >= 3 and rest[1] == "o":
            bucket, name = rest[0], "/".join(rest[2:])
            if name.endswith("/compose") and method == "POST":
                body = json.loads(handler.read_body() or b"{}")
                target = name.removesuffix("/compose")
                obj = storage.compose(bucket, target, body.get("sourceObjects") or [],
                                      (body.get("destination") or {}).get("contentType") or "application/octet-stream",
                                      query.get("ifGenerationMatch"))
                return obj.resource(bucket, self.url)
            if method == "GET":
                obj = storage.get(bucket, name)
                if "generation" in query and int(query["generation"]) != obj.generation:
                    raise _Failure(404, f"No such object: {bucket}/{name}#{query['generation']}")
                if query.get("alt") == "media":
                    self._media(obj, handler)
                    return None
                return obj.resource(bucket, self.url)
            if method == "DELETE":
                storage.get(bucket, name)
                del storage.bucket(bucket)[name]
                handler.send_response(204)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return None
        raise _Failure(501, f"not served by this emulator: {method} {path}")

    def _upload(self, bucket: str, query: dict[str, str], handler: JsonHandler) -> dict[str, Any]:
        body = handler.read_body()
        kind = query.get("uploadType")
        content_type = handler.headers.get("Content-Type", "application/octet-stream")
        if kind == "multipart":
            metadata, data, media_type = _multipart(content_type, body)
            name = metadata.get("name") or query.get("name", "")
            content_type = metadata.get("contentType") or media_type
        elif kind == "media":
            name, data = query.get("name", ""), body
        else:
            raise _Failure(501, f"upload type {kind!r} is not served by this emulator (resumable uploads are not)")
        if not name:
            raise _Failure(400, "an upload names its object")
        obj = self.storage.write(bucket, name, data, content_type, query.get("ifGenerationMatch"))
        return obj.resource(bucket, self.url)

    def _list(self, bucket: str, query: dict[str, str]) -> dict[str, Any]:
        prefix = query.get("prefix", "")
        names = sorted(n for n in self.storage.bucket(bucket) if n.startswith(prefix))
        start = query.get("pageToken", "")
        names = [n for n in names if n > start] if start else names
        size = min(int(query.get("maxResults") or PAGE), PAGE)
        page = names[:size]
        answer: dict[str, Any] = {"kind": "storage#objects",
                                  "items": [self.storage.buckets[bucket][n].resource(bucket, self.url) for n in page]}
        if len(names) > size:
            answer["nextPageToken"] = page[-1]
        return answer

    @staticmethod
    def _media(obj: _Object, handler: JsonHandler) -> None:
        data, status = obj.data, 200
        wanted = _RANGE.match(handler.headers.get("Range", "").strip())
        if wanted:
            start = int(wanted.group(1))
            end = int(wanted.group(2)) if wanted.group(2) else len(data) - 1
            if start >= len(data) and len(data) > 0:
                handler.send_response(416)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            data, status = data[start:end + 1], 206
            content_range = f"bytes {start}-{start + len(data) - 1}/{len(obj.data)}"
        handler.send_response(status)
        handler.send_header("Content-Type", obj.content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("x-goog-generation", str(obj.generation))
        if status == 200:
            handler.send_header("x-goog-hash", f"crc32c={obj.crc32c},md5={obj.md5}")
        else:
            handler.send_header("Content-Range", content_range)
        handler.end_headers()
        handler.wfile.write(data)
