"""Job output collected in Cloud Storage, through the official client (google-cloud-storage).

Objects are named `<prefix>/<key>`. Cloud Storage objects cannot grow in place, so an append
uploads the new bytes as a part object and composes the stored object with it into the same
name, on the condition that the stored object is still the generation that was measured
(`ifGenerationMatch`): two collectors racing on one attempt cannot both extend it. The first
write of a key is conditional on there being no object yet (`ifGenerationMatch=0`). Parts
live under `<prefix>/.parts/` and are deleted after the compose.

Credentials are Application Default Credentials; with STORAGE_EMULATOR_HOST set the client
talks to that emulator without credentials (the project's `emulator.gcs` in tests). Needs
`roles/storage.objectAdmin` on the bucket (create, compose, delete parts, read, list).
"""

from __future__ import annotations

import secrets
from typing import Any

from reconciler.joblogs.archive import check_key

PARTS = ".parts"


class GcsArchive:
    def __init__(self, bucket: str, prefix: str = "", *, project: str | None = None, client: Any = None) -> None:
        # start-up time: only a reconciler that collects to Cloud Storage loads the client
        from google.cloud import storage

        self._client = client or storage.Client(project=project)
        self._bucket = self._client.bucket(bucket)
        self._prefix = prefix.strip("/")
        self.where = f"gs://{bucket}/{self._prefix}".rstrip("/")

    def _name(self, key: str) -> str:
        return f"{self._prefix}/{check_key(key)}" if self._prefix else check_key(key)

    def sizes(self, prefix: str) -> dict[str, int]:
        base = f"{self._prefix}/" if self._prefix else ""
        strip = len(base)
        return {blob.name[strip:]: int(blob.size or 0)
                for blob in self._client.list_blobs(self._bucket, prefix=base + prefix.lstrip("/"))
                if not blob.name[strip:].startswith(f"{PARTS}/")}

    def append(self, key: str, offset: int, data: bytes) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        name = self._name(key)
        stored = self._bucket.get_blob(name)
        if (stored.size if stored is not None else 0) != offset:
            return False
        try:
            if stored is None:
                self._bucket.blob(name).upload_from_string(data, if_generation_match=0)
                return True
            part = self._bucket.blob(self._name(f"{PARTS}/{secrets.token_hex(12)}"))
            part.upload_from_string(data, if_generation_match=0)
            try:
                self._bucket.blob(name).compose([stored, part], if_generation_match=stored.generation)
            finally:
                part.delete()
        except (PreconditionFailed, NotFound):  # another collector extended it first
            return False
        return True

    def put(self, key: str, data: bytes) -> None:
        self._bucket.blob(self._name(key)).upload_from_string(data)

    def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes:
        from google.api_core.exceptions import NotFound, RequestRangeNotSatisfiable

        if limit == 0:
            return b""
        end = None if limit is None else offset + limit - 1
        try:
            return self._bucket.blob(self._name(key)).download_as_bytes(start=offset or None, end=end)
        except (NotFound, RequestRangeNotSatisfiable):
            return b""
