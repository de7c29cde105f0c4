"""plan(jobs, observed) -> actions: what the reconciler should do now. Pure: no I/O.

One action per job per pass at most; the loop runs again as soon as its effects are
recorded, so a multi-step story (release, then provision, then set up) unfolds over passes,
each step recorded before the next is decided.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from ledger import defaults, fold
from ledger.capacity import CapacityMemory
from ledger.events import data as ev
from ledger.events import format_time, parse_time
from ledger.failures import ApiFailure
from ledger.fold import JobState
from ledger.placement import slice_nodes
from ledger.spec.placement import Choice, choice, failover, placements
from reconciler import admission, naming, placement, react, slices
from reconciler.model import (
    NODE_GONE_STATES,
    NODE_READY,
    QR_LOST_STATES,
    QR_WAITING_STATES,
    Action,
    HostObs,
    NodeObs,
    Observed,
    PlanConfig,
)
from reconciler.rules import decide
from reconciler.slices import UNEXPLAINED_HEALTH


class Settled(Protocol):
    """What the orphan collector asks of the settled jobs a pass leaves out of `jobs`
    (reconciler.shelf.Shelf holds them)."""

    def released_since(self, cutoff: str) -> Iterable[str]: ...

    def job_of_label(self, label: str) -> str | None: ...


def plan(
    jobs: Mapping[str, JobState],
    observed: Observed,
    *,
    in_flight: Iterable[str] = (),
    config: PlanConfig | None = None,
    taken_over: Iterable[str] = (),
    usage: admission.Usage = admission.NO_USAGE,
    memory: CapacityMemory | None = None,
    settled: Settled | None = None,
) -> list[Action]:
    """`jobs`: those to plan; a settled job (reconciler.live) may be left out, and then
    `settled` answers the orphan collector's rare questions about those.
    `taken_over`: jobs whose lease this reconciler just won from a holder that let it
    lapse (a dead peer): their unfinished intents are resolved now, not after a timeout.
    `usage`: recent usage for the policy's fair share and weekly quotas (admission).
    `memory`: the lab-wide capacity memory (ledger.capacity) the placement step reads."""
    config = config or PlanConfig()
    busy = set(in_flight)
    adopted = frozenset(taken_over)
    # Made at the first job that waits for a shared TPU, once a pass (most passes have none).
    holders = _Lazy(lambda: shared_holders(jobs))
    first_in_line = _Lazy(lambda: {name: line[0].id for name, line in shared_lines(jobs).items()})
    actions: list[Action] = []
    # Where each waiting job would go now (reconciler.placement); admission charges that.
    placing = placement.place_waiting(jobs, memory or CapacityMemory(), int(observed.now * 1_000_000), busy)
    asks = {jid: got.choice for jid, got in placing.items() if isinstance(got, placement.Try)}
    gate = admission.admit(jobs, config.policy, usage, busy=busy, asks=asks) if admission.active(config.policy) else None  # type: ignore[arg-type]
    for job in jobs.values():
        if job.state in fold.TERMINAL and job.tpu is None or job.id in busy:  # job.terminal, without a call per job
            continue
        if gate is not None and (wait := gate.waits.get(job.id)) is not None:  # held back: recorded once per reason
            action = None if admission.recorded(job, wait) else _record(job, admission.queued(wait))
        else:
            action = plan_job(job, observed, holders, first_in_line, config, adopted, placing.get(job.id),
                              moved=memory is not None and job.id in memory.moved)
            if action is None and gate is not None and job.id in gate.preempt:
                action = _record(job, admission.preemption(job, gate.preempt[job.id], reclaim=job.id in gate.reclaim))
            elif action is None and gate is not None and job.id in gate.spent:
                then = admission.when_spent(job, config.policy.quotas.on_spent)  # type: ignore[union-attr]
                action = _quota_spent(job, gate.spent[job.id], then)
        if action is not None and observed_for(action, observed):
            actions.append(action)
    actions.extend(collect_orphans(jobs, observed, config, settled))
    return actions


# Actions whose effect calls the TPU API (given a TPU of the job's own): a resolve of one
# looks at reality through the API too.
_API_KINDS = frozenset({"provision", "release", "cancel", "recover", "restart", "mark_provisioned", "collect_orphan"})


def api_zone(action: Action) -> str | None:
    """The zone whose TPU API `action` calls, or None when it calls none (a record, SSH steps,
    a shared TPU handed back, a recovery on the same TPU)."""
    kind, p = action.kind, action.params
    if kind == "resolve":
        intent = p.get("intent") or {}
        kind, p = intent.get("action", ""), intent.get("params") or {}
    if kind not in _API_KINDS:
        return None
    tpu = p.get("tpu") or {}
    if not tpu or tpu.get("shared") or kind in ("recover", "restart") and not p.get("reapply"):
        return None
    return str(tpu.get("zone", ""))


def observed_for(action: Action, obs: Observed) -> bool:
    """No action is taken against a zone the loop could not observe this pass (its API is
    down, or backing off): nothing would come of it but a failure to record."""
    zone = api_zone(action)
    return zone is None or zone in obs.zones


def _quota_spent(job: JobState, spent: admission.Wait, then: str) -> Action | None:
    """A running job whose weekly quota ran out: recorded once per attempt; under
    `checkpoint-and-stop`, its TPU is taken back once it reports a checkpoint after that."""
    if not admission.spent_recorded(job):
        return _record(job, admission.quota_spent(job, spent, then))
    if then == "checkpoint-and-stop" and admission.checkpointed_since_spent(job):
        return _record(job, admission.stopped_for_quota(job, spent))
    return None


def resolutions(
    jobs: Mapping[str, JobState], now: float, config: PlanConfig, taken_over: Iterable[str] = (),
) -> list[Action]:
    """The `resolve` actions `plan` would give the jobs' unfinished intents, from the jobs'
    state alone: the loop takes these up before it observes anything."""
    adopted = frozenset(taken_over)
    obs = Observed(now=now)
    return [
        action for job in jobs.values()
        if job.pending_action and not (job.terminal and job.tpu is None)
        and (action := _resolve(job, obs, config, job.id in adopted)) is not None
    ]


class _Lazy(Mapping[str, str]):
    """A mapping made on first use: a pass where no job waits for a shared TPU makes neither
    scan of every job."""

    def __init__(self, make: Callable[[], dict[str, str]]) -> None:
        self._make, self._data = make, None

    def _made(self) -> dict[str, str]:
        if self._data is None:
            self._data = self._make()
        return self._data

    def __getitem__(self, key: str) -> str:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


def shared_holders(jobs: Mapping[str, JobState]) -> dict[str, str]:
    """Shared TPU name -> the job holding it (a live job whose `tpu` names it)."""
    return {
        j.tpu["name"]: j.id
        for j in jobs.values()
        if j.tpu and j.tpu.get("shared") and not j.terminal
    }


def tpu_request(job: JobState, chosen: Choice | None = None) -> dict[str, Any]:
    """The TPU this job's next attempt needs: a shared one by name, or a new one of its own
    on choice `chosen` (its first by default): the choice's type, zone, pricing and slices,
    and its index (`placement`), as the `provisioning` event records them."""
    tpu = job.spec.get("tpu") or {}
    if tpu.get("shared"):
        return {"name": tpu["name"], "zone": tpu.get("zone", ""), "kind": "node", "shared": True,
                "accelerator": tpu.get("accelerator", "")}
    attempt = max(job.attempt, 1)
    chosen = chosen or choice(job.spec, 0)
    want = {
        "name": naming.node_name(job.id, naming.submission(job), attempt),
        "zone": tpu.get("zone", ""),
        "kind": "queued_resource" if tpu.get("allocation_mode") == "queued-resources" else "node",
        "shared": False,
        "accelerator": tpu.get("accelerator", ""),
        "attempt": attempt,
    }
    if chosen is not None:
        want.update(zone=chosen.zone, kind="queued_resource" if chosen.queued else "node", accelerator=chosen.accelerator,
                    pricing=chosen.pricing)
        if chosen.index:
            want["placement"] = chosen.index
        if chosen.slices > 1:
            want["slices"] = chosen.slices
    return want


def plan_job(
    job: JobState,
    obs: Observed,
    holders: Mapping[str, str],
    first_in_line: Mapping[str, str],
    config: PlanConfig,
    adopted: frozenset[str] = frozenset(),
    placing: placement.Try | placement.Hold | None = None,
    moved: bool = False,
) -> Action | None:
    """`placing`: the placement step's answer for a job that waits for a TPU of its own;
    `moved`: its TPU is another choice than its last attempt's (ledger.capacity); `holders`
    and `first_in_line`: each shared TPU's holder and the job next in its line."""
    if job.pending_action:
        return _resolve(job, obs, config, job.id in adopted)
    if _release_refused_lately(job, obs, config):
        return None  # its TPU cannot be deleted until someone grants what the API asked for
    if job.terminal:
        return _release(job, "job ended")
    s = job.state
    if s == fold.BLOCKED:  # the API refused it for good: nothing until its spec or the policy changes, or `ledger resume`
        if job.tpu is not None:
            return _release(job, "blocked")
        if config.policy_since and job.times.get("provision_failed", "") < config.policy_since:
            return _record(job, ev.Queued(reason="the policy changed since the TPU API refused this job: trying again"))
        return None
    if s == fold.CANCELLING:
        return Action("cancel", job.id, {"tpu": job.tpu, "stop": _may_run(job)}, "cancel requested")
    if s in (fold.PENDING, fold.QUEUED) and job.tpu is None or s == fold.RECOVERING and job.tpu is None:
        return _acquire(job, obs, holders, first_in_line, config, placing)
    if job.tpu is None:
        return _record(job, ev.Failed(kind="lost_host", message=f"no TPU held in state {s}", final=True))
    zone = job.tpu.get("zone", "")
    if zone not in obs.zones:
        return None  # that zone was not observed this pass: decide nothing blind
    node, lost = slices.observe(job.tpu, obs.nodes)  # every slice's node, as one
    if s in (fold.PROVISIONING, fold.QUEUED):
        return _watch_provisioning(job, node, obs, config, lost)
    if node is None or node.state in NODE_GONE_STATES:
        if s in (fold.PREEMPTED, fold.FAILED):
            return _recover(job, tpu_usable=False, cause=_cause_when_tpu_gone(job), obs=obs)
        if s == fold.RECOVERING:
            return _release(job, "TPU lost during recovery", next_step="reapply", obs=obs)
        return _record(job, slices.lost_event(job.tpu, node, lost, job.attempt))
    if node.state != NODE_READY:
        return None  # stopping, repairing, restarting: look again next pass
    if s == fold.PROVISIONED or s == fold.SETTING_UP or s == fold.RECOVERING and job.recovery:
        return Action("setup", job.id, {"attempt": job.attempt, "tpu": job.tpu}, "TPU ready")
    if s == fold.READY:
        resume = job.attempt > 1 and (job.recovery or {}).get("rule", "resume") != "rerun" \
            and (not moved or failover(job.spec)["resume_across"])  # a checkpoint of another choice: only if it says so
        return Action("start", job.id, {"attempt": job.attempt, "resume": resume}, "set up")
    if s == fold.RUNNING:
        return (_watch_running(job, node, obs.hosts.get(job.id), _suspect_age(job.id, obs), config)
                or _checkpointed(job, obs.hosts.get(job.id), obs.now))
    if s in (fold.PREEMPTED, fold.FAILED):  # preempted for another job: its TPU is given back
        return _recover(job, tpu_usable=not admission.given_back(job), obs=obs)
    return None


