"""Carry out one planned action and record it: intent before, outcome after.

The intent is appended with the job stream's expected version and a key derived from that
version, so of two reconcilers that planned the same step only one acts. Outcome events carry
keys derived from the intent's id, so a retried outcome append stores nothing twice.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

from ledger import fold
from ledger.errors import ConflictError, LedgerError
from ledger.events import NewEvent, actor, event_id
from ledger.events import data as ev
from ledger.failures import ApiFailure, status, summary
from ledger.fold import JobState
from ledger.placement import slice_nodes, slices_of
from ledger.spec.placement import placed_spec
from ledger.store import Recorder
from reconciler import naming, react, slices
from reconciler.model import NODE_GONE_STATES, Action
from reconciler.remote.errors import HostUnreachable, RemoteError
from reconciler.tpu import CreateRequest, TpuApi, TpuCallError

log = logging.getLogger("tpu_ledger.reconciler")

# Fault injection for crash tests: LEDGER_FAULT_CRASH="start:effect" kills this process with
# SIGKILL right after the start's effect, before its outcome is recorded ("KIND:intent" kills
# right after the intent). Read once; unset in normal use.
_CRASH_AT = frozenset(filter(None, os.environ.get("LEDGER_FAULT_CRASH", "").split(",")))


def _crash_point(kind: str, point: str) -> None:
    if f"{kind}:{point}" in _CRASH_AT:
        log.warning("LEDGER_FAULT_CRASH: killing myself at %s:%s", kind, point)
        os.kill(os.getpid(), signal.SIGKILL)

Events = list[ev.EventData]


class Refused(LedgerError):
    """The API refused the action; `events` record what that means (reconciler.react)."""

    def __init__(self, failure: ApiFailure, events: Events) -> None:
        super().__init__(summary(failure))
        self.failure = failure
        self.events = events


def _pairs(events: Events) -> list[tuple[str, dict]]:
    return [(d.event_type, d.to_builtins()) for d in events]


class Runner(Protocol):
    """What the executor needs of the remote runner (reconciler.remote.RemoteRunner)."""

    def setup(self, job_id: str, attempt: int, hosts: list[Any], spec: dict, *, workers: list[int] | None = None) -> Any: ...
    def start(self, job_id: str, attempt: int, hosts: list[Any], spec: dict, *, extra_args: list[str], resume: bool,
              placed: Any = None) -> dict[int, int]: ...
    def probe(self, job_id: str, attempt: int, hosts: list[Any], *, workers: list[int] | None = None) -> dict[int, Any]: ...
    def stop(self, job_id: str, attempt: int, hosts: list[Any], *, grace: float = 10, once: bool = False) -> Any: ...


class Executor:
    def __init__(
        self,
        store_for_thread: Callable[[], Recorder],
        tpu: TpuApi,
        runner: Runner,
        *,
        holder: str,
        ssh_user: str,
        ssh_public_key: str | Callable[[str], str],
        hosts_of: Callable[[JobState], list[Any]],
        extra_args_of: Callable[[dict], list[str]],
        stop_grace_s: float = 10.0,
        forget_job_key: Callable[[str], object] | None = None,
    ) -> None:
        self.store = store_for_thread
        self.tpu = tpu
        self.runner = runner
        self.holder = holder
        self.ssh_user = ssh_user
        self.ssh_public_key = ssh_public_key
        self.hosts_of = hosts_of
        self.extra_args_of = extra_args_of
        self.stop_grace_s = stop_grace_s
        # Deletes a job's own SSH key once the job has ended and its TPU is released
        # (reconciler.keys.JobKeys.forget): ended jobs leave no private key behind.
        self.forget_job_key = forget_job_key
        self.actor = actor("reconciler", holder)
        # Host checks before every start (reconciler.doctor.Gate; wiring sets it): (store, job,
        # hosts, actor) -> (health, what cannot be repaired or None).
        self.doctor: Callable[[Any, JobState, list[Any], dict], tuple[str, str | None]] | None = None
        # Told of every TPU API failure an action meets, with its job (the loop backs the zone,
        # or that job's actions, off).
        self.on_api_failure: Callable[[str, ApiFailure], None] | None = None

    # -- entry ----------------------------------------------------------------------------
    def execute(self, action: Action, job: JobState | None) -> str:
        kind = action.kind
        if kind == "record":
            assert job is not None
            return self._record(job, action.params["events"])
        if kind == "mark_provisioned":
            assert job is not None
            return self._record(job, self._provisioned(action.params["tpu"]))
        if kind == "collect_orphan":
            return self._collect_orphan(action)
        assert job is not None
        if kind == "resolve":
            return self._resolve(job, action.params["intent"])
        effect = self._effect(kind, job, action.params)
        extra: Events = [ev.SetupStarted(attempt=job.attempt)] if kind == "setup" else []
        return self._with_intent(job, kind, action.params, action.reason, effect, extra)

    # -- recording ------------------------------------------------------------------------
    def _record(self, job: JobState, events: Events) -> str:
        if (bad := fold.illegal(job, _pairs(events))) is not None:
            log.error("not recording %s for %s: the transition table forbids %s (a bug in the planner)",
                      ", ".join(d.event_type for d in events), job.id, bad)
            return f"refused to record {bad}"
        news = [NewEvent(d.event_type, d, self.actor, key=f"v{job.version}:{i}:{d.event_type}") for i, d in enumerate(events)]
        try:
            res = self.store().append(job.id, news, expected_version=job.version)
        except ConflictError:
            return "skipped: the job moved on"
        return "duplicate" if res.duplicate else "recorded " + ", ".join(d.event_type for d in events)

    def _with_intent(
        self, job: JobState, kind: str, params: dict, reason: str,
        effect: Callable[[], Events], extra: Events,
    ) -> str:
        key = f"v{job.version}:{kind}"
        action_id = event_id(job.id, key)
        intent = NewEvent(
            "action_intent",
            ev.ActionIntent(action_id=action_id, action=kind, params=params, holder=self.holder, reason=reason),
            self.actor, key=key,
        )
        extras = [NewEvent(d.event_type, d, self.actor, key=f"{action_id}:pre:{d.event_type}") for d in extra]
        try:
            res = self.store().append(job.id, [intent, *extras], expected_version=job.version)
        except ConflictError:
            return "skipped: another writer acted first"
        if res.duplicate:
            return "skipped: this intent is already recorded"
        _crash_point(kind, "intent")
        after = job
        for d in extra:
            after = fold.evolve(after, d.event_type, d.to_builtins())
        return self._complete(after, action_id, kind, effect)

    def _complete(self, job: JobState, action_id: str, kind: str, effect: Callable[[], Events]) -> str:
        """Run the effect and record its outcome and events. `job` is the state the effect
        was decided on (after its intent): its events must be legal from there."""
        job_id = job.id
        try:
            events, outcome = effect(), ev.ActionOutcome(action_id=action_id, action=kind, ok=True)
        except Refused as exc:  # the API said no, and what that means is recorded
            events, outcome = exc.events, ev.ActionOutcome(action_id=action_id, action=kind, ok=False,
                                                           error=str(exc)[:2000], api=status(exc.failure))
        except TpuCallError as exc:  # the API failed: the loop backs off; nothing else to record
            self._api_failed(job_id, exc.failure)
            events, outcome = [], ev.ActionOutcome(action_id=action_id, action=kind, ok=False,
                                                   error=str(exc)[:2000], api=status(exc.failure))
        except LedgerError as exc:
            events, outcome = [], ev.ActionOutcome(action_id=action_id, action=kind, ok=False, error=str(exc))
        except Exception as exc:  # an adapter failed in a way we did not foresee: record it, go on
            log.exception("action %s on %s failed", kind, job_id)
            events, outcome = [], ev.ActionOutcome(action_id=action_id, action=kind, ok=False, error=f"{type(exc).__name__}: {exc}")
        if events and (bad := fold.illegal(job, _pairs(events))) is not None:
            log.error("not recording %s for %s: the transition table forbids %s (a bug in reconciler.react)",
                      ", ".join(d.event_type for d in events), job_id, bad)
            events, outcome = [], ev.ActionOutcome(action_id=action_id, action=kind, ok=False, error=f"not recorded: {bad}")
        _crash_point(kind, "effect")
        news = [NewEvent("action_outcome", outcome, self.actor, key=f"{action_id}:outcome")]
        news += [NewEvent(d.event_type, d, self.actor, key=f"{action_id}:{i}:{d.event_type}") for i, d in enumerate(events)]
        self.store().append(job_id, news)
        recorded = ", ".join(d.event_type for d in events)
        return f"done {recorded}" if outcome.ok else f"failed: {outcome.error}" + (f"; recorded {recorded}" if recorded else "")

    # -- effects --------------------------------------------------------------------------
    def _effect(self, kind: str, job: JobState, p: dict, *, taken_up: bool = False) -> Callable[[], Events]:
        effects: dict[str, Callable[[], Events]] = {
            "provision": lambda: self._provision(job, p),
            "setup": lambda: self._setup(job),
            "start": lambda: self._start(job, p),
            "release": lambda: self._release(job, p, taken_up),
            "cancel": lambda: self._cancel(job, p, taken_up),
            "recover": lambda: self._recover(job, p, taken_up),
            "restart": lambda: self._recover(job, p, taken_up),
        }
        return effects[kind]

    def _provision(self, job: JobState, p: dict) -> Events:
        tpu = p["tpu"]
        want = placed_spec(job.spec, int(tpu.get("placement", 0) or 0)).get("tpu") or {}  # the choice planned
        metadata = {str(k): str(v) for k, v in (want.get("metadata") or {}).items()}
        # a callable gives each job a key of its own (reconciler.keys.JobKeys.public)
        key = self.ssh_public_key(job.id) if callable(self.ssh_public_key) else self.ssh_public_key
        metadata["ssh-keys"] = f"{self.ssh_user}:{key}"
        if want.get("startup_script"):
            metadata["startup-script"] = str(want["startup_script"])
        req = CreateRequest(
            zone=tpu["zone"], name=tpu["name"], accelerator=tpu["accelerator"],
            runtime=want.get("version") or "", pricing=tpu.get("pricing") or want.get("pricing", "ondemand"),
            labels=naming.labels(job.id, naming.submission(job), job.owner, p["attempt"]),
            metadata=metadata, tags=tuple(want.get("tags") or ()), reservation=want.get("reservation") or "",
            network=want.get("network"), queued=tpu["kind"] == "queued_resource",
            slices=slices_of(tpu), wait_s=p.get("wait_s"),
        )
        try:
            answer = self.tpu.create(req)
        except TpuCallError as exc:
            events = react.refused(job, tpu, exc.failure)
            if not events:  # transient: nothing to record but the outcome; the loop backs off
                raise
            if any(isinstance(d, ev.ProvisionFailed) for d in events):
                self._forget_key(job.id)  # blocked with no TPU: its key was made for nothing (a resume makes another)
            raise Refused(exc.failure, events) from None
        return react.provisioned(job, p, answer)

    def _api_failed(self, job_id: str, failure: ApiFailure) -> None:
        if self.on_api_failure is not None:
            self.on_api_failure(job_id, failure)

    def _provisioned(self, tpu: dict) -> Events:
        """The hosts of every slice, slice by slice, each with its pinned host key."""
        names = slice_nodes(tpu)
        hosts: list[dict[str, Any]] = []
        for s, name in enumerate(names):
            node = self.tpu.get_node(tpu["zone"], name)
            if node is None:
                return []
            keys = self.tpu.host_keys(tpu["zone"], name)
            within = {"slice": s} if len(names) > 1 else {}
            hosts += [{**h, **within, "host_key": keys[i] if i < len(keys) else None} for i, h in enumerate(node.hosts)]
        return [ev.Provisioned(tpu=ev.tpu(tpu), hosts=ev.hosts(hosts))]

    def _setup(self, job: JobState) -> Events:
        # Every host of every slice, in parallel, with the settings of the choice it is on.
        report = self.runner.setup(job.id, job.attempt, self.hosts_of(job), slices.spec_of(job))
        if getattr(report, "ok", False):
            return [ev.SetupDone(attempt=job.attempt)]
        if (gone := self._tpu_gone(job, "setup could not finish")) is not None:
            return gone
        failures = list(getattr(report, "failures", []) or [])
        rank, module, message = failures[0] if failures else (None, "", "setup failed")
        where = slices.host(job, rank) if isinstance(rank, int) else {"worker": rank}
        return [ev.SetupFailed(attempt=job.attempt, **where, module=module,  # type: ignore[arg-type]
                               reason=str(message)[:2000], final=False)]

    def _start(self, job: JobState, p: dict) -> Events:
        health = None
        if self.doctor is not None:
            health, problem = self.doctor(self.store(), job, self.hosts_of(job), self.actor)
            if problem:
                return [ev.Failed(kind="host_unhealthy", message=f"host checks: {problem}"[:2000], attempt=job.attempt)]
        spec = slices.spec_of(job)  # the choice's own args and settings
        try:
            pids = self.runner.start(
                job.id, job.attempt, self.hosts_of(job), spec,
                extra_args=self.extra_args_of(spec), resume=bool(p.get("resume")), placed=slices.placed_of(job),
            )
        except HostUnreachable as exc:  # the host died under us: the API says whether it was preempted
            gone = self._tpu_gone(job, "could not start")
            return gone or [ev.Failed(kind="lost_host", message=f"could not start: {exc}"[:2000], attempt=job.attempt)]
        except RemoteError as exc:  # the runner already retried what was transient
            return [ev.Failed(kind="failure", message=f"could not start: {exc}"[:2000], attempt=job.attempt)]
        return [ev.Started(attempt=job.attempt, workers=sorted({slices.host(job, r)["worker"] for r in pids}),
                           pids={slices.host_key(job, r): pid for r, pid in pids.items()},
                           resume=bool(p.get("resume")), spec_hash=job.spec_hash,
                           **({"health": health} if health else {}))]

    def _tpu_gone(self, job: JobState, what: str) -> Events | None:
        """A step on the hosts failed: ask the TPU API before choosing the kind, so a TPU
        preempted under the step is recorded as a preemption, not as the step's failure."""
        tpu = job.tpu or {}
        zone = tpu.get("zone", "")
        try:  # every slice's node: a multislice TPU has none of its own name
            nodes = {n: node for n in slice_nodes(tpu) if (node := self.tpu.get_node(zone, n)) is not None}
        except Exception as exc:  # the API cannot say: the step's own failure stands
            log.warning("could not read %s after a failed step: %s", tpu.get("name"), exc)
            return None
        node, lost = slices.observe(tpu, nodes)
        if node is not None and node.state not in NODE_GONE_STATES:
            return None
        return [slices.lost_event(tpu, node, lost, job.attempt, what)]

    def _stop(self, job: JobState, kind: str, p: dict) -> None:
        if not p.get("stop"):
            return
        hosts = self.hosts_of(job)
        if p.get("stop_slices") is not None:  # a slice was lost: only the others have a command to stop
            keep = set(p["stop_slices"])
            hosts = [h for h in hosts if getattr(h, "slice", 0) in keep]
        try:
            # A TPU deleted next: a host that does not answer at once (a lost host, the usual
            # reason for a reapply) is not dialled again and again; each reachable one still
            # gets its grace. Those retries took ~10 s of every such release under chaos.
            self.runner.stop(job.id, job.attempt, hosts, grace=self.stop_grace_s, once=deletes_tpu(kind, p))
        except Exception as exc:  # best effort: the TPU is deleted next anyway
            log.warning("could not stop %s attempt %s: %s", job.id, job.attempt, exc)

    def _delete(self, tpu: dict | None, *, taken_up: bool = False) -> bool:
        """Delete a TPU of the job's own. `taken_up`: a dead process may have asked already,
        so look first: a node gone or DELETING is awaited, not deleted again (Google answers
        a second delete of a DELETING node with an error, which would fail the release). A
        queued resource is looked at as itself: a multislice one has no node of its name."""
        if not tpu or tpu.get("shared"):
            return False  # a shared TPU is handed back, never deleted
        queued = tpu.get("kind") == "queued_resource"
        zone, name = tpu["zone"], tpu["name"]
        if taken_up:
            state = self.tpu.state_of(zone, name, queued=queued)
            if state == "DELETING" and self.tpu.await_gone(zone, name, queued=queued):
                return True
            if state is None and not queued:  # a queued resource's node may outlive it: delete asks
                return False
        return self.tpu.delete(zone, name, queued=queued)

    def _release(self, job: JobState, p: dict, taken_up: bool = False) -> Events:
        self._stop(job, "release", p)
        self._delete(p["tpu"], taken_up=taken_up)
        if not p.get("next"):  # the job has ended (a retry or reapply makes a TPU with the same key)
            self._forget_key(job.id)
        return react.released(job, p)

    def _forget_key(self, job_id: str) -> None:
        if self.forget_job_key is None:
            return
        try:
            self.forget_job_key(job_id)
        except OSError as exc:  # a key left behind must not fail (and so repeat) the release
            log.warning("could not delete the SSH key of %s: %s", job_id, exc)

    def _cancel(self, job: JobState, p: dict, taken_up: bool = False) -> Events:
        self._stop(job, "cancel", p)
        events: Events = []
        if p.get("tpu"):
            self._delete(p["tpu"], taken_up=taken_up)
            events.append(ev.Released(tpu=ev.tpu(p["tpu"]), reason="cancelled", deleted=not p["tpu"].get("shared")))
        self._forget_key(job.id)  # with or without a TPU: a queued job may have made its key
        events.append(ev.Cancelled(reason="cancel requested"))
        return events

    def _recover(self, job: JobState, p: dict, taken_up: bool = False) -> Events:
        self._stop(job, "recover", p)
        events: Events = []
        if p.get("reapply") and p.get("tpu"):
            self._delete(p["tpu"], taken_up=taken_up)
            events.append(ev.Released(tpu=ev.tpu(p["tpu"]), reason="reapply", deleted=not p["tpu"].get("shared")))
        rule = p["rule"]
        again = ev.Rerun if rule == "rerun" else ev.Resumed
        events.append(again(attempt=p["attempt"], restarts=p.get("restarts", job.restarts), rule=rule,
                            reapply=bool(p.get("reapply")), kind=p.get("kind", rule)))
        return events

    def _collect_orphan(self, action: Action) -> str:
        tpu = action.params["tpu"]
        self.tpu.delete(tpu["zone"], tpu["name"], queued=tpu.get("kind") == "queued_resource")
        released = ev.Released(tpu=ev.tpu(tpu), reason="orphan", labels=action.params.get("labels", {}), deleted=True)
        self.store().append(action.job_id, [NewEvent("released", released, self.actor, key=f"orphan:{tpu['zone']}:{tpu['name']}")])
        return f"collected orphan {tpu['name']}"

    # -- crash repair ---------------------------------------------------------------------
    def _resolve(self, job: JobState, intent: dict) -> str:
        """An intent with no outcome: look at reality, never repeat blindly."""
        kind, p, action_id = intent.get("action"), intent.get("params") or {}, intent["action_id"]
        if kind == "provision":
            tpu = p["tpu"]
            if self.tpu.state_of(tpu["zone"], tpu["name"], queued=tpu["kind"] == "queued_resource") is not None:
                return self._complete(job, action_id, kind, lambda: [ev.Provisioning(attempt=p["attempt"], tpu=ev.tpu(tpu), how="adopted")])
            return self._interrupted(job.id, action_id, kind, "the TPU was never created")
        if kind == "start":
            status = self.runner.probe(job.id, job.attempt, self.hosts_of(job))
            if any(getattr(s, "state", "") in ("running", "exited") for s in status.values()):
                return self._complete(job, action_id, kind, lambda: [ev.Started(
                    attempt=job.attempt, workers=sorted(status), resume=bool(p.get("resume")),
                    spec_hash=job.spec_hash, how="found running after a restart")])
            return self._interrupted(job.id, action_id, kind, "the command never started")
        if kind == "clean":
            # The host checks look again before the start that follows; nothing to repeat.
            return self._interrupted(job.id, action_id, kind, "host repairs were interrupted; the checks run again")
        if kind == "setup":
            # Setup modules check before they act, so running them again is safe.
            return self._interrupted(job.id, action_id, kind, "setup was interrupted; it runs again")
        # Releasing, cancelling and recovering: finish the action under the same intent, from
        # where it stands (taken_up: a delete under way is awaited, not started again).
        return self._complete(job, action_id, kind, self._effect(kind, job, as_taken_up(kind, p), taken_up=True))

    def _interrupted(self, job_id: str, action_id: str, kind: str, why: str) -> str:
        outcome = ev.ActionOutcome(action_id=action_id, action=kind, ok=False, interrupted=True, error=why)
        self.store().append(job_id, [NewEvent("action_outcome", outcome, self.actor, key=f"{action_id}:outcome")])
        return f"resolved {kind}: {why}"


def as_taken_up(kind: str, p: dict) -> dict:
    """The params of an action a dead process left under way, as the next one carries it on.
    A TPU of the job's own that the action deletes is not stopped first again: the dead
    process had its grace period, and the delete ends what still runs there. Under a crash
    loop a fresh stop (seconds of SSH) per process would keep the release from ever ending."""
    return {**p, "stop": bool(p.get("stop")) and not deletes_tpu(kind, p)}


def deletes_tpu(kind: str, p: dict) -> bool:
    """The action deletes a TPU of the job's own once its command is stopped: a release, a
    cancel, or a recovery that reapplies."""
    tpu = p.get("tpu") or {}
    return bool(tpu) and not tpu.get("shared") and (kind in ("release", "cancel") or bool(p.get("reapply")))
