"""`ledger plan REF`: what merging REF into the branch would do, without touching the ledger.

Like Atlantis's plan, for a PR check: the jobs that would be submitted, updated and
cancelled, each spec's validation, the TPUs and chips requested, and which shared TPUs are
already held by live jobs. `ok` is False when anything would be rejected as invalid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.fold import LIVE
from ledger.gitops.approval import Identity, eligible, may_still_approve
from ledger.gitops.decide import RepoState, _message_dict
from ledger.gitops.ingest import Validator, spec_validator
from ledger.gitops.repo import ZERO, GitError, GitRepo
from ledger.placement import asked
from ledger.replay import load_lazy
from ledger.spec.layout import is_governed, is_job_path
from ledger.spec.names import job_id_for, shown
from ledger.spec.placement import placements
from ledger.spec.policy import Policy


@dataclass(slots=True)
class PlanItem:
    action: str  # submit | update | cancel | invalid
    job: str | None
    path: str
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    accelerator: str | None = None
    chips: int | None = None
    tpu: str | None = None
    shared: bool = False
    held_by: list[str] = field(default_factory=list)  # live jobs already on that shared TPU
    approvers: list[str] = field(default_factory=list)  # who may still approve (not its authors)
    owners: list[str] = field(default_factory=list)  # the CODEOWNERS/policy entries (teams unexpanded)
    authors: list[str] = field(default_factory=list)  # who wrote the change in REF
    start: str | None = None  # "starts now" or "waits: why" under the policy's quotas (with a ledger)
    family: str | None = None
    # Every placement the job may take, in order (ledger.spec.placement): {index, placement, chips}
    choices: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def tpu_label(self) -> str:
        """The TPU column: `name (accelerator)` for a shared TPU, else whichever is known."""
        if self.tpu and self.accelerator:
            return f"{self.tpu} ({self.accelerator})"
        return self.tpu or self.accelerator or ""

    def notes(self, people: str | None = None) -> list[str]:
        """The notes every view of the plan prints for this item: errors (file:line), the
        jobs holding its shared TPU, PEOPLE (each view names authors or approvers its own
        way), then whether it would start now."""
        out = [f"{e.get('file', self.path)}:{e.get('line', '?')}: {e.get('message')}" for e in self.errors]
        if self.held_by:
            out.append("shared TPU held by " + ", ".join(self.held_by))
        if len(self.choices) > 1:
            out.append("else " + "; else ".join(f"{c['placement']} ({c['chips']} chips)" for c in self.choices[1:]))
        if people:
            out.append(people)
        if self.start:
            out.append(self.start)
        return out


@dataclass(slots=True)
class PlanReport:
    ref: str
    branch: str
    base: str
    head: str
    items: list[PlanItem] = field(default_factory=list)
    config_changes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(i.action != "invalid" for i in self.items)

    def totals(self) -> dict[str, int]:
        out = {"submit": 0, "update": 0, "cancel": 0, "invalid": 0, "chips": 0}
        for i in self.items:
            out[i.action] += 1
            if i.action in ("submit", "update") and i.chips and not i.shared:
                out["chips"] += i.chips
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref, "branch": self.branch, "base": self.base, "head": self.head, "ok": self.ok,
            "totals": self.totals(), "items": [i.to_dict() for i in self.items],
            "config_changes": self.config_changes,
        }


def _tpu_facts(item: PlanItem, spec: Any) -> None:
    """The TPU columns of a normalized spec: what its first choice takes (every slice), its
    name, whether it is shared, and every choice it may take (ledger.placement)."""
    tpu = spec.get("tpu") if isinstance(spec, dict) else None
    if not isinstance(tpu, dict):
        return
    first = asked(spec)
    item.accelerator, item.tpu, item.shared = tpu.get("accelerator"), tpu.get("name"), bool(tpu.get("shared"))
    item.chips, item.family = (first.chips, first.family) if first else (tpu.get("chips"), None)
    item.choices = [{"index": c.index, "placement": c.label(), "chips": fp.chips if (fp := asked(spec, c.index)) else None}
                    for c in placements(spec)]


def _held(store: Any) -> dict[str, list[str]]:
    """Shared TPU name -> live jobs holding it, from the ledger (empty without a store): the
    jobs that hold a TPU or ask for a shared one, from the newest snapshot's index and the
    events after it (`load_lazy`: no job decoded; a lab's 118,956 jobs were, to find ~200)."""
    if store is None:
        return {}
    held: dict[str, list[str]] = {}
    for x in sorted(load_lazy(store).holders()):
        name = x.held or x.wants_shared
        if x.state in LIVE and name and (x.held_shared or x.wants_shared):
            held.setdefault(name, []).append(x.id)
    return held


# (new or changed specs by job id, the policy in force) -> job id -> "starts now" / "waits: why".
# The application shell passes one that runs the planner's admission over the ledger.
Admission = Callable[[Mapping[str, dict[str, Any]], Policy], Mapping[str, str]]


def plan(
    repo: GitRepo | str, ref: str, branch: str = "main", *, store: Any = None, validator: Validator | None = None,
    admission: Admission | None = None,
) -> PlanReport:
    if not isinstance(repo, GitRepo):
        with GitRepo(repo) as opened:
            return plan(opened, ref, branch, store=store, validator=validator, admission=admission)
    head = repo.resolve(ref)
    if head is None:
        raise GitError(f"{ref!r} is not a commit in {repo.path}", hint="name a branch, tag or commit id")
    target = repo.branch_head(branch) or repo.resolve(branch)
    base = repo.merge_base(target, head) if target else None
    if target is None or base is None:
        raise GitError(f"{ref!r} shares no history with {branch!r}", hint="check --branch")
    changes = repo.diffs([(head, base)]).get(head, [])
    # Validate against the configuration the merge would produce (aliases from REF).
    cfg = repo.governed_files(head)
    blobs = repo.read_blobs([*cfg.values(), *(c.new_blob for c in changes if c.new_blob != ZERO)])
    state = RepoState.of(cfg, blobs)
    base_cfg = repo.governed_files(target)
    base_state = RepoState.of(base_cfg, repo.read_blobs(base_cfg.values()))
    # Approval is judged by the rules in force on the branch, never by the ones REF brings.
    policy = base_state.policy()
    codeowners = base_state.codeowners()
    wrote = repo.path_authors(base, head)
    validate = validator or spec_validator()
    held = _held(store)
    report = PlanReport(ref, branch, base, head)
    submitted: dict[str, dict[str, Any]] = {}

    def who(path: str) -> dict[str, list[str]]:
        owners = eligible(policy, codeowners, path)
        authors = tuple(Identity(n, e) for n, e in wrote.get(path, ()))
        return {"owners": list(owners), "authors": [a.display() for a in authors],
                "approvers": list(may_still_approve(policy, owners, authors))}

    for ch in changes:
        if is_governed(ch.path) or is_governed(ch.old_path):
            report.config_changes.append(ch.path)
            continue
        if ch.status in ("D", "R") and is_job_path(ch.old_path or ch.path):
            old = ch.old_path or ch.path
            report.items.append(PlanItem("cancel", _shown(job_id_for(old)), shown(old), **who(old)))
        if ch.status == "D" or not is_job_path(ch.path):
            continue
        result = validate(blobs.get(ch.new_blob, b""), ch.path, state)
        jid = getattr(result, "job_id", None) or job_id_for(ch.path)
        item = PlanItem(
            "update" if ch.status == "M" else "submit",
            _shown(jid), shown(ch.path), **who(ch.path),
            warnings=[_message_dict(w) for w in getattr(result, "warnings", []) or []],
        )
        if not result.ok:
            item.action = "invalid"
            item.errors = [{k: shown(v) if k == "file" and isinstance(v, str) else v for k, v in _message_dict(e).items()}
                           for e in result.errors]
        else:
            _tpu_facts(item, result.spec)
            if item.shared and item.tpu:
                item.held_by = [j for j in held.get(item.tpu, []) if j != jid]
            if item.action == "submit" and jid:
                submitted[jid] = result.spec
        report.items.append(item)
    if admission is not None and submitted:
        starts = admission(submitted, policy)  # the policy in force on the branch
        for item in report.items:
            if item.action == "submit" and item.job in starts:
                item.start = starts[item.job]
    return report


def _shown(job_id: str | None) -> str | None:
    # a plan is printed and posted as a comment: control characters and undecodable bytes
    # in a hostile file name are shown escaped, never raw
    return shown(job_id) if job_id is not None else None


def families(report: PlanReport) -> dict[str, int]:
    """New chips requested per TPU family (v4, v5litepod, ...), shared TPUs not counted."""
    out: dict[str, int] = {}
    for i in report.items:
        if i.action in ("submit", "update") and i.chips and not i.shared and i.accelerator:
            family = i.family or i.accelerator
            out[family] = out.get(family, 0) + i.chips
    return dict(sorted(out.items()))


_VERB = {"submit": "submits", "update": "updates", "cancel": "cancels", "invalid": "rejects (invalid)"}


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes and newlines would break the row."""
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: PlanReport) -> str:
    """The plan as a pull-request comment: what merging does, chips per family, who must
    approve (Atlantis's plan comment, for jobs)."""
    t = report.totals()
    status = "✅ every spec is valid" if report.ok else "❌ some specs would be rejected"
    lines = [f"### ledger plan: `{report.ref}` into `{report.branch}`", "",
             f"{status}. Merging {_VERB['submit']} {t['submit']}, {_VERB['update']} {t['update']} "
             f"and {_VERB['cancel']} {t['cancel']} job(s); {t['invalid']} invalid.", ""]
    if report.items:
        lines += ["| action | job | TPU | chips | who may approve | notes |", "| --- | --- | --- | --- | --- | --- |"]
        for i in report.items:
            notes = i.notes("by " + ", ".join(i.authors) if i.authors else None)
            approvers = ", ".join(i.approvers) or ("nobody: no CODEOWNERS entry" if not i.owners else "nobody but the authors")
            lines.append("| " + " | ".join(_cell(x) for x in (
                i.action, f"`{i.job or i.path}`", i.tpu_label(), str(i.chips or ""), approvers, "; ".join(notes))) + " |")
        lines.append("")
    else:
        lines += ["No job changes.", ""]
    chips = families(report)
    if chips:
        lines.append("**Chips requested:** " + ", ".join(f"{fam}: {n}" for fam, n in chips.items())
                     + f" ({t['chips']} in all)")
    if report.config_changes:
        lines.append("**Configuration changed** (needs approval under the current policy): "
                     + ", ".join(f"`{p}`" for p in report.config_changes))
    lines += ["", f"<sub>base {report.base[:12]}, head {report.head[:12]}</sub>"]
    return "\n".join(lines) + "\n"
