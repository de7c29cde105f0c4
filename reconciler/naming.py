"""Deterministic, Google-valid names and labels that tie a TPU to its ledger job.

Node ids must match `[a-z]([-a-z0-9]*[a-z0-9])?` and stay within 63 characters; label
keys and values use lowercase letters, digits, `-` and `_`, at most 63 characters.
"""

from __future__ import annotations

import functools
import hashlib
import re

from ledger.fold import JobState

LABEL_MANAGED = "managed-by"
MANAGED_VALUE = "tpu-ledger"
LABEL_JOB = "tpu-ledger-job"  # a slug of the job id (lossy: the job hash label is exact)
LABEL_JOB_HASH = "tpu-ledger-job-hash"
LABEL_OWNER = "tpu-ledger-owner"
LABEL_ATTEMPT = "tpu-ledger-attempt"

_UNSAFE = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")


def _slug(text: str, limit: int) -> str:
    slug = _UNSAFE.sub("-", text.lower()).strip("-")
    return _DASHES.sub("-", slug)[:limit].strip("-")


def job_hash(job_id: str, submission: str = "") -> str:
    """Short hash of the job and its submission, so a resubmitted job never reuses old names."""
    return hashlib.sha256(f"{job_id}\x00{submission}".encode()).hexdigest()[:8]


def submission(job: JobState) -> str:
    """What tells this submission of the job from its earlier ones: its commit, or (a job
    submitted without git) the seq of its submission."""
    return job.commit or str(job.submitted_seq)


def job_label(job: JobState) -> str:
    """The value of LABEL_JOB_HASH on the job's TPUs."""
    return job_hash(job.id, submission(job))


@functools.lru_cache(maxsize=16_384)
def node_name(job_id: str, submission: str, attempt: int) -> str:
    """The node id of a job's attempt (planned again at every pass while the job waits: kept)."""
    digest = job_hash(job_id, submission)
    suffix = f"-{digest}-a{attempt}"
    stem = _slug(job_id.replace("/", "-"), 63 - len(suffix) - 3) or "job"
    return f"tl-{stem}{suffix}"


def labels(job_id: str, submission: str, owner: str, attempt: int) -> dict[str, str]:
    return {
        LABEL_MANAGED: MANAGED_VALUE,
        LABEL_JOB: _slug(job_id.replace("/", "--"), 63) or "job",
        LABEL_JOB_HASH: job_hash(job_id, submission),
        LABEL_OWNER: _slug(owner, 63) or "unknown",
        LABEL_ATTEMPT: str(attempt),
    }


def is_managed(node_labels: dict[str, str]) -> bool:
    return node_labels.get(LABEL_MANAGED) == MANAGED_VALUE
