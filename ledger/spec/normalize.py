"""From a parsed job file to the normalized spec the reconciler runs, with every finding.

`validate_text` is pure (no I/O): the watcher calls it with blob contents from git.
The checks a schema cannot express live here: the TPU request against the accelerator
table, shared TPUs through aliases, workers within the host count, one environment at
most, setup modules that match the configured sections, recovery rules, config-override
aliases, priorities and the repository's policy limits.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import msgspec

from ledger import defaults, tpu_types
from ledger.spec import placement_check
from ledger.spec import recovery as rec
from ledger.spec.args import expand as expand_args
from ledger.spec.args import flags as args_flags
from ledger.spec.config import RepoConfig
from ledger.spec.interpolate import InterpolationError, interpolate
from ledger.spec.model import Message, SpecResult
from ledger.spec.names import TPU_NAME_MAX, TPU_NAME_RE, default_tpu_name, job_id_from_path
from ledger.spec.policy import Policy
from ledger.spec.schema import close_match, fill_defaults, problems
from ledger.spec.secrets import file_fields, reference_problem
from ledger.spec.yamlsafe import Loaded, LoadError, escape, load

# `check(owner, reference) -> (severity, message) | None`: a look at the secrets folder on
# this host (ledger.spec.secrets.SecretsDir.problem), when there is one to look at.
SecretsCheck = Callable[[str, str], "tuple[str, str] | None"]

SECTIONS = ("job", "tpu", "gcsfuse", "ssh", "docker", "conda", "venv", "setup", "command", "recovery", "args", "priority")
ENVS = ("docker", "conda", "venv")
PRIORITIES = {"very-low": 100, "low": 250, "medium": 500, "high": 750, "very-high": 1000}
DEFAULT_PRIORITY = 500
REQUEST_FIELDS = ("allocation_mode", "accelerator", "zone", "version", "pricing", "reservation", "startup_script", "network",
                  "slices", "fallbacks", "failover")
RESERVED_METADATA = ("ssh-keys", "startup-script", "enable-oslogin")
# A repeated group that itself ends in a repetition, e.g. (a+)+ or (\w*)*: the shape of
# patterns that backtrack exponentially. The reconciler runs these over job output.
NESTED_REPEAT = re.compile(r"\((?:[^()\\]|\\.)*[+*}]\)(?:[+*]|\{\d*,)")
# The normalised spec travels in every `submitted` event and in each reconciler's memory: a
# spec is a few kilobytes, and this bounds what one file can make of itself (references,
# policy defaults) whatever the input's own size limit lets through.
MAX_SPEC_BYTES = 512 * 1024
KEY_MATERIAL = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----|PRIVATE KEY-----")


class _Report:
    def __init__(self, path: str, loaded: Loaded | None) -> None:
        self.path = path
        self.loaded = loaded
        self.errors: list[Message] = []
        self.warnings: list[Message] = []
        self.from_defaults: set[str] = set()

    def _msg(self, pointer: str, message: str, hint: str, severity: str, at_key: bool) -> Message:
        line, column = self.loaded.position(pointer, key=at_key) if self.loaded else (0, 0)
        if self.loaded is not None and pointer and pointer not in self.loaded.marks:
            top = "/".join(pointer.split("/")[:3])
            if top in self.from_defaults or pointer in self.from_defaults:
                message += " (value from .ledger/policy.yaml defaults)"
        return Message(self.path, line, column, pointer, message, hint, severity)

    def error(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None:
        self.errors.append(self._msg(pointer, message, hint, "error", at_key))

    def warn(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None:
        self.warnings.append(self._msg(pointer, message, hint, "warning", at_key))


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base[k], v) if k in base else v
        return out
    return over


def _with_policy_defaults(data: dict, defaults: dict, report: _Report) -> dict:
    """Policy defaults under the spec (the spec wins); shorthand forms expanded first."""
    out = dict(data)
    if isinstance(out.get("tpu"), str):
        out["tpu"] = {"alias": out["tpu"]}
    if isinstance(out.get("recovery"), str):
        out["recovery"] = {"rule": out["recovery"]}
    for section, value in (defaults or {}).items():
        if section == "tpu" and isinstance(out.get("tpu"), dict) and ("alias" in out["tpu"] or out["tpu"].get("shared")):
            continue  # a shared TPU's settings come from aliases.yaml only
        if section == "recovery" and isinstance(out.get("recovery"), dict) and "rule" in out["recovery"]:
            value = {k: v for k, v in value.items() if k not in rec.KINDS and k != "rule"}
        if section not in out:
            out[section] = copy.deepcopy(value)
            report.from_defaults.add(f"/{section}")
        elif isinstance(out[section], dict) and isinstance(value, dict):
            for k in value:
                if k not in out[section]:
                    report.from_defaults.add(f"/{section}/{escape(k)}")
            out[section] = _deep_merge(copy.deepcopy(value), out[section])
    return out


def validate_text(text: bytes | str, path: str, config: RepoConfig, *, secrets: SecretsCheck | None = None) -> SpecResult:
    """Validate one job file's contents; never raises on bad input. With `secrets`, the files
    the spec names are also looked up in its owner's secrets folder."""
    job_id, problem, hint = job_id_from_path(path)
    try:
        loaded = load(text)
    except LoadError as exc:
        report = _Report(path, None)
        report.errors.append(Message(path, exc.line, exc.column, "", exc.message, exc.hint, "error"))
        if problem:
            report.errors.insert(0, Message(path, 0, 0, "", problem, hint, "error"))
        return SpecResult(path, job_id, None, report.errors, [])
    report = _Report(path, loaded)
    if problem:
        report.error("", problem, hint)
    data = loaded.data
    if not isinstance(data, dict):
        report.error("", f"a job file must be a mapping of sections (job, tpu, command, ...), not {type(data).__name__ if not isinstance(data, list) else 'a list'}",
                     "start from an example in jobs/examples/")
        return SpecResult(path, job_id, None, report.errors, [])
    try:
        refs = (b"${" in text) if isinstance(text, bytes) else ("${" in text)
        spec = _check(data, job_id, path, config, report, refs, secrets)
    except Exception as exc:  # a bug here must not take the watcher down: report it as a finding
        report.error("", f"internal error while validating: {type(exc).__name__}: {exc}", "please report this to the ledger maintainers")
        spec = None
    ok = not report.errors
    return SpecResult(path, job_id if job_id else None, spec if ok else None, report.errors, report.warnings)