def _acquire(
    job: JobState, obs: Observed, holders: Mapping[str, str], first_in_line: Mapping[str, str], config: PlanConfig,
    placing: placement.Try | placement.Hold | None = None,
) -> Action | None:
    if (job.spec.get("tpu") or {}).get("shared"):
        want = tpu_request(job)
        holder = holders.get(want["name"])
        if holder and holder != job.id:
            reason = f"shared TPU {want['name']} is held by {holder}"
            return None if job.queued_reason == reason else _record(job, ev.Queued(reason=reason))
        first = first_in_line.get(want["name"], job.id)
        if first != job.id:
            reason = f"shared TPU {want['name']} goes to {first} first"
            return None if job.queued_reason == reason else _record(job, ev.Queued(reason=reason))
        return _record(job, ev.Provisioning(attempt=max(job.attempt, 1), tpu=ev.tpu(want)))
    if isinstance(placing, placement.Hold):  # every choice out of capacity, or its probe not due
        return None if job.queued_reason == placing.reason else _record(job, ev.Queued(reason=placing.reason, paced=True))
    chosen = placing.choice if isinstance(placing, placement.Try) else None
    want = tpu_request(job, chosen)
    refusal = obs.refused.get(want["zone"])
    if refusal is not None:  # the API will not even list the zone (a permission, an unknown zone)
        return _record(job, *react.refused(job, want, refusal))
    if want["zone"] not in obs.zones:
        return None  # its API is not answering: ask nothing of it
    # The capacity memory paces a job it held, or moved on, or lets probe: no backoff of its own.
    paced = isinstance(placing, placement.Try) and (placing.reason or placing.probe) \
        or job.queued_reason.startswith(placement.HOLD)
    if job.state == fold.QUEUED and job.queued_count and not paced:
        # A retry the capacity memory knows nothing of (a TPU that vanished, a queued resource
        # that failed): back off by the job's own count.
        delay = min(config.queued_retry_s * 2 ** (job.queued_count - 1), config.queued_retry_max_s)
        since = _age(job, "queued", obs.now)
        if since is not None and since < delay:
            return None
    params: dict[str, Any] = {"attempt": want["attempt"], "tpu": want}
    if want["kind"] == "queued_resource" and (wait := queued_wait_s(job, chosen)) is not None:
        params["wait_s"] = wait
    why = placing.reason if isinstance(placing, placement.Try) and placing.reason else "needs a TPU"
    return Action("provision", job.id, params, why)


