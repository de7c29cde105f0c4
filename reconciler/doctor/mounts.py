"""The mounts the spec asks for (gcsfuse), and free disk in the working directory and /tmp."""

from __future__ import annotations

from reconciler.doctor import probe
from reconciler.doctor.model import Check, Context, Facts, Finding, Fix, Paths
from reconciler.remote import layout


def _wanted(ctx: Context) -> list[tuple[str, str]]:
    """(bucket, mount path as written) of the spec's gcsfuse section, when setup mounts it."""
    g = ctx.spec.get("gcsfuse") if isinstance(ctx.spec, dict) else None
    modules = ((ctx.spec.get("setup") or {}).get("modules") or []) if isinstance(ctx.spec, dict) else []
    if not isinstance(g, dict) or not g.get("mount_path") or (modules and "gcsfuse" not in modules):
        return []
    return [(str(g.get("bucket_name", "")), str(g["mount_path"]))]


def _mounts_probe(paths: Paths, ctx: Context) -> str:
    wanted = _wanted(ctx)
    if not wanted:
        return ""
    lines = [f"printf 'want\\t%s\\t%s\\n' {probe.q(path)} \"$(readlink -m {layout.user_path(path)})\"" for _, path in wanted]
    lines.append("while read -r src mp typ _; do case $typ in fuse*) printf 'mount\\t%s\\t%s\\t%s\\n' \"$src\" \"$mp\" \"$typ\";; esac; "
                 f"done < {probe.rooted(paths.mounts)}")
    return "\n".join(lines)


def _mounts(facts: Facts, ctx: Context, paths: Paths) -> list[Finding]:
    w = facts.worker
    buckets = dict((path, bucket) for bucket, path in _wanted(ctx))
    if not buckets:
        return [Finding("mounts", w, "ok", "no mount asked for")]
    points = {mp for _, mp, _ in facts.mounts}
    out = []
    for written, real in facts.wanted:
        if real in points:
            out.append(Finding("mounts", w, "ok", f"{written} mounted"))
        else:
            bucket = buckets.get(written, "")
            out.append(Finding("mounts", w, "fix", f"{written} is not mounted (gcsfuse {bucket})",
                               Fix("remount", f"remounted gs://{bucket} on {written}", path=written, bucket=bucket)))
    return out


def _disk_probe(paths: Paths, ctx: Context) -> str:
    # a brace group fed by a process substitution: one fork (df's), where a pipe forks twice
    return ("{ read -r _; while read -r _ _ _ avail _ mp; do printf 'df\\t%s\\t%s\\n' \"$avail\" \"$mp\"; done; } "
            f"< <(exec df -Pk -- {layout.user_path(paths.workdir)} {probe.rooted(paths.tmp)})")


def _disk(facts: Facts, ctx: Context, paths: Paths) -> list[Finding]:
    w = facts.worker
    if not facts.disk:
        return [Finding("disk", w, "warn", "df answered nothing")]
    low = [(mp, free) for mp, free in facts.disk if free < paths.min_free]
    if low:
        return [Finding("disk", w, "fail", "; ".join(f"only {_size(free)} free on {mp} (a start needs {_size(paths.min_free)})" for mp, free in low))]
    return [Finding("disk", w, "ok", ", ".join(f"{_size(free)} free on {mp}" for mp, free in facts.disk))]


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


MOUNTS = Check("mounts", _mounts_probe, _mounts)
DISK = Check("disk", _disk_probe, _disk)