def _check(data: dict, job_id: str | None, path: str, config: RepoConfig, report: _Report, refs: bool = True,
           secrets: SecretsCheck | None = None) -> dict | None:
    policy = config.policy
    merged = _with_policy_defaults(data, policy.defaults.spec, report)
    found = list(problems("job", merged))
    for p in found:
        report.error(p.pointer, p.message, p.hint, at_key=p.at_key)
    if found:
        return None
    raw = fill_defaults("job", merged)
    stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]

    tpu = _tpu(raw["tpu"], job_id, config, report, policy, raw)
    hosts = placement_check.smallest_hosts(tpu) if tpu else None
    envs = _envs(raw, report)
    command = _command(raw, hosts, report)
    setup = _setup(raw, envs, report)
    ssh = _ssh(raw.get("ssh"), report)
    recovery = _recovery(raw, tpu, report, policy)
    args = expand_args(raw.get("args") or {}, config, report)
    priority = _priority(raw, report, policy)

    job_in = raw.get("job") or {}
    env_type = job_in.get("env_type")
    present = envs[0] if envs else "none"
    if env_type is not None and env_type != present:
        if env_type == "none":
            report.error("/job/env_type", f"env_type is none but a `{present}:` section is configured", f"set env_type: {present}, or remove the `{present}:` section")
        else:
            report.error("/job/env_type", f"env_type is {env_type} but there is no `{env_type}:` section", f"add a `{env_type}:` section, or set env_type: {present}")
    docker = raw.get("docker")
    if docker is not None:
        docker = dict(docker)
        ev = docker.get("env_vars")
        if isinstance(ev, dict):
            docker["env_vars"] = [f"{k}={_text(v)}" for k, v in ev.items()]
        docker.setdefault("env_vars", [])
    spec = {
        "job": {
            "name": job_in.get("name") or stem,
            "env_type": env_type or present,
            "loop": bool(job_in.get("loop", False)),
            "tags": list(job_in.get("tags", [])),
            "priority": priority,
            "notes": job_in.get("notes"),
        },
        "tpu": tpu,
        "gcsfuse": raw.get("gcsfuse"),
        "ssh": ssh,
        "docker": docker,
        "conda": raw.get("conda"),
        "venv": raw.get("venv"),
        "setup": setup,
        "command": command,
        "recovery": recovery,
        "args": args,
        "priority": priority,
    }
    checkpoints = _checkpoints(job_in.get("checkpoints"), report)
    if checkpoints is not None:  # only when written: older specs keep their hash
        spec["job"]["checkpoints"] = checkpoints
    # The flags the runner appends to the command, in the order written (the reconciler
    # reads `command.args_flags`, so it needs no alias table of its own).
    command["args_flags"] = command_args(spec, config)
    if report.errors:
        return None
    try:
        if (refs or "${" in str(dict(policy.defaults.spec))) and _has_reference(spec):
            spec = interpolate(spec, _SECTION_SET)
    except InterpolationError as exc:
        report.error(_input_pointer(exc.pointer), exc.message, exc.hint)
        return None
    if _too_big(spec, report):
        return None
    if not _files_stay_home(spec, job_id, report, secrets):
        return None
    if not spec["tpu"]["shared"]:
        name = spec["tpu"]["name"]
        if not isinstance(name, str) or len(name) > TPU_NAME_MAX or not TPU_NAME_RE.match(name):
            report.error("/tpu/name", f"TPU name {name!r} is not valid on Google Cloud",
                         "use lowercase letters, digits and dashes, starting with a letter, at most 63 characters")
            return None
    return spec