def queued_wait_s(job: JobState, chosen: Choice | None) -> float | None:
    """How long a queued-resource choice may wait for capacity (its valid_until), or None for
    no limit: `failover.wait_s` when given, else an hour when later choices exist."""
    rules = failover(job.spec)
    if rules["wait_s"]:
        return float(rules["wait_s"])
    index = chosen.index if chosen is not None else 0
    return defaults.QUEUED_WAIT_S if index + 1 < len(placements(job.spec)) else None


def shared_lines(jobs: Mapping[str, JobState]) -> dict[str, list[JobState]]:
    """Shared TPU name -> the jobs waiting for it, in the order they will get it (the first
    is next when it frees up): higher priority first, then earlier submission. One scan of
    the jobs for every line (a pass asks each waiting job's line)."""
    lines: dict[str, list[JobState]] = {}
    for j in jobs.values():
        if j.tpu is None and j.state in _SHARED_WAITING and (want := j.spec.get("tpu") or {}).get("shared"):
            lines.setdefault(want.get("name"), []).append(j)
    for line in lines.values():
        line.sort(key=lambda j: (-j.priority, j.submitted_seq))
    return lines


_SHARED_WAITING = frozenset({fold.PENDING, fold.QUEUED, fold.RECOVERING})



def _watch_provisioning(job: JobState, node: NodeObs | None, obs: Observed, config: PlanConfig,
                        lost: int | None = None) -> Action | None:
    """`node` speaks for every slice (reconciler.slices.observe); `lost`: the slice it is."""
    assert job.tpu is not None
    name = job.tpu["name"]
    if job.tpu.get("kind") == "queued_resource":
        qr = obs.queued.get(name)
        if qr is not None and qr.state in QR_LOST_STATES:
            if qr.state == "FAILED" and qr.error is not None:
                # Its valid_until passed in WAITING_FOR_RESOURCES: no capacity in time (a stockout).
                error = _out_of_time(qr.message or "its valid_until passed") if qr.error.code == "DEADLINE_EXCEEDED" else qr.error
                return _release_refused(job, f"queued resource failed: {qr.message or qr.error.code}", error)
            if qr.state == "FAILED":
                return _release(job, f"queued resource failed: {qr.message or 'no reason given'}", next_step="retry")
            return _record(job, ev.Preempted(tpu_state=qr.state, reason=f"queued resource {name} is {qr.state}", attempt=job.attempt))
        if qr is not None and qr.state != "ACTIVE":
            wait = queued_wait_s(job, choice(job.spec, int(job.tpu.get("placement", 0) or 0)))
            age = _age(job, "provisioning", obs.now)
            if wait is not None and age is not None and age >= wait and qr.state in QR_WAITING_STATES:
                # Its time for capacity is up: give it back, as a stockout of its choice (the next is tried).
                why = f"queued resource {name} waited {int(age)} s for capacity"
                return _release_refused(job, why, _out_of_time(why))
            reason = f"queued resource {name} is {qr.state}" + (f": {qr.message}" if qr.message else "")
            return None if job.queued_reason == reason else _record(job, ev.Queued(reason=reason))
        if qr is None and node is None:
            return _vanished(job, obs, config)
    if node is None:
        return _vanished(job, obs, config) if job.tpu.get("kind") != "queued_resource" else None
    if node.state == NODE_READY:
        return Action("mark_provisioned", job.id, {"tpu": job.tpu}, "TPU is READY")
    if node.state in NODE_GONE_STATES:
        which = {"slice": lost} if lost is not None else {}
        return _record(job, ev.Preempted(tpu_state=node.state, reason=f"TPU {node.name} is {node.state} before it was used",
                                         attempt=job.attempt, **which))
    age = _age(job, "provisioning", obs.now)
    if age is not None and age > config.provision_timeout_s:
        return _release(job, f"TPU {name} still {node.state} after {int(age)} s", next_step="retry")
    return None


