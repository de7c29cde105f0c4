"""The `tpu` block's and `tpu.fallbacks`' checks, called by ledger.spec.normalize: each
request against the accelerator table and the policy, each fallback as a complete placement
(docs/placement.md). What readers ask of a checked spec is in `placement.py`."""

from __future__ import annotations

import copy
from typing import Any

from ledger import tpu_types
from ledger.spec.args import Reporter
from ledger.spec.args import expand as expand_args
from ledger.spec.args import flags as args_flags
from ledger.spec.config import RepoConfig
from ledger.spec.placement import FIELDS, QUEUED, failover_rules
from ledger.spec.policy import Policy


def check_request(t: dict, report: Reporter, policy: Policy, *, base: str = "/tpu", known_shared: bool = False,
                  mention: str = "tpu") -> dict[str, Any]:
    """The placement fields of one TPU request (the `tpu` block, or a choice laid over it),
    checked against the accelerator table and the policy; findings go to `base`/field."""
    accelerator = t.get("accelerator")
    zone = t.get("zone")
    acc = None
    if accelerator is None and known_shared:
        report.error(f"{base}/accelerator", f"missing `{mention}.accelerator`; {t['name']!r} is a shared TPU",
                     "add `shared: true` to run on the shared TPU, or give accelerator and zone to request one")
    elif accelerator is None:
        report.error(f"{base}/accelerator", f"missing `{mention}.accelerator`: a TPU request needs a type",
                     "add e.g. `accelerator: v4-8`, or use a shared TPU with `tpu: <alias>`")
    else:
        acc = tpu_types.lookup(accelerator)
        if acc is None:
            family = accelerator.rsplit("-", 1)[0]
            sizes = [str(a.size) for a in tpu_types.all_types() if a.family == family]
            hint = f"{family} comes in sizes {', '.join(sizes)}" if sizes else "use a type such as v4-8, v5p-16, v5litepod-8 or v6e-8"
            report.error(f"{base}/accelerator", f"{accelerator!r} is not a Cloud TPU type", hint)
    if zone is None and not known_shared:
        report.error(f"{base}/zone", f"missing `{mention}.zone`: a TPU request needs a zone",
                     f"add e.g. `zone: {tpu_types.ZONES[acc.family][0] if acc else 'us-central2-b'}`")
    elif acc is not None and not tpu_types.zone_offers(zone, acc.family):
        report.warn(f"{base}/zone", f"zone {zone!r} is not known to offer {acc.family} TPUs",
                    f"{acc.family} is offered in {', '.join(tpu_types.ZONES[acc.family])}; ignore this if Google added {zone}")
    limits = policy.limits
    if accelerator and limits.accelerators and accelerator not in limits.accelerators:
        report.error(f"{base}/accelerator", f"the policy does not allow {accelerator!r}", f"allowed: {', '.join(limits.accelerators)}")
    if zone and limits.zones and zone not in limits.zones:
        report.error(f"{base}/zone", f"the policy does not allow zone {zone!r}", f"allowed: {', '.join(limits.zones)}")
    pricing = t.get("pricing", "ondemand")
    if pricing == "reserved" and not t.get("reservation"):
        report.error(f"{base}/reservation", "pricing is reserved but no `reservation` is named", "add `reservation: <name>`")
    if t.get("reservation") and pricing != "reserved":
        report.error(f"{base}/reservation", f"a reservation is named but pricing is {pricing}", "set `pricing: reserved`, or remove `reservation`")
    version = t.get("version") or (tpu_types.DEFAULT_RUNTIME[acc.family] if acc else None)
    if t.get("version") and t["version"] not in tpu_types.RUNTIME_VERSIONS:
        report.warn(f"{base}/version", f"runtime {t['version']!r} is not one the ledger knows",
                    f"known runtimes: {', '.join(tpu_types.RUNTIME_VERSIONS)}; ignore this if it is new")
    mode = t.get("allocation_mode", "tpu-vm")
    slices = int(t.get("slices", 1))
    if slices > 1 and mode != QUEUED:
        report.error(f"{base}/slices", f"{slices} slices need `allocation_mode: {QUEUED}`: Cloud TPU creates a multislice "
                     "TPU only as one queued resource", f"add `allocation_mode: {QUEUED}`, or use one slice")
    out = {"allocation_mode": mode, "accelerator": accelerator, "zone": zone, "version": version, "pricing": pricing,
           "reservation": t.get("reservation")}
    if "slices" in t:  # only when written: a spec without it keeps its hash
        out["slices"] = slices
    out.update(hosts=acc.hosts if acc else None, chips=acc.chips if acc else None)
    return out


