"""Job ids from paths: `jobs/<owner>/<name>.yaml` -> `<owner>/<name>`.

Owners and names are restricted to lowercase ASCII letters, digits and dashes (names may
also use `_`), so a job id is safe everywhere it travels: TPU resource names, shell
commands, log paths, URLs, event streams. Words that broke the `tpu` tool (`run`,
`false`, `v2-32-2`) are simply strings here; non-ASCII is refused with a clear message.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from ledger.spec.layout import JOB_SUFFIXES, JOBS_DIR

OWNER_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]*[a-z0-9])?$")
OWNER_MAX = 39
NAME_MAX = 63
TPU_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TPU_NAME_MAX = 63
_DASHES = re.compile(r"-{2,}")


def _suggest(text: str, allow_underscore: bool) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    keep = "a-z0-9_-" if allow_underscore else "a-z0-9-"
    folded = re.sub(f"[^{keep}]+", "-", folded).strip("-_")
    return _DASHES.sub("-", folded)


# Characters a shell gives a meaning to: a name holding one is refused for what it is.
SHELL_META = frozenset("$`\\\"'|&;<>()*?[]{}~!#=")


def shown(text: str) -> str:
    """`text` safe to print and to store as JSON: control characters escaped by repr, bytes
    that were not UTF-8 (surrogate escapes from git paths) as \\xNN."""
    return "".join(
        f"\\x{ord(ch) - 0xDC00:02x}" if 0xDC80 <= ord(ch) <= 0xDCFF else ch if ch.isprintable() else repr(ch)[1:-1]
        for ch in text
    )


def _problem_chars(kind: str, text: str) -> str | None:
    """What a name's characters are, when they are the sort that breaks things."""
    if any(0xDC80 <= ord(ch) <= 0xDCFF for ch in text):
        return f"the {kind} '{shown(text)}' is not valid UTF-8"
    controls = sorted({ch for ch in text if not ch.isprintable() and ch != " "})
    if controls:
        return f"the {kind} '{shown(text)}' has control characters ({', '.join(shown(c) for c in controls)})"
    meta = sorted({ch for ch in text if ch in SHELL_META})
    if meta:
        return f"the {kind} {text!r} has shell metacharacters ({', '.join('space' if c == ' ' else c for c in meta)})"
    return None


def check_part(kind: str, text: str) -> str | None:
    """None when `text` is a valid owner/name, else what is wrong with it."""
    is_owner = kind == "owner"
    pattern, limit = (OWNER_RE, OWNER_MAX) if is_owner else (NAME_RE, NAME_MAX)
    if not text:
        return f"the {kind} is empty"
    bad = _problem_chars(kind, text)
    if bad is not None:
        return bad
    if not text.isascii():
        return f"the {kind} {text!r} has non-ASCII characters"
    if len(text) > limit:
        return f"the {kind} {text!r} is longer than {limit} characters"
    if not pattern.match(text):
        if text != text.lower():
            return f"the {kind} {text!r} has uppercase letters"
        allowed = "lowercase letters, digits and single dashes, starting with a letter" if is_owner else (
            "lowercase letters, digits, dashes and underscores, starting and ending with a letter or digit"
        )
        return f"the {kind} {text!r} may use only {allowed}"
    return None


def _job_parts(path: str) -> list[str] | None:
    """[jobs, owner, file] of a path one folder below jobs/, else None."""
    parts = path.split("/")
    return parts if len(parts) == 3 and parts[0] == JOBS_DIR else None


def safe_stream(job_id: str | None) -> bool:
    """True when an (unchecked) job id can name an event stream and travel in JSON: the
    watcher files a rejection under it. Control characters and undecodable bytes cannot."""
    return bool(job_id) and len(job_id) <= 200 and job_id.isprintable() and not any(
        0xD800 <= ord(ch) <= 0xDFFF for ch in job_id)


def job_id_for(path: str) -> str | None:
    """`<owner>/<name>` of any jobs/<owner>/<name>.yaml (or .yml), the parts NOT checked.

    The watcher files what happens to such a path under this id even when the name is
    invalid (the rejection then says why); `job_id_from_path` is the check itself.
    """
    parts = _job_parts(path)
    if parts is None or not parts[1]:
        return None
    for suffix in JOB_SUFFIXES:
        if parts[2].endswith(suffix) and len(parts[2]) > len(suffix):
            return f"{parts[1]}/{parts[2][: -len(suffix)]}"
    return None


def job_id_from_path(path: str) -> tuple[str | None, str | None, str]:
    """(job_id, problem, hint) for a repo-relative path; job_id None when the path is unusable."""
    parts = _job_parts(path)
    if parts is None:
        return None, f"{path!r} is not at jobs/<owner>/<name>.yaml", (
            "move the file to jobs/<your-user>/<job-name>.yaml; the job id is <owner>/<name>"
        )
    _, owner, filename = parts
    if filename.endswith(".yml"):
        stem = filename[:-4]
        return None, "job files end in .yaml, not .yml", f"rename it to {stem}.yaml"
    if not filename.endswith(".yaml"):
        return None, f"{filename!r} is not a .yaml file", "job files are jobs/<owner>/<name>.yaml"
    name = filename[: -len(".yaml")]
    for kind, text in (("owner", owner), ("name", name)):
        problem = check_part(kind, text)
        if problem is not None:
            better = _suggest(text, kind == "name")
            hint = f"rename it, e.g. to {better!r}" if better and better != text else "rename it"
            where = "the folder under jobs/" if kind == "owner" else "the file name"
            return None, problem, f"{hint} ({where})"
    return f"{owner}/{name}", None, ""


def default_tpu_name(job_id: str) -> str:
    """A TPU name of the job's own, unique per job id and valid on Google Cloud."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:6]
    base = job_id.replace("/", "-").replace("_", "-")
    base = _DASHES.sub("-", base)[: TPU_NAME_MAX - 7].rstrip("-")
    return f"{base}-{digest}"