def _out_of_time(message: str) -> ApiFailure:
    """A queued resource that got no capacity before its deadline, as the stockout it is."""
    return ApiFailure(code="RESOURCE_EXHAUSTED", message=message, method="CreateQueuedResource", in_operation=True)


def _release_refused(job: JobState, reason: str, failure: ApiFailure) -> Action | None:
    """Release the TPU the API refused (in its operation, or a queued resource that failed),
    recording what the refusal means (reconciler.react.released)."""
    action = _release(job, reason, next_step="retry")
    if action is None:
        return None
    return Action(action.kind, action.job_id, {**action.params, "refused": react.failure_params(failure)}, action.reason)


def _vanished(job: JobState, obs: Observed, config: PlanConfig) -> Action | None:
    """The create was accepted but nothing is there. Its operation says why, when it ended
    in an error (a stockout, a permission, ...); else give the API a moment, then try again."""
    assert job.tpu is not None
    op = obs.operations.get(job.operation) if job.operation else None
    if op is not None and op.done and op.error is not None:
        return _record(job, *react.lost_create(job, job.tpu, op.error))
    if op is not None and not op.done:
        return None  # still being created (the listing raced it)
    age = _age(job, "provisioning", obs.now)
    if age is not None and age < 30:
        return None
    return _record(job, *react.lost_create(job, job.tpu, None))


