"""The reconcile loop: catch up on the ledger, observe, plan, act — again and again.

Actions run on a small thread pool, at most one per job at a time, so a long setup on one
pod never delays noticing a preemption on another. Every thread has its own store
connection. The loop sleeps until a new event is appended or the interval passes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ledger import defaults, logcontext
from ledger.capacity import CapacityMemory
from ledger.capacity_snapshot import due_blob, load_capacity, save_blob
from ledger.events import NewEvent, actor, format_time, parse_time
from ledger.events import data as ev
from ledger.failures import ApiFailure, from_status, kind_of, status, summary
from ledger.fold import JobState, LedgerState
from ledger.observers import Observers
from ledger.placement import slice_nodes
from ledger.replay import fold_into, fold_rows, save_snapshot, state_due
from ledger.spec.policy import Policy
from ledger.store import Store, open_store
from ledger.usage import UsageFold
from ledger.usage.prices import POLICY_STREAM
from ledger.usage.share import ShareMeter
from ledger.usage.snapshot import UsageBody, due_body, load_usage, save_body
from reconciler import admission, slices
from reconciler.executor import Executor, Runner
from reconciler.health import Change, ZoneHealth
from reconciler.live import LiveJobs
from reconciler.membership import JOB_PREFIX, Membership
from reconciler.model import NODE_READY, Action, HostObs, NodeObs, Observed, PlanConfig
from reconciler.plan import (
    api_zone,
    plan,
    queued_resource_zones,
    release_cutoff,
    resolutions,
    selected_workers,
    suspect,
    unseen_creates,
    zones_in_use,
)
from reconciler.settle import awaiting
from reconciler.shelf import FrozenShelf, Shelf
from reconciler.tpu import TpuApi, TpuCallError

log = logging.getLogger("tpu_ledger.reconciler")


def zone_of(resource: str) -> str:
    """The zone of an API resource name (projects/P/locations/ZONE/...), or ""."""
    parts = resource.split("/")
    return parts[3] if len(parts) > 3 and parts[2] == "locations" else ""


def recheck_suspects(
    jobs: Mapping[str, JobState], obs: Observed, get_node: Callable[[str, str], NodeObs | None],
    since: Mapping[str, float],
) -> dict[str, float]:
    """The probe saw a worker of a job die: ask the TPU API about that job's node now, after
    the probe, so the planner chooses the failure kind from what the API says (a preemption
    the host noticed first is still recorded as a preemption). Updates `obs` in place and
    returns when each suspect was first seen, for the next pass."""
    first_seen: dict[str, float] = {}
    for job_id, hosts in list(obs.hosts.items()):
        job = jobs.get(job_id)
        if job is None or not job.tpu or not suspect(hosts):
            continue
        first_seen[job_id] = since.get(job_id, obs.now)
        for name in slice_nodes(job.tpu):  # every slice's node: any may be the one lost
            try:
                node = get_node(job.tpu.get("zone", ""), name)
            except Exception as exc:  # the API cannot say why: conclude nothing from the probe
                log.warning("could not re-read %s after its worker died: %s", name, exc)
                obs.hosts.pop(job_id, None)
                break
            if node is None:
                obs.nodes.pop(name, None)
            else:
                obs.nodes[name] = node
    obs.suspect_since = dict(first_seen)
    return first_seen


def ended_backoffs(keys: Iterable[str], jobs: Mapping[str, JobState], obs: Observed) -> list[str]:
    """The backoff keys nothing will be tried for again, so the map of backed-off actions
    stays as small as what may still act: a job that ended and holds no TPU (or that the
    ledger no longer knows), an orphan TPU (`orphan:<name>`) its zone's listing no longer shows."""
    out = []
    for key in keys:
        if key.startswith("orphan:"):
            name = key.removeprefix("orphan:")
            if obs.zones and name not in obs.nodes and name not in obs.queued:
                out.append(key)
            continue
        job = jobs.get(key)
        if job is None or job.terminal and job.tpu is None:
            out.append(key)
    return out