def check_alternatives(t: dict, primary: dict, raw: dict, config: RepoConfig, report: Reporter, policy: Policy) -> dict[str, Any]:
    """`tpu.fallbacks` and `tpu.failover` of a (schema-valid) request: each fallback checked as
    a complete placement (errors name `tpu.fallbacks[i].field`), with its own gcsfuse and
    args resolved. Returns the keys to add to the normalised `tpu` block (none when neither
    is written: such a spec keeps its hash)."""
    out: dict[str, Any] = {}
    given = t.get("fallbacks") or []
    if "failover" in t or given:
        out["failover"] = {k: v for k, v in failover_rules({"tpu": t}).items() if v is not None}
    if not given:
        return out
    if not raw.get("gcsfuse") and any("gcsfuse" in alt for alt in given):
        first = next(i for i, alt in enumerate(given) if "gcsfuse" in alt)
        report.error(f"/tpu/fallbacks/{first}/gcsfuse", "a fallback overrides `gcsfuse` but the job has no `gcsfuse:` section",
                     "add a `gcsfuse:` section (bucket_name and mount_path) for the other choices", at_key=True)
    job_args = expand_args(raw.get("args") or {}, config, _Quiet())
    seen = {_key(primary): 0}
    fallbacks = []
    for i, alt in enumerate(given):
        base = f"/tpu/fallbacks/{i}"
        merged = {**{k: t[k] for k in FIELDS if k in t}, **{k: alt[k] for k in FIELDS if k in alt}}
        if "accelerator" in alt and "version" not in alt:
            merged.pop("version", None)  # another family's default runtime, not the tpu block's
        echo = _Echo(report, base, set(alt), f"tpu.fallbacks[{i}]")
        row = check_request(merged, echo, policy, base=base, mention=f"tpu.fallbacks[{i}]")
        row.setdefault("slices", int(merged.get("slices", 1)))
        if "gcsfuse" in alt and raw.get("gcsfuse"):
            row["gcsfuse"] = {**copy.deepcopy(raw["gcsfuse"]), **copy.deepcopy(alt["gcsfuse"])}
        if alt.get("args"):
            own = expand_args(alt["args"], config, report, base=f"{base}/args")
            row["args_flags"] = args_flags({**job_args, **own})
        key = _key(row)
        if key in seen and not {"gcsfuse", "args"} & set(alt):
            where = "the tpu block" if seen[key] == 0 else f"tpu.fallbacks[{seen[key] - 1}]"
            report.warn(base, f"tpu.fallbacks[{i}] asks for the same placement as {where}", "remove it, or change its zone, type or pricing")
        seen.setdefault(key, i + 1)
        fallbacks.append(row)
    out["fallbacks"] = fallbacks
    return out


def _key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("allocation_mode", "accelerator", "zone", "pricing", "reservation", "slices"))


def smallest_hosts(tpu: dict) -> int | None:
    """Hosts per slice of the smallest choice (what `command.workers` must fit in)."""
    counts = [h for h in (tpu.get("hosts"), *((f or {}).get("hosts") for f in tpu.get("fallbacks") or ())) if h is not None]
    return min(counts) if counts else None


# The fields each finding of `check_request` depends on (by the field it is reported at).
_DEPENDS = {"accelerator": {"accelerator"}, "zone": {"zone", "accelerator"}, "reservation": {"reservation", "pricing"},
            "version": {"version"}, "slices": {"slices", "allocation_mode"}}


class _Echo:
    """A choice's findings, each naming `tpu.fallbacks[i].field`: at the choice's own field
    when it sets it, at the choice when the finding comes from its mix with the `tpu` block,
    and not at all when it only repeats one about the `tpu` block itself."""

    def __init__(self, report: Reporter, base: str, own: set[str], name: str) -> None:
        self.report, self.base, self.own, self.name = report, base, own, name

    def _where(self, pointer: str) -> tuple[str, str] | None:
        field = pointer.rsplit("/", 1)[-1]
        if field in self.own:
            return pointer, f"{self.name}.{field}"
        if _DEPENDS.get(field, {field}) & self.own:
            return self.base, f"{self.name}.{field} (from the tpu block)"
        return None

    def error(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None:
        if (found := self._where(pointer)) is not None:
            self.report.error(found[0], f"{found[1]}: {message}", hint, at_key=at_key and found[0] == pointer)

    def warn(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None:
        if (found := self._where(pointer)) is not None:
            self.report.warn(found[0], f"{found[1]}: {message}", hint, at_key=at_key and found[0] == pointer)


class _Quiet:
    """The job's own args are reported where they are written (/args), not again per choice."""

    def error(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None:
        pass

    def warn(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None:
        pass