def _suspect_age(job_id: str, obs: Observed) -> float | None:
    since = obs.suspect_since.get(job_id)
    return None if since is None else obs.now - since


def _watch_running(
    job: JobState, node: NodeObs, hosts: Mapping[int, HostObs] | None,
    suspect_age: float | None = None, config: PlanConfig | None = None,
) -> Action | None:
    if job.run_spec_hash and job.spec_hash != job.run_spec_hash:
        assert job.tpu is not None
        # The choice the job holds, as the new spec has it: another TPU is needed when it changed.
        want = choice(job.spec, int(job.tpu.get("placement", 0) or 0))
        reapply = not job.tpu.get("shared") and (want is None or (want.accelerator, want.zone, want.slices) != (
            job.tpu.get("accelerator"), job.tpu.get("zone"), int(job.tpu.get("slices", 1) or 1)))
        return Action("restart", job.id, {"attempt": job.attempt + 1, "rule": "spec_updated", "reapply": reapply, "tpu": job.tpu, "stop": True}, "the spec changed while running")
    if not hosts:
        return None
    workers = selected_workers(job)
    seen = {w: hosts[w] for w in workers if w in hosts}
    matches = {m for h in hosts.values() for m in h.matches}
    if "preempted" in matches or node.health == "UNHEALTHY_MAINTENANCE":
        return _record(job, ev.Preempted(tpu_state=node.state, reason="maintenance or preemption announced in the job's output", attempt=job.attempt))
    if "tpu_busy" in matches:
        return _record(job, ev.Failed(kind="tpu_busy", message="the TPU was in use by another process (or its lock was)", attempt=job.attempt))
    if "grpc" in matches:
        return _record(job, ev.Failed(kind="grpc", message="GRPC error in the job's output", attempt=job.attempt))
    # `suspect_age` None: the caller does not track suspects (the loop always does).
    confirm = (config or PlanConfig()).lost_host_confirm_s
    if suspect(hosts) and node.health in UNEXPLAINED_HEALTH and suspect_age is not None and suspect_age < confirm:
        # The node reads READY and healthy, yet a worker is gone or was killed: the host may
        # have seen the preemption before the API did. Ask again next pass (the loop re-reads
        # the node after such a probe) rather than record a host loss that was a preemption.
        return None
    gone = sorted(w for w, h in hosts.items() if h.state == "gone")
    if gone:
        return _record(job, ev.Failed(kind="lost_host", **slices.host(job, gone[0]), attempt=job.attempt,
                                      message=f"{slices.host_text(job, gone[0])} lost: {hosts[gone[0]].error or 'process or host gone'}"))
    bad = sorted(w for w, h in seen.items() if h.state == "exited" and h.exit_code not in (0, None))
    if bad:
        code = seen[bad[0]].exit_code
        return _record(job, ev.Failed(kind="exit", **slices.host(job, bad[0]), exit_code=code, attempt=job.attempt,
                                      message=f"{slices.host_text(job, bad[0])} exited with code {code}"))
    if "failure" in matches:
        return _record(job, ev.Failed(kind="failure", message="a failure pattern appeared in the job's output", attempt=job.attempt))
    if seen and len(seen) == len(workers) and all(h.state == "exited" and h.exit_code == 0 for h in seen.values()):
        if (job.spec.get("job") or {}).get("loop"):
            return Action("restart", job.id, {"attempt": job.attempt + 1, "rule": "loop", "reapply": False, "tpu": job.tpu, "stop": False}, "job.loop: run again")
        return _record(job, ev.Finished(attempt=job.attempt, exit_codes={slices.host_key(job, w): 0 for w in workers}))
    return None