class Reconciler:
    def __init__(
        self,
        store_url: str,
        tpu: TpuApi,
        runner: Runner,
        *,
        holder: str,
        ssh_user: str,
        ssh_public_key: str | Callable[[str], str],
        hosts_of: Callable[[Any], list[Any]],
        extra_args_of: Callable[[dict], list[str]],
        interval: float = 2.0,
        config: PlanConfig | None = None,
        workers: int = 8,
        on_action: Callable[[Action, str], None] | None = None,
        lease_ttl: float = 0.0,
        policy_source: Callable[[], Policy | None] | None = None,
        forget_job_key: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`policy_source`: asked at every pass for the sharing policy in force (a file that
        an admin may change); None keeps `config.policy` for good. `clock`: the time a pass
        plans at (epoch seconds), one place, so a simulation can drive a day of passes."""
        self.clock = clock
        self.store_url = store_url
        self.tpu = tpu
        self.runner = runner
        self.interval = interval
        self.config = config or PlanConfig(holder=holder)
        self.hosts_of = hosts_of
        self.on_action = on_action or (lambda action, result: log.info("%s %s: %s", action.kind, action.job_id, result))
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._snapshotter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        self._saving: Future[None] | None = None  # the snapshots being saved, if any
        self._in_flight: dict[str, Future[str]] = {}
        self._lock = threading.Lock()
        self.live = LiveJobs()  # the fold, holding the jobs a pass walks (the settled ones on its shelf)
        # Past stockouts, lab-wide (ledger.capacity): folded from the same rows as the jobs.
        self.capacity = CapacityMemory()
        # With leases, several reconcilers share the jobs; without, this one acts on all
        # (two of them are still fenced by the ledger's expected versions).
        self.membership = None
        if lease_ttl > 0:
            self.membership = Membership(store_url, holder, lease_ttl)
        self._caught_up_once = False
        # Fair share and weekly quotas need recent usage: the usage fold, fed the same tail.
        self.usage: UsageFold | None = None
        self._usage_cache: tuple[tuple, float, admission.Usage] | None = None  # recent_usage's last answer
        self.policy_source = policy_source
        self._follow_policy(self.config.policy)
        self._suspect_since: dict[str, float] = {}
        self._zones: tuple[int, list[str], set[str]] = (-1, [], set())  # (position, zones to list, with queued resources)
        self.last_observed = Observed(now=0.0)
        self.passes = 0
        # Told after every complete pass: (seconds it took, actions it planned). Metrics hook in here.
        self.pass_observers: Observers[[float, list[Action]]] = Observers()
        # Told after snapshots were saved (seconds, True) or could not be (seconds, False).
        self.snapshot_observers: Observers[[float, bool]] = Observers()
        self.executor = Executor(
            self.store, tpu, runner, holder=holder, ssh_user=ssh_user, ssh_public_key=ssh_public_key,
            hosts_of=hosts_of, extra_args_of=extra_args_of, forget_job_key=forget_job_key,
        )
        # Which zones' TPU API answers, and when a failing one is tried next.
        self.health = ZoneHealth()
        # Jobs whose last action the API refused in a way the planner cannot answer: tried
        # again after a jittered backoff capped at a minute (never recorded as an outage).
        self.job_backoff = ZoneHealth(maximum=defaults.TPU_ACTION_BACKOFF_MAX_S, down_after=float("inf"))
        self.executor.on_api_failure = self._api_failed
        self._health_loaded = False
        self._policy_version = -1
        if hasattr(tpu, "on_reconnect"):  # the endpoint came back: try the zones at once
            tpu.on_reconnect(self.health.wake)
        # Set by a new event in the ledger, or by a host whose attempt ended or whose
        # connection dropped (the runner's watchers): the next pass starts at once.
        self._woken = threading.Event()
        if hasattr(runner, "on_change"):
            runner.on_change(lambda job_id: self.wake())

    def wake(self) -> None:
        """Start the next pass now (a host changed: the pass looks, the TPU API decides)."""
        self._woken.set()

    def store(self) -> Store:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = open_store(self.store_url)
        return store

    # -- one pass -------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Snapshot + tail at start, then only the new events: O(events since)."""
        self._catch_up_jobs()
        self._catch_up_usage()

    def _catch_up_jobs(self) -> None:
        store = self.store()
        if not self._caught_up_once:
            self.live.load(store, Shelf)  # the settled jobs on the shelf, never all held at once
            # The memory from its snapshot and the events after it, at the jobs' position.
            self.capacity = load_capacity(store, self.state.position)
            self._caught_up_once = True
        else:
            touched: set[str] = set()
            fold_into(self.state, self.capacity.tee(self.live.folding(fold_rows(store, self.state.position), touched)))
            self.live.refresh(touched)

    def _catch_up_usage(self) -> None:
        # Only admission needs usage. A fresh process (or a new half-life) starts from the
        # usage snapshot and its tail; after that, only the new events.
        if self.usage is None:
            return
        store = self.store()
        if self.usage.position == 0:
            self.meter, self.usage = load_usage(store, self.meter.half_life_hours)
        else:
            self.usage.apply_rows(fold_rows(store, self.usage.position))

    def _keep_snapshots(self) -> None:
        """Every 200 passes, once: the snapshots of the jobs' state, of usage and of the
        capacity memory, when due. They are encoded and saved on a thread of their own, from
        copies later folds never change (`LedgerState.detached`, the shelf's `frozen`, usage's
        `due_body`, capacity's `due_blob`): at 20,000 jobs that takes 2.5 s, which a pass would
        otherwise wait."""
        if self.passes % 200 or not self.snapshot_saved(0):
            return
        usage = None
        if self.usage is not None:
            # copied now: the fold moves on
            usage = due_body(self.store(), self.meter, self.usage, now=int(self.clock() * 1_000_000))
        capacity = due_blob(self.store(), self.capacity)  # encoded now, for the same reason
        # Copied only when due: at 118,956 jobs a copy of the state and the shelf held ~90 MB
        # more for as long as the saver ran, every 200 passes, due or not.
        source = self.snapshot_source() if state_due(self.store(), self.state.position) else None
        if source is not None or usage is not None or capacity is not None:
            self._saving = self._snapshotter.submit(self._save_snapshots, source, usage, capacity)

    @property
    def state(self) -> LedgerState:
        """The jobs' fold at the ledger's head, less the settled jobs (on `live.shelf`)."""
        return self.live.state

    def snapshot_source(self) -> tuple[LedgerState, FrozenShelf]:
        """What the jobs' snapshot is made of now: the state and the shelf of its settled
        jobs (`save_snapshot(store, state, shelved.pieces())`), copies later folds never change."""
        return self.state.detached(), self.live.shelf.frozen()

    def snapshot_saved(self, timeout: float | None = None) -> bool:
        """Wait for the snapshots being saved, if they are (at most `timeout` s); whether none
        is being saved any more."""
        saving = self._saving
        return saving is None or not wait([saving], timeout).not_done

    def _save_snapshots(self, source: tuple[LedgerState, FrozenShelf] | None, usage: UsageBody | None,
                        capacity: tuple[int, bytes] | None = None) -> None:
        started = time.monotonic()
        what = f"the jobs' snapshot at seq {source[0].position}" if source is not None else ""
        try:
            store = open_store(self.store_url)
            try:
                saved = False
                if source is not None:
                    state, shelved = source
                    save_snapshot(store, state, settled=shelved.pieces())
                    saved = True
                if usage is not None:
                    what = f"the usage snapshot at seq {usage.position}"
                    save_body(store, usage)
                    saved = True
                if capacity is not None:
                    what = f"the capacity snapshot at seq {capacity[0]}"
                    save_blob(store, *capacity)
                    saved = True
            finally:
                store.close()
        except Exception as exc:  # a snapshot is a cache: the next one due is tried again
            log.warning("could not save %s: %s", what, exc)
            self.snapshot_observers(time.monotonic() - started, False)
            return
        if saved:
            self.snapshot_observers(time.monotonic() - started, True)

    def _follow_policy(self, policy: Policy | None) -> None:
        """Plan by `policy` from now on; keep the usage fold while the half-life stays."""
        if policy is not self.config.policy:
            self.config = replace(self.config, policy=policy)
        if policy is None or not admission.active(policy):
            self.usage = None
        elif self.usage is None or self.meter.half_life_hours != policy.fair_share.half_life_hours:
            self.meter = ShareMeter(policy.fair_share.half_life_hours)
            self.usage = UsageFold(on_interval=self.meter.add)  # loaded at the next catch-up

    def recent_usage(self, now: float) -> admission.Usage:
        """Fair-share and weekly figures at `now` (nothing without a sharing policy). Made
        again only when the usage fold moved (an event changed what is held), the meter
        changed (a new half-life), or FAIR_SHARE_REFRESH_S passed: between events they
        drift only with the clock, by seconds' worth of chip-hours."""
        if self.usage is None:
            return admission.NO_USAGE
        key = (self.usage.position, self.meter)
        if self._usage_cache is not None and self._usage_cache[0] == key \
                and 0 <= now - self._usage_cache[1] < defaults.FAIR_SHARE_REFRESH_S:
            return self._usage_cache[2]
        us = int(now * 1_000_000)
        figures = admission.usage_at(self.meter, self.usage.open_intervals(us, held=True), us)
        self._usage_cache = (key, now, figures)
        return figures

    # -- the zones' TPU API: backoff, and one record per outage -------------------------------
    def _load_health(self) -> None:
        """A restart during an outage neither records it twice nor forgets to record its end."""
        if self._health_loaded:
            return
        self._health_loaded = True
        last: dict[str, Any] = {}
        for e in self.store().read_stream(defaults.CLOUD_STREAM):
            last[e.data.get("zone", "")] = e
        now = self.clock()
        for zone, e in last.items():
            if e.type == "api_unreachable":
                since = parse_time(e.data["since"]).timestamp() if e.data.get("since") else now
                self.health.recorded_down(zone, from_status(e.data.get("api") or {}), since, now)

    def _api_failed(self, job_id: str, failure: ApiFailure) -> None:
        """An action met a failure of the API: a transient one backs its zone off; any other
        (a delete refused for good, say) backs that job's actions off, so a refusal no
        planning step can fix costs one intent and outcome a step, not one a pass."""
        zone = zone_of(failure.resource)
        if zone and kind_of(failure) == "transient":
            self._record_change(self.health.failed(zone, failure, self.clock()))
        else:
            self.job_backoff.failed(job_id, failure, self.clock())

    def _record_change(self, change: Change | None) -> None:
        if change is None:
            return
        if change.up:
            log.warning("TPU API of zone %s answers again after %.0f s (%d failed calls); carrying on",
                     change.zone, change.down_s, change.calls)
            data: ev.EventData = ev.ApiReachable(zone=change.zone, down_s=round(change.down_s, 3), calls=change.calls,
                                                 holder=self.config.holder)
        else:
            assert change.failure is not None
            log.warning("TPU API of zone %s unreachable: %s; trying again with backoff (at most every %.0f s), "
                        "nothing is decided about its jobs meanwhile", change.zone, summary(change.failure),
                        self.health.maximum)
            data = ev.ApiUnreachable(zone=change.zone, api=status(change.failure), holder=self.config.holder,
                                     since=format_time(datetime.fromtimestamp(change.since, UTC)))
        key = f"{data.event_type}:{change.zone}:{change.since:.6f}:{self.config.holder}"
        try:
            self.store().append(defaults.CLOUD_STREAM, [NewEvent(data.event_type, data, actor("reconciler", self.config.holder), key=key)])
        except Exception as exc:  # the ledger is down too: the log line says it
            log.warning("could not record that zone %s is %s: %s", change.zone, "back" if change.up else "down", exc)

    def observe(self) -> Observed:
        self._load_health()
        obs = Observed(now=self.clock())
        zones = set()
        if self._zones[0] != self.state.position:  # the zones worth listing move only with the jobs
            self._zones = (self.state.position, sorted(zones_in_use(self.live.jobs)), queued_resource_zones(self.live.jobs))
        _, in_use, qr_zones = self._zones
        for zone in in_use:
            if not self.health.may_try(zone, obs.now):
                continue  # backing off: unobserved, so nothing is decided about it
            try:
                nodes = self.tpu.list_nodes(zone)
                queued = self.tpu.list_queued(zone) if zone in qr_zones else []
            except TpuCallError as exc:  # that zone stays unobserved: nothing is concluded about it
                log.debug("could not list zone %s: %s", zone, exc)
                if kind_of(exc.failure) == "permanent":
                    obs.refused[zone] = exc.failure
                self._record_change(self.health.failed(zone, exc.failure, self.clock()))
                continue
            self._record_change(self.health.succeeded(zone, self.clock()))
            zones.add(zone)
            obs.nodes.update({n.name: n for n in nodes})
            obs.queued.update({q.name: q for q in queued})
        obs.zones = frozenset(zones)
        for name in unseen_creates(self.live.jobs, obs):
            try:
                found = self.tpu.operation(name)
            except TpuCallError as exc:
                log.debug("could not read operation %s: %s", name, exc)
                continue
            if found is not None:
                obs.operations[name] = found
        obs.hosts = self._probe_running(obs)
        self._suspect_since = recheck_suspects(self.state.jobs, obs, self.tpu.get_node, self._suspect_since)
        return obs

    def _probe_running(self, obs: Observed) -> dict[str, dict[int, HostObs]]:
        running = [
            j for j in self.live.jobs.values()
            if j.state == "running" and j.tpu and j.id not in self._in_flight
            and (node := slices.observe(j.tpu, obs.nodes)[0]) is not None and node.state == NODE_READY
        ]

        def probe(job: JobState) -> tuple[str, dict[int, HostObs]]:
            with logcontext.about(job.id, job.attempt):
                status = self.runner.probe(job.id, job.attempt, self.hosts_of(job), workers=selected_workers(job))
            return job.id, {
                w: HostObs(s.state, s.exit_code, tuple(sorted(set(s.kinds))), s.error, s.checkpoint) for w, s in status.items()
            }

        results: dict[str, dict[int, HostObs]] = {}
        for fut in [self._pool.submit(probe, j) for j in running]:
            try:
                job_id, hosts = fut.result()
                results[job_id] = hosts
            except Exception as exc:
                log.warning("probe failed: %s", exc)
        return results

    def _follow_policy_time(self) -> None:
        """When the policy was last recorded (the `_policy` stream's newest event): a job the
        TPU API blocked before then is tried again. Read only when that stream moved."""
        store = self.store()
        version = store.stream_version(POLICY_STREAM)
        if version == self._policy_version:
            return
        self._policy_version = version
        newest = store.read_stream(POLICY_STREAM, after_version=max(0, version - 1))
        if newest and newest[-1].time != self.config.policy_since:
            self.config = replace(self.config, policy_since=newest[-1].time)

    def step(self) -> list[Action]:
        """One pass; returns the actions it dispatched."""
        started = time.monotonic()
        self._reap()
        if self.policy_source is not None:
            self._follow_policy(self.policy_source())
        self._follow_policy_time()
        # Unfinished intents first, from the jobs' state alone: under a crash loop a process
        # may not live through the usage fold, the zone listing and the SSH probes.
        self._catch_up_jobs()
        adoptable = self._adoptable()  # once a pass: each asks the lease table for a dead peer's job
        self._take_up_unfinished(adoptable)
        self._catch_up_usage()
        obs = self.last_observed = self.observe()
        self._reap()
        self.catch_up()  # what finished while observing changes what to do
        actions = plan(self.live.jobs, obs, in_flight=list(self._in_flight), config=self.config,
                       taken_over=adoptable, usage=self.recent_usage(obs.now), memory=self.capacity, settled=self.live.shelf)
        self.live.shelf.forget_releases(release_cutoff(obs.now, self.config))
        for action in actions:
            if self._may_act(action):
                self._dispatch(action)
        self._let_go_of_ended_jobs()
        self.job_backoff.forget(ended_backoffs(self.job_backoff.names(), self.state.jobs, obs))
        self._keep_snapshots()
        self.passes += 1
        self.pass_observers(time.monotonic() - started, actions)
        return actions

    def _take_up_unfinished(self, adoptable: list[str]) -> None:
        """Intents without an outcome are taken up before observing: resolving one needs no
        observation of the whole zone (it looks at its own node), and under a crash loop a
        process may not live through a full pass (SSH probes of every running job)."""
        unfinished = {j.id: j for j in self.live.jobs.values() if j.pending_action and j.id not in self._in_flight}
        if not unfinished:
            return
        now = self.clock()
        for action in resolutions(unfinished, now, self.config, adoptable):
            zone = api_zone(action)
            if self._may_act(action) and (zone is None or self.health.may_try(zone, now)):
                self._dispatch(action)

    def _may_act(self, action: Action) -> bool:
        """Another live reconciler holds or should take this job?"""
        return self.membership is None or not action.job_id or action.job_id.startswith("_") \
            or self.membership.may_act(action.job_id)

    def _adoptable(self) -> list[str]:
        """Jobs with another holder's unfinished intent whose lease we could win: that
        holder let it lapse, so it is dead, and the intent is ours to resolve."""
        if self.membership is None:
            return []
        return [
            j.id for j in self.live.jobs.values()
            if j.pending_action and j.pending_action.get("holder") != self.config.holder
            and j.id not in self._in_flight and self.membership.adopt(j.id)
        ]

    def _let_go_of_ended_jobs(self) -> None:
        if self.membership is None:
            return
        for name in self.membership.keeper.held():
            job = self.live.find(name.removeprefix(JOB_PREFIX))
            if name.startswith(JOB_PREFIX) and job is not None and job.terminal and job.tpu is None \
                    and job.id not in self._in_flight:
                self.membership.let_go(job.id)

    def _dispatch(self, action: Action) -> None:
        job = self.live.find(action.job_id)
        job = job.copy() if job is not None else None  # the next catch-up folds in place
        key = action.job_id or f"orphan:{action.params.get('tpu', {}).get('name')}"
        if key in self._in_flight or not self.job_backoff.may_try(key, self.clock()):
            return

        def run() -> str:
            # Every line logged while acting names the job and its attempt.
            with logcontext.about(action.job_id, job.attempt if job is not None else None):
                result = self.executor.execute(action, job)
                if not result.startswith("failed"):
                    self.job_backoff.succeeded(key, self.clock())
                self.on_action(action, result)
            return result

        self._in_flight[key] = self._pool.submit(run)

    def _reap(self) -> None:
        for key, fut in list(self._in_flight.items()):
            if fut.done():
                del self._in_flight[key]
                if (exc := fut.exception()) is not None:
                    if isinstance(exc, TpuCallError):
                        self._api_failed(key, exc.failure)
                    log.error("action on %s failed: %s", key, exc)

    @property
    def busy(self) -> bool:
        self._reap()
        return bool(self._in_flight)

    # -- driving --------------------------------------------------------------------------
    def run(self, *, once: bool = False, stop: threading.Event | None = None, timeout: float | None = None) -> None:
        """Forever (until `stop`), or with `once` until nothing more can be done without
        waiting: passes go on while they act or while a cloud operation under way (a TPU
        being created, a node restarting) will let a next step be planned; `timeout` caps
        the whole call."""
        stop = stop or threading.Event()
        give_up = time.monotonic() + timeout if timeout is not None else None
        follower, done = None, threading.Event()
        if not once:
            follower = threading.Thread(target=self._follow_appends, args=(done,), name="reconcile-wake", daemon=True)
            follower.start()
        try:
            self._run(once, stop, give_up)
        finally:
            done.set()
            if follower is not None:
                # Its waits last 0.5 s; a slow connect may take longer. Whoever called run()
                # may drop the ledger next: the follower must not connect after we return.
                follower.join(30)

    def _follow_appends(self, done: threading.Event) -> None:
        """Wake the loop on any new event (ours included: the next step of a story follows
        at once), on a store connection of this thread's own."""
        try:
            if done.is_set():  # the run ended before this thread got going: connect to nothing
                return
            head = self.store().head()
            while not done.is_set():
                try:
                    now = self.store().wait_for_append(head, 0.5)
                except Exception as exc:  # the ledger is down: the loop's own pass says so
                    log.debug("waiting for appends: %s", exc)
                    done.wait(1.0)
                    continue
                if now > head:
                    head = now
                    self._woken.set()
        except Exception as exc:
            log.debug("waiting for appends: %s", exc)
        finally:
            store = getattr(self._local, "store", None)
            if store is not None:
                self._local.store = None
                with contextlib.suppress(Exception):
                    store.close()

    def _run(self, once: bool, stop: threading.Event, give_up: float | None) -> None:
        while not stop.is_set():
            self._woken.clear()
            actions = self.step()
            if once:
                self.drain(timeout=max(0.0, give_up - time.monotonic()) if give_up is not None else 600)
                if give_up is not None and time.monotonic() >= give_up:
                    return self._unobserved()
                if actions:
                    continue
                self.catch_up()
                if not awaiting(self.live.jobs, self.last_observed):
                    return self._unobserved()
                stop.wait(min(self.interval, 0.5))
                continue
            # until the interval passes, an event is appended or a watched host changes
            deadline = time.monotonic() + self.interval
            while not stop.is_set() and not self._woken.wait(max(0.0, min(0.25, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break

    def _unobserved(self) -> None:
        """`--once` ends: one line for each zone whose API did not answer (its jobs were left
        as they were), unless its outage is already recorded and logged."""
        for zone, failure in sorted(self.health.failing().items()):
            if not self.health.recorded(zone):
                log.warning("TPU API of zone %s did not answer (%s): nothing was decided about its jobs; run again later",
                            zone, summary(failure))

    def drain(self, timeout: float = 600) -> list[str]:
        """Wait for the actions in flight to end (at most `timeout` s); returns those still running.
        An action still running has its intent recorded and no outcome: whoever holds the job
        next (this reconciler restarted, or a peer once the lease lapses) resolves it."""
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        return sorted(self._in_flight)

    @property
    def in_flight(self) -> list[str]:
        self._reap()
        return sorted(self._in_flight)

    def close(self) -> None:
        self._snapshotter.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        if hasattr(self.runner, "close"):  # its watchers and SSH connections
            self.runner.close()
        if self.membership is not None:
            self.membership.close()
        self.tpu.close()