_SECTION_SET = frozenset(SECTIONS)


def _files_stay_home(spec: dict, job_id: str | None, report: _Report, secrets: SecretsCheck | None) -> bool:
    """Every file the spec names is in its owner's secrets folder (after references are
    resolved, so a reference cannot smuggle a path in); False after reporting one that is not."""
    fields = list(file_fields(spec))
    if not fields:
        return True
    key = str(defaults.ssh_key())
    owner = (job_id or "").partition("/")[0]
    ok = True
    for pointer, ref in fields:
        problem = reference_problem(ref, key)
        if problem is not None:
            report.error(pointer, problem[0], problem[1])
            ok = False
        elif secrets is not None and owner:
            found = secrets(owner, ref)
            if found is not None and found[0] == "error":
                report.error(pointer, found[1], "only files inside your own secrets folder are copied to your hosts")
                ok = False
            elif found is not None:
                report.warn(pointer, found[1], "ask an admin to put the file there before the job runs")
    return ok


_encode = msgspec.json.Encoder(enc_hook=str).encode  # ~10x json.dumps: this runs for every spec


def _too_big(spec: dict, report: _Report) -> bool:
    """Refuse a normalised spec over MAX_SPEC_BYTES, naming its biggest section."""
    size = len(_encode(spec))
    if size <= MAX_SPEC_BYTES:
        return False
    sizes = {k: len(_encode(v)) for k, v in spec.items()}
    biggest = max(sizes, key=lambda k: sizes[k])
    report.error(f"/{biggest}", f"the normalised spec is {size:,} bytes, over the limit of {MAX_SPEC_BYTES:,} "
                 f"(`{biggest}` alone is {sizes[biggest]:,})",
                 "a job spec is a few kilobytes: keep long text in your code repository and call it from `command.cmd`")
    return True


