"""python, jax and libtpu versions, which must agree across workers (a warning when not).

No Python runs for this: `python3 --version` exits before it imports anything, and the
packages are read from the names of their .dist-info directories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from reconciler.doctor import probe
from reconciler.doctor.model import Check, Context, Facts, Finding, Paths

PACKAGES = ("jax", "jaxlib", "libtpu")


def _sites(paths: Paths, ctx: Context) -> list[str]:
    sites = list(paths.sites)
    venv = ctx.spec.get("venv") if isinstance(ctx.spec, dict) else None
    if isinstance(venv, dict) and venv.get("name"):
        # the venv module's directory (reconciler.remote.scripts.venv_rel), its name escaped
        name = "".join(c if c.isalnum() or c in "_.-" else "_" for c in str(venv["name"]))
        sites.insert(0, f"~/.tpu-ledger/venvs/{name}/lib/python3*/site-packages")
    return sites


def _probe(paths: Paths, ctx: Context) -> str:
    globs = " ".join(f"{probe.glob(s)}/{p}[-_]*.dist-info" for s in _sites(paths, ctx) for p in PACKAGES)
    return "\n".join([
        "command -v python3 >/dev/null && { printf 'py\\t'; python3 --version 2>&1; }",
        f"for f in {globs}; do [ -e \"$f\" ] && printf 'pkg\\t%s\\n' \"${{f##*/}}\"; done",
    ])


def _one(facts: Facts, ctx: Context, paths: Paths) -> list[Finding]:
    have = [f"python {facts.python or '?'}"] + [f"{n} {v}" for n, v in sorted(facts.packages.items())]
    return [Finding("versions", facts.worker, "ok", ", ".join(have))]


def _across(all_facts: Mapping[int, Facts]) -> list[Finding]:
    out = []
    names = ["python", *sorted({n for f in all_facts.values() for n in f.packages})]
    for name in names:
        seen = {w: (f.python if name == "python" else f.packages.get(name, "missing")) for w, f in all_facts.items() if f.error is None}
        common = Counter(seen.values()).most_common(1)
        if len(set(seen.values())) > 1 and common:
            usual = common[0][0]
            for w, v in sorted(seen.items()):
                if v != usual:
                    out.append(Finding("versions", w, "warn", f"{name} {v} here, {usual} on the other workers"))
    return out


VERSIONS = Check("versions", _probe, _one, _across)