def _checkpointed(job: JobState, hosts: Mapping[int, HostObs] | None, now: float) -> Action | None:
    """The job printed a checkpoint line (its first selected worker's output): record the
    step when it is newer than the last one recorded for this attempt, at most once per
    `job.checkpoints.every_s`. Asked only when nothing else about the running job needs
    recording, so a failure is never held back by a checkpoint."""
    workers = selected_workers(job)
    seen = (hosts or {}).get(workers[0]) if workers else None
    if seen is None or seen.checkpoint is None:
        return None
    last = job.checkpoint or {}
    if last.get("attempt") == job.attempt and seen.checkpoint <= last.get("step", -1):
        return None
    every = ((job.spec.get("job") or {}).get("checkpoints") or {}).get("every_s", defaults.CHECKPOINT_EVERY_S)
    since = _age(job, "checkpointed", now) if last else None
    if since is not None and since < every:
        return None
    return _record(job, ev.Checkpointed(attempt=job.attempt, step=seen.checkpoint, worker=slices.host(job, workers[0])["worker"]))


def suspect(hosts: Mapping[int, HostObs]) -> bool:
    """A worker gone, or its command killed by a signal: what a preemption looks like from
    the host's side, before the TPU API says so."""
    return any(h.state == "gone" or h.state == "exited" and not 0 <= (h.exit_code or 0) < 128
               for h in hosts.values())


def selected_workers(job: JobState) -> list[int]:
    """The ranks of the hosts the command runs on: `command.workers` within every slice (a
    one-slice job's ranks are its worker ids)."""
    workers = (job.spec.get("command") or {}).get("workers", "all")
    if workers == "all" or workers is None:
        return list(range(max(len(job.hosts), 1)))
    wanted = [workers] if isinstance(workers, int) else sorted(int(w) for w in workers)
    if not slices.multislice(job):
        return wanted
    chosen = set(wanted)
    return [rank for rank, h in enumerate(job.hosts) if h.get("worker") in chosen]


def _cause_when_tpu_gone(job: JobState) -> str | None:
    """A host that vanished, a command killed by a signal, or a setup that failed, on a TPU
    that now reads PREEMPTED (or is gone) was the preemption seen first from the host's
    side: the step raced the TPU API. Judge it by the preemption rule, not the failure rule."""
    err = job.last_error or {}
    if err.get("kind") in ("lost_host", "setup") or err.get("kind") == "exit" and (err.get("exit_code") or 0) >= 128:
        return "preempted"
    return None