def _has_reference(node: Any) -> bool:
    if isinstance(node, str):
        return "${" in node
    if isinstance(node, dict):
        return any(_has_reference(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_reference(v) for v in node)
    return False


def _input_pointer(pointer: str) -> str:
    return "/command/run" if pointer.startswith("/command/cmd") else pointer


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tpu(t: dict, job_id: str | None, config: RepoConfig, report: _Report, policy: Policy, raw: dict) -> dict:
    aliases = config.aliases or {}
    shared_table: dict = aliases.get("tpus") or {}
    network_default = {"enable_external_ips": True, "can_ip_forward": False}
    if "alias" in t or t.get("shared"):
        key = t.get("alias") or t.get("name")
        pointer = "/tpu/alias" if "alias" in t else "/tpu/name"
        if "alias" in t and "name" in t and t.get("name") not in (key, (shared_table.get(key) or {}).get("name")):
            report.error("/tpu/name", f"`tpu.alias` {key!r} and `tpu.name` {t['name']!r} disagree", "give only one of them")
        for f in REQUEST_FIELDS:
            if f in t and f"/tpu/{f}" not in report.from_defaults:
                report.error(f"/tpu/{f}", f"`tpu.{f}` cannot be set for a shared TPU: it comes from .ledger/aliases.yaml",
                             f"remove `{f}`, or drop `alias`/`shared` to request a TPU of the job's own", at_key=True)
        alias = key if key in shared_table else (aliases.get("tpu_names") or {}).get(key)
        if alias is None:
            known = sorted(shared_table)
            guess = close_match(str(key), known + sorted(aliases.get("tpu_names") or {}))
            hint = f"did you mean {guess!r}?" if guess else (
                f"known shared TPUs: {', '.join(known[:12])}" if known else "no shared TPUs are listed in .ledger/aliases.yaml"
            )
            report.error(pointer, f"unknown shared TPU {key!r}", f"{hint}. Add it to .ledger/aliases.yaml under `tpus:`, or request a TPU with accelerator and zone")
            return {"shared": True, "name": key, "hosts": None}
        entry = shared_table[alias]
        acc = tpu_types.lookup(entry["accelerator"])
        family = acc.family if acc else None
        return {
            "allocation_mode": entry.get("allocation_mode", "tpu-vm"),
            "accelerator": entry["accelerator"],
            "zone": entry["zone"],
            "version": entry.get("version") or tpu_types.DEFAULT_RUNTIME.get(family or "", "tpu-ubuntu2204-base"),
            "pricing": entry.get("pricing", "ondemand"),
            "reservation": None,
            "startup_script": None,
            "tags": list(t.get("tags", [])),
            "metadata": dict(t.get("metadata", {})),
            "network": dict(network_default),
            "name": entry["name"],
            "shared": True,
            "alias": alias,
            "hosts": acc.hosts if acc else None,
            "chips": acc.chips if acc else None,
        }
    known_shared = t.get("name") in shared_table or t.get("name") in (aliases.get("tpu_names") or {})
    placed = placement_check.check_request(t, report, policy, known_shared=known_shared)
    metadata = dict(t.get("metadata", {}))
    for key in metadata:
        if key in RESERVED_METADATA:
            report.error(f"/tpu/metadata/{escape(key)}", f"metadata key {key!r} is managed by the ledger",
                         "use the `ssh:` section for keys and `startup_script` for boot scripts", at_key=True)
    network = {**network_default, **(t.get("network") or {})}
    out = {k: placed[k] for k in ("allocation_mode", "accelerator", "zone", "version", "pricing", "reservation")}
    if "slices" in placed:
        out["slices"] = placed["slices"]
    out.update({
        "startup_script": t.get("startup_script"),
        "tags": list(t.get("tags", [])),
        "metadata": metadata,
        "network": network,
        "name": t.get("name") or (default_tpu_name(job_id) if job_id else None),
        "shared": False,
        "alias": None,
        "hosts": placed["hosts"],
        "chips": placed["chips"],
    })
    out.update(placement_check.check_alternatives(t, out, raw, config, report, policy))
    return out


def _envs(raw: dict, report: _Report) -> list[str]:
    present = [e for e in ENVS if raw.get(e) is not None]
    for extra in present[1:]:
        report.error(f"/{extra}", f"`{extra}:` and `{present[0]}:` are both configured; a job uses at most one environment",
                     f"remove one of them (the job runs in {present[0]} or {extra}, not both)", at_key=True)
    return present


def _command(raw: dict, hosts: int | None, report: _Report) -> dict:
    c = raw["command"]
    if "cmd" in c and "run" in c:
        report.error("/command/run", "`command.cmd` and `command.run` are both given", "keep one: `run` is JOBMAN's spelling of `cmd`", at_key=True)
    cmd = c.get("cmd", c.get("run"))
    if cmd is None:
        report.error("/command/cmd", "missing `command.cmd`: the script to run", "add `cmd: |` followed by the commands")
    workers_in = c.get("workers", [0])
    if workers_in == "all":
        workers: Any = "all"
    else:
        listed = [int(workers_in)] if isinstance(workers_in, (int, float)) else [int(w) for w in workers_in]
        workers = sorted(listed)
        if hosts is not None:
            for i, w in enumerate(listed):
                if w >= hosts:
                    ptr = "/command/workers" if isinstance(workers_in, int) else f"/command/workers/{i}"
                    report.error(ptr, f"worker {w} does not exist: the TPU has {hosts} host(s), workers 0-{hosts - 1}",
                                 "use worker numbers below the host count, or `workers: all`")
            if "workers" not in c and hosts > 1:
                report.warn("/command", f"the TPU has {hosts} hosts but the command runs on worker 0 only",
                            "multi-host JAX programs must run on every host: add `workers: all`")
    env = {k: _text(v) for k, v in (c.get("env") or {}).items()}
    return {"cmd": cmd, "workers": workers, "env": env}


def _setup(raw: dict, envs: list[str], report: _Report) -> dict:
    configured = [m for m in ("ssh", "gcsfuse") if raw.get(m) is not None] + envs[:1]
    given = (raw.get("setup") or {}).get("modules")
    if given is None:
        return {"modules": [*configured, "command"]}
    for i, module in enumerate(given):
        if module != "command" and raw.get(module) is None:
            report.error(f"/setup/modules/{i}", f"setup module `{module}` has no `{module}:` section",
                         f"add a `{module}:` section, or remove `{module}` from setup.modules")
    env_modules = [m for m in given if m in ENVS]
    if len(env_modules) > 1:
        report.error("/setup/modules", f"setup.modules lists {len(env_modules)} environments ({', '.join(env_modules)})", "keep one of docker, conda, venv")
    if "command" not in given:
        report.warn("/setup/modules", "setup.modules has no `command`: the job sets up hosts but never runs its command",
                    "add `command` as the last module")
    for section in configured:
        if section not in given:
            report.warn(f"/{section}", f"`{section}:` is configured but not in setup.modules, so it is never set up",
                        f"add `{section}` to setup.modules, or remove the section", at_key=True)
    return {"modules": list(given)}


def _ssh(ssh: dict | None, report: _Report) -> dict | None:
    if ssh is None:
        return None
    out: dict[str, Any] = {}
    for short in ("private_key", "public_key"):
        legacy = f"tpu_{short}"
        if short in ssh and legacy in ssh:
            report.error(f"/ssh/{legacy}", f"`ssh.{short}` and `ssh.{legacy}` are both given", f"keep `{short}` only", at_key=True)
        value = ssh.get(short, ssh.get(legacy))
        if value is not None:
            out[short] = value
    out["identities"] = [dict(i) for i in ssh.get("identities", [])]

    def check(value: Any, pointer: str) -> None:
        if isinstance(value, str) and KEY_MATERIAL.search(value):
            report.error(pointer, "this looks like private key material; a job spec holds paths, never secrets",
                         "put the key in your secrets folder and name it (e.g. secret://id_rsa), and rotate the key: it is now in git history")

    for k, v in ssh.items():
        if isinstance(v, str):
            check(v, f"/ssh/{k}")
    for i, ident in enumerate(ssh.get("identities", [])):
        for k, v in ident.items():
            check(v, f"/ssh/identities/{i}/{k}")
    return out


def _checkpoints(section: dict | None, report: _Report) -> dict | None:
    """`job.checkpoints`: the pattern must compile, have one group (the step) and no
    repeated group that repeats (the probe runs it over every output line)."""
    if section is None:
        return None
    out = {"pattern": section.get("pattern", defaults.CHECKPOINT_PATTERN),
           "every_s": float(section.get("every_s", defaults.CHECKPOINT_EVERY_S))}
    try:
        groups = re.compile(out["pattern"]).groups
    except re.error as exc:
        report.error("/job/checkpoints/pattern", f"checkpoint pattern {out['pattern']!r} is not a valid regular expression: {exc}",
                     "escape special characters such as ( [ . with a backslash")
        return out
    if groups != 1:
        report.error("/job/checkpoints/pattern", f"checkpoint pattern {out['pattern']!r} has {groups} groups; it needs exactly one, the step",
                     r"e.g. 'saved checkpoint at step (\d+)' (use (?:...) for other groups)")
    elif NESTED_REPEAT.search(out["pattern"]):
        report.error("/job/checkpoints/pattern", f"checkpoint pattern {out['pattern']!r} repeats a group that repeats (catastrophic backtracking)",
                     "match a fixed phrase and the step, e.g. 'LEDGER_CHECKPOINT step=(\\d+)'")
    return out


def _recovery(raw: dict, tpu: dict, report: _Report, policy: Policy) -> dict:
    section = raw.get("recovery") or {}
    out = rec.resolve(section, tpu.get("pricing"))
    for i, pattern in enumerate(out["error_patterns"]):
        try:
            re.compile(pattern)
        except re.error as exc:
            report.error(f"/recovery/error_patterns/{i}", f"error pattern {pattern!r} is not a valid regular expression: {exc}",
                         "escape special characters such as ( [ . with a backslash")
            continue
        if NESTED_REPEAT.search(pattern):
            report.error(f"/recovery/error_patterns/{i}", f"error pattern {pattern!r} repeats a group that repeats (catastrophic backtracking)",
                         "match a fixed phrase from the error line instead, e.g. 'DEADLINE_EXCEEDED'")
    limit = policy.limits.max_restarts
    if limit is not None and out["max_restarts"] > limit:
        report.error("/recovery/max_restarts", f"max_restarts {out['max_restarts']} is above the policy limit of {limit}", f"use at most {limit}")
    if out["on_preempted"] in ("resume", "rerun") and not tpu.get("shared"):
        report.warn("/recovery/on_preempted", f"on_preempted is {out['on_preempted']}, but a preempted TPU stays PREEMPTED until it is deleted",
                    "use `reapply` to re-create the TPU and resume, or `pass`")
    return out


def _priority(raw: dict, report: _Report, policy: Policy) -> int:
    def value(v: Any) -> int | None:
        if v is None:
            return None
        return PRIORITIES[v] if isinstance(v, str) else int(v)

    inner = value((raw.get("job") or {}).get("priority"))
    outer = value(raw.get("priority"))
    if inner is not None and outer is not None and inner != outer:
        report.error("/priority", f"`priority` ({outer}) and `job.priority` ({inner}) disagree", "give the priority once", at_key=True)
    result = inner if inner is not None else outer if outer is not None else DEFAULT_PRIORITY
    limit = policy.limits.max_priority
    if limit is not None and result > limit:
        ptr = "/job/priority" if inner is not None else "/priority"
        report.error(ptr, f"priority {result} is above the policy limit of {limit}", f"use at most {limit}")
    return result


def command_args(spec: dict, config: RepoConfig) -> list[str]:
    """`args` as command-line flags, e.g. ["--config.training.learning_rate=0.01"] (aliases
    expanded through `config`'s table)."""
    table: dict = (config.aliases or {}).get("config") or {}
    return args_flags({(key if "." in key else table.get(key, key)): value for key, value in (spec.get("args") or {}).items()})
