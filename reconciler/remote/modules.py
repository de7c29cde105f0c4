"""Setup modules as data: for each module, the `check` steps (all pass -> skip) and the
`setup` steps (run in order, stop at the first failure) for one host. Pure functions.

Like JOBMAN's MultiWorkerRunner modules, but idempotent by construction: modules whose
inputs are files record a stamp named by the digest of those inputs, so a changed key,
requirements file or environment file sets the host up again, and an unchanged one is skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from reconciler.remote import layout
from reconciler.remote.scripts import bash, q, venv_rel

MODULES = ("ssh", "gcsfuse", "docker", "conda", "venv", "command")
SETUP_REL = f"{layout.ROOT}/setup"
SSH_BEGIN = "# >>> tpu-ledger managed block >>>"
SSH_END = "# <<< tpu-ledger managed block <<<"

GCSFUSE_INSTALL = (
    "command -v gcsfuse >/dev/null 2>&1 || { "
    'repo="gcsfuse-$(lsb_release -c -s)" && '
    'echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt $repo main" '
    "| sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null && "
    "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null && "
    "sudo apt-get update -qq && sudo apt-get install -y -qq gcsfuse; }"
)


@dataclass(frozen=True)
class Exec:
    label: str
    script: str  # bash script text; in a batch it runs in a subshell, alone as `bash -c`

    @property
    def command(self) -> str:
        return bash(self.script)


@dataclass(frozen=True)
class Put:
    """Upload bytes to $HOME/<rel> atomically with `mode`; the log names the path, never the bytes."""

    label: str
    data: bytes
    rel: str
    mode: int = 0o600


Step = Exec | Put


@dataclass(frozen=True)
class Module:
    name: str
    check: list[Step]
    setup: list[Step]


Reader = Callable[[str], bytes]


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "big") + b)
    return h.hexdigest()[:16]


def _stamp(module: str, dig: str) -> str:
    return f"{SETUP_REL}/{module}.{dig}.done"


def _touch(rel: str) -> Exec:
    return Exec("record stamp", f"mkdir -p {layout.home(SETUP_REL)} && touch {layout.home(rel)}")


def build(name: str, spec: Mapping, read: Reader) -> Module:
    if name not in MODULES or name == "command":
        raise ValueError(f"unknown setup module {name!r}: use one of {', '.join(MODULES[:-1])}")
    return {"ssh": ssh_module, "gcsfuse": gcsfuse_module, "docker": docker_module,
            "conda": conda_module, "venv": venv_module}[name](spec, read)


def ssh_module(spec: Mapping, read: Reader) -> Module:
    """Keys and config entries so the pod's hosts reach each other and git hosts."""
    idents = (spec.get("ssh") or {}).get("identities") or []
    puts: list[Step] = []
    pubs: list[bytes] = []
    entries: list[str] = []
    material: list[bytes | str] = []
    for ident in idents:
        if ident.get("private_key"):
            data = read(ident["private_key"])
            rel = ".ssh/" + layout.escape_segment(os.path.basename(ident["private_key"]))
            puts.append(Put(f"private key -> ~/{rel}", data, rel, 0o600))
            material += [rel, data]
        if ident.get("public_key"):
            data = read(ident["public_key"])
            rel = ".ssh/" + layout.escape_segment(os.path.basename(ident["public_key"]))
            puts.append(Put(f"public key -> ~/{rel}", data, rel, 0o644))
            pubs.append(data.strip())
            material += [rel, data]
        if ident.get("config_entry"):
            entries.append(str(ident["config_entry"]).rstrip("\n"))
    block = "\n".join([SSH_BEGIN, *entries, SSH_END]) + "\n"
    stamp = _stamp("ssh", digest(*material, block))
    steps: list[Step] = [Exec("ssh dir", 'mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"'), *puts]
    if pubs:
        adds = " && ".join(
            f'{{ grep -qxF {q(p.decode())} "$HOME/.ssh/authorized_keys" 2>/dev/null || '
            f'printf "%s\\n" {q(p.decode())} >> "$HOME/.ssh/authorized_keys"; }}'
            for p in pubs
        )
        steps.append(Exec("authorize public keys", f"touch \"$HOME/.ssh/authorized_keys\" && chmod 600 \"$HOME/.ssh/authorized_keys\" && {adds}"))
    block_rel = f"{SETUP_REL}/ssh_config_block"
    steps.append(Put("ssh config entries", block.encode(), block_rel, 0o600))
    steps.append(Exec(
        "install ssh config block",
        'c="$HOME/.ssh/config"; touch "$c"; '
        f'awk -v b={q(SSH_BEGIN)} -v e={q(SSH_END)} \'$0==b{{s=1}} !s{{print}} $0==e{{s=0}}\' "$c" > "$c.tmp" && '
        f'cat {layout.home(block_rel)} >> "$c.tmp" && chmod 600 "$c.tmp" && mv -f "$c.tmp" "$c"',
    ))
    steps.append(_touch(stamp))
    return Module("ssh", [Exec("stamp present", f"test -f {layout.home(stamp)}")], steps)


def gcsfuse_module(spec: Mapping, read: Reader) -> Module:
    g = spec.get("gcsfuse") or {}
    path = layout.user_path(str(g["mount_path"]))
    return Module(
        "gcsfuse",
        [Exec("mounted", f"mountpoint -q {path}")],
        [
            Exec("install gcsfuse", GCSFUSE_INSTALL),
            Exec("mount point", f"mkdir -p {path}"),
            Exec("mount bucket", f"gcsfuse --implicit-dirs {q(str(g['bucket_name']))} {path}"),
        ],
    )