def _recover(job: JobState, *, tpu_usable: bool, cause: str | None = None, obs: Observed | None = None) -> Action:
    # The failure being answered is the last one recorded (`last_error` may since have been
    # replaced by a rejected spec update, which is no failure of the attempt).
    kind = cause or (job.failures[-1]["kind"] if job.failures else "failure")
    d = decide(job.spec, kind, job.restarts, tpu_usable=tpu_usable)
    if d.rule in ("pass", "exhausted"):
        # Final: the event says what ended the job (`kind`) and why nothing follows (`rule`).
        return _record(job, ev.Failed(
            kind=kind, final=True, rule=d.rule, message=d.message,
            history=ev.history(job.failures), attempt=job.attempt,
        ))
    params = {
        "kind": kind, "rule": d.rule, "reapply": d.reapply, "resume": d.resume,
        "attempt": job.attempt + 1, "restarts": job.restarts + 1, "tpu": job.tpu,
        "stop": (tpu_usable or admission.given_back(job) or slices.multislice(job)) and _may_run(job),
    }
    return Action("recover", job.id, _surviving(job, params, obs), d.message)


def _surviving(job: JobState, params: dict[str, Any], obs: Observed | None) -> dict[str, Any]:
    """A multislice job whose slice was lost stops its command on the slices still up only
    (`stop_slices`): the lost one has no host to reach."""
    if params.get("stop") and slices.multislice(job) and obs is not None and job.tpu is not None:
        params["stop_slices"] = slices.alive(job.tpu, obs.nodes)
    return params


def _release(job: JobState, reason: str, *, next_step: str = "", obs: Observed | None = None) -> Action | None:
    if job.tpu is None:
        return None
    return Action("release", job.id, _surviving(job, {"tpu": job.tpu, "next": next_step, "stop": _may_run(job)}, obs), reason)


def _may_run(job: JobState) -> bool:
    """Could the job's command still be running on reachable hosts? Then stop it first.
    A preempted TPU has no processes left and no host to reach; a multislice TPU with one
    slice preempted has its other slices still running."""
    if not job.hosts or job.state == fold.FINISHED:
        return False
    return (job.last_error or {}).get("kind") != "preempted" or admission.given_back(job) \
        or slices.multislice(job)


def _record(job: JobState, *events: ev.EventData) -> Action:
    """An action that only appends what was observed or decided: no effect outside the ledger."""
    return Action("record", job.id, {"events": list(events)}, events[0].event_type)


def _resolve(job: JobState, obs: Observed, config: PlanConfig, adopted: bool = False) -> Action | None:
    """An intent without an outcome: ours from before a restart, or a dead peer's after its
    lease ran out. Someone else's fresh intent means that job is being acted on: hands off."""
    intent = job.pending_action or {}
    if intent.get("holder") != config.holder and not adopted:
        since = _age(job, "action_intent", obs.now)
        if since is not None and since < config.intent_timeout_s:
            return None
    return Action("resolve", job.id, {"intent": intent}, "an intent has no outcome")


def collect_orphans(jobs: Mapping[str, JobState], obs: Observed, config: PlanConfig,
                    settled: Settled | None = None) -> list[Action]:
    """Delete the nodes of ours no job holds. `jobs`: those a pass plans (a settled job
    holds nothing and asks nothing); `settled`: the jobs left out of them, asked only when
    some node is held by none of `jobs`: a settled job may have released it within the grace
    period, and an orphan is recorded on the job its label names."""
    if not obs.nodes:
        return []
    cutoff = release_cutoff(obs.now, config)
    held: set[str] = set()
    for j in jobs.values():  # one loop over the jobs for the three kinds of node held
        if j.tpu:
            held.update((j.tpu["name"], *slice_nodes(j.tpu)))
        _recently_released(j, cutoff, held)
        # A provisioning intent names its node before the node exists: never collect it.
        if j.pending_action and (tpu := (j.pending_action.get("params") or {}).get("tpu")):
            held.update((tpu.get("name", ""), *slice_nodes(tpu)))

    def unheld() -> list[NodeObs]:
        return [n for n in obs.nodes.values()
                if n.name not in held and naming.is_managed(n.labels) and n.state != "DELETING"
                and obs.now - n.create_time >= config.orphan_grace_s]

    orphans = unheld()
    if orphans and settled is not None:
        held.update(settled.released_since(cutoff))
        orphans = unheld()
    if not orphans:
        return []
    # Which job a label names: only worth hashing every job when there is an orphan.
    by_label = {naming.job_label(j): j.id for j in jobs.values()}
    actions, seen = [], set()
    for node in orphans:
        label = node.labels.get(naming.LABEL_JOB_HASH, "")
        owner = by_label.get(label) or (settled.job_of_label(label) if settled is not None else None) or "_orphans"
        # A node a queued resource asked for goes with it: deleting the node alone would
        # leave the queued resource (for a multislice one, with every other slice).
        if node.queued_resource:
            tpu = {"name": node.queued_resource, "zone": node.zone, "kind": "queued_resource", "shared": False}
        else:
            tpu = {"name": node.name, "zone": node.zone, "kind": "node", "shared": False}
        if (tpu["zone"], tpu["name"]) not in seen:
            seen.add((tpu["zone"], tpu["name"]))
            actions.append(Action("collect_orphan", owner, {"tpu": tpu, "labels": node.labels}, "no live job holds it"))
    return actions


def release_cutoff(now: float, config: PlanConfig) -> str:
    """A release after this time is within the orphan grace period. ISO UTC times compare
    as text: one cutoff per pass, no parsing per job."""
    return format_time(datetime.fromtimestamp(now - config.orphan_grace_s, UTC))


def _recently_released(job: JobState, cutoff: str, held: set[str]) -> None:
    """A node released after `cutoff` (within the grace period) is being deleted by its
    job, not orphaned: counted held."""
    for name, when in job.released:
        if when > cutoff:
            held.add(name)


def _release_refused_lately(job: JobState, obs: Observed, config: PlanConfig) -> bool:
    """The TPU API refused for good to delete the TPU the job holds (its `last_error` says
    what to grant), less than `release_refused_retry_s` ago: the release waits for the next try."""
    if job.tpu is None or (job.last_error or {}).get("kind") != "release":
        return False
    age = _age(job, "action_outcome", obs.now)
    return age is not None and age < config.release_refused_retry_s


def _age(job: JobState, event_type: str, now: float) -> float | None:
    stamp = job.times.get(event_type)
    return None if not stamp else now - parse_time(stamp).timestamp()


def queued_resource_zones(jobs: Mapping[str, JobState]) -> set[str]:
    """Zones where a live job uses (or may ask for, on any of its choices) a queued
    resource: only there is listing queued resources worth an API call."""
    zones = set()
    seen: dict[int, tuple] = {}  # choice lists are interned (spec.placements): each looked at once (kept: ids stay theirs)
    for j in jobs.values():
        if (j.terminal or j.state == fold.BLOCKED) and j.tpu is None:
            continue
        tpu = j.tpu or {}
        if tpu.get("kind") == "queued_resource":
            zones.add(tpu.get("zone", ""))
        elif not tpu and id(choices := placements(j.spec)) not in seen:
            seen[id(choices)] = choices
            zones.update(c.zone for c in choices if c.queued)
    return zones


def zones_in_use(jobs: Mapping[str, JobState]) -> set[str]:
    """Zones worth listing: where a job holds a TPU, or a live job may ask for one (every
    zone of its choices: the placement step may pick any; a blocked job asks nothing until
    it is unblocked)."""
    zones = set()
    seen: dict[int, tuple] = {}  # choice lists are interned (spec.placements): each looked at once (kept: ids stay theirs)
    for j in jobs.values():
        if j.tpu and j.tpu.get("zone"):
            zones.add(j.tpu["zone"])
        elif not j.terminal and j.state != fold.BLOCKED:
            choices = placements(j.spec)
            if choices:
                if id(choices) not in seen:
                    seen[id(choices)] = choices
                    zones.update(c.zone for c in choices if c.zone)
            elif (j.spec.get("tpu") or {}).get("zone"):
                zones.add(j.spec["tpu"]["zone"])
    return zones


def unseen_creates(jobs: Mapping[str, JobState], obs: Observed) -> list[str]:
    """The operations of creates whose TPU the listing of an observed zone does not show:
    asking them says whether the create failed, and why (a stockout, a permission)."""
    return sorted(
        j.operation for j in jobs.values()
        if j.state == fold.PROVISIONING and j.operation and j.tpu and not j.pending_action
        and j.tpu.get("kind") != "queued_resource" and j.tpu.get("zone") in obs.zones and j.tpu["name"] not in obs.nodes
    )