def docker_module(spec: Mapping, read: Reader) -> Module:
    image = q(str((spec.get("docker") or {})["image"]))
    return Module(
        "docker",
        [Exec("image present", f"docker image inspect {image} >/dev/null")],
        [Exec("pull image", f"docker pull {image}")],
    )


def conda_module(spec: Mapping, read: Reader) -> Module:
    c = spec.get("conda") or {}
    name = str(c["name"])
    data = read(c["config_file"])
    rel = f"{SETUP_REL}/conda-{layout.escape_segment(name)}.yml"
    stamp = _stamp("conda", digest(name, data))
    return Module(
        "conda",
        [Exec("env up to date", f"test -f {layout.home(stamp)} && conda run -n {q(name)} true")],
        [
            Put("environment file", data, rel, 0o644),
            Exec("create or update env", f"conda env update --name {q(name)} --file {layout.home(rel)} --prune"),
            _touch(stamp),
        ],
    )


_VERSION = re.compile(r"\d+(\.\d+)*")


def venv_module(spec: Mapping, read: Reader) -> Module:
    v = spec.get("venv") or {}
    python = str(v.get("python") or "python3")
    if _VERSION.fullmatch(python):
        python = f"python{python}"
    req = read(v["requirements_file"]) if v.get("requirements_file") else b""
    venv = layout.home(venv_rel(spec))
    stamp = _stamp("venv", digest(str(v["name"]), python, req))
    setup: list[Step] = [Exec("create venv", f"{q(python)} -m venv {venv}")]
    if req.strip():
        rel = f"{SETUP_REL}/requirements-{layout.escape_segment(str(v['name']))}.txt"
        setup.insert(0, Put("requirements file", req, rel, 0o644))
        setup.append(Exec("install requirements", f"{venv}/bin/python -m pip install -q -r {layout.home(rel)}"))
    setup.append(_touch(stamp))
    return Module(
        "venv",
        [Exec("venv up to date", f"test -x {venv}/bin/python && test -f {layout.home(stamp)}")],
        setup,
    )


def put_script(step: Put) -> str:
    """Write stdin to $HOME/<rel> atomically."""
    target = layout.home(step.rel)
    parent = layout.home(os.path.dirname(step.rel) or ".")
    return (
        f"umask 077 && mkdir -p {parent} && cat > {target}.tmp && "
        f"chmod {step.mode:o} {target}.tmp && mv -f {target}.tmp {target}"
    )


def put_command(step: Put) -> str:
    return bash(put_script(step))


# -- batching: a module's steps in one SSH round trip ---------------------------------------
INLINE_MAX = 48 * 1024  # a bash -c argument must stay well under Linux's 128 KiB per argument
MARK = "@@ledger-step"


def batches(steps: list[Step]) -> list[list[Step]]:
    """Consecutive steps grouped for one exec each; a large upload travels alone, by stdin."""
    out: list[list[Step]] = []
    cur: list[Step] = []
    for s in steps:
        if isinstance(s, Put) and len(s.data) > INLINE_MAX:
            if cur:
                out.append(cur)
                cur = []
            out.append([s])
        else:
            cur.append(s)
    if cur:
        out.append(cur)
    return out


def batch_script(steps: list[Step], nonce: str, tag: str = "s", *, guard: str | None = None) -> str:
    """Run `steps` in order, each followed by a marker with its exit code; stop at the first
    failure. The nonce keeps a step's own output from forging a marker. With `guard`, the
    steps run only while that shell condition holds, and a failure clears it (for checks)."""
    import base64

    lines = []
    for i, s in enumerate(steps):
        if isinstance(s, Put):
            cmd = f"printf %s {q(base64.b64encode(s.data).decode())} | base64 -d | ( {put_script(s)} )"
        else:
            cmd = s.script
        body = [
            f"( {cmd}\n) </dev/null 2>&1",
            "rc=$?",
            f'printf "\\n{MARK}-{nonce} {tag}{i} %s\\n" "$rc"',
        ]
        if guard is None:
            lines += [*body, '[ "$rc" -eq 0 ] || exit 0']
        else:
            lines += [f"if {guard}; then", *body, '[ "$rc" -eq 0 ] || ok=0', "fi"]
    return "\n".join(lines)


def module_script(mod: Module, nonce: str) -> str:
    """Check and, unless every check passes, set up: one SSH round trip for the module."""
    return "\n".join([
        "ok=1",
        batch_script(mod.check, nonce, "c", guard='[ "$ok" = 1 ]'),
        'if [ "$ok" = 1 ]; then exit 0; fi',
        batch_script(mod.setup, nonce, "s"),
    ])


def fits_one_trip(mod: Module) -> bool:
    return not any(isinstance(s, Put) and len(s.data) > INLINE_MAX for s in [*mod.check, *mod.setup])


def parse_batch(stdout: bytes, nonce: str, tag: str = "s") -> list[tuple[bytes, int]]:
    """(output, exit code) of each step with this tag that ran, in order."""
    marker = re.compile(rb"\n" + re.escape(f"{MARK}-{nonce} ".encode()) + rb"([a-z])(\d+) (\d+)\n")
    results, pos = [], 0
    for m in marker.finditer(stdout):
        if m.group(1).decode() == tag:
            results.append((stdout[pos:m.start()], int(m.group(3))))
        pos = m.end()
    return results
