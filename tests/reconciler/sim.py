"""A simulated cloud for the model test: TPU nodes, their operations and their hosts, in
memory, on a virtual clock, with the faults the issue lists. It answers the reconciler's
`TpuApi` and `Runner` calls, so the real planner and the real executor run against it and
write a real SQLite ledger (stamped by the same virtual clock).

Deliberately small: one zone, one host per node, an operation is a delay in ticks. What it
keeps is what the reconciler can get wrong: names, states, who holds what, and when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledger.failures import ApiFailure
from reconciler import naming
from reconciler.model import NodeObs, OperationObs, QueuedObs
from reconciler.remote.errors import HostUnreachable
from reconciler.remote.types import HostStatus, SetupReport
from reconciler.tpu import Created, CreateRequest, TpuCallError

# Every status the TPU API returns, as a fault the simulated cloud can answer a create with,
# in the call or in its operation (reason: google.rpc.ErrorInfo's, where it decides the kind).
API_FAULTS: tuple[tuple[str, str], ...] = (
    ("UNAVAILABLE", ""), ("DEADLINE_EXCEEDED", ""), ("INTERNAL", ""), ("ABORTED", ""), ("CANCELLED", ""),
    ("RESOURCE_EXHAUSTED", ""), ("RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), ("RESOURCE_EXHAUSTED", "RATE_LIMIT_EXCEEDED"),
    ("PERMISSION_DENIED", "IAM_PERMISSION_DENIED"), ("UNAUTHENTICATED", "ACCESS_TOKEN_EXPIRED"),
    ("INVALID_ARGUMENT", ""), ("NOT_FOUND", ""), ("ALREADY_EXISTS", ""), ("FAILED_PRECONDITION", ""),
)

ZONE = "us-central2-b"
ALIVE = frozenset({"CREATING", "READY"})  # states in which a node is billed and held


class Crash(BaseException):  # noqa: N818 - a process death, not an error anyone handles
    """The reconciler process dies here (kill -9): nothing after it runs or is recorded."""


@dataclass
class Node:
    name: str
    state: str
    labels: dict[str, str]
    create_time: float
    ready_at: float
    vanish: bool = False  # the create operation fails: the node goes away instead of READY
    op_error: ApiFailure | None = None  # ... with this error in its operation
    health: str = "HEALTHY"
    host_alive: bool = True
    flip_at: float | None = None  # probe-first preemption: the API says PREEMPTED from then
    delete_at: float | None = None


@dataclass
class Proc:
    job_id: str
    attempt: int
    node: str
    ends_at: float
    exit_code: int
    state: str = "running"  # running | exited
    kinds: list[str] = field(default_factory=list)


@dataclass
class Hooks:
    """Armed faults that fire inside the next effect call ("during any action")."""

    crash: str = ""  # "before" | "after": the next effect call dies before/after acting
    during: Callable[[], None] | None = None  # e.g. a cancel or spec change appended mid-action


class SimCloud:
    """The TpuApi surface the reconciler uses, plus fault controls and a clock."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.nodes: dict[str, Node] = {}
        self.procs: dict[tuple[str, int], Proc] = {}
        self.capacity = True
        self.create_ticks = 1.0
        self.fail_create = False
        self.fail_op = False
        self.hooks = Hooks()
        self.host_losses: list[Node] = []  # nodes whose host was killed (not preempted)
        self.calls = 0
        self.tick_s = 10.0
        self.redeletes = 0  # deletes asked of a node already DELETING: must stay 0
        self.refuse: tuple[str, str, bool] | None = None  # the next create: (code, reason, in its operation)
        self.outage = False  # every call fails UNAVAILABLE
        self.ops: dict[str, OperationObs] = {}
        self.outage_calls = 0  # calls made while the outage lasted

    # -- faults ---------------------------------------------------------------------------
    def effect(self, act: Callable[[], Any]) -> Any:
        """Every call that changes the cloud goes through here: armed hooks fire."""
        hooks, self.hooks = self.hooks, Hooks()
        if hooks.during is not None:
            hooks.during()
        if hooks.crash == "before":
            raise Crash("before the effect")
        result = act()
        if hooks.crash == "after":
            raise Crash("after the effect")
        return result

    def live(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.state == "READY" and n.host_alive]

    def preempt(self, node: Node, *, probe_first: bool) -> None:
        node.host_alive = False
        self._kill_procs(node.name)
        if probe_first:  # the host is dead; the API reads READY for a little while longer
            node.flip_at = self.now + 2 * self.tick_s  # the next pass still reads READY
        else:
            node.state, node.health = "PREEMPTED", ""

    def lose_host(self, node: Node) -> None:
        node.host_alive, node.health = False, "TIMEOUT"
        self.host_losses.append(node)
        self._kill_procs(node.name)

    def _kill_procs(self, node: str) -> None:
        for key, p in list(self.procs.items()):
            if p.node == node:
                del self.procs[key]

    # -- time -----------------------------------------------------------------------------
    def _api(self, method: str, resource: str = "") -> None:
        """Every API call: during an outage it fails, as a closed endpoint answers."""
        self.calls += 1
        if self.outage:
            self.outage_calls += 1
            raise TpuCallError(ApiFailure("UNAVAILABLE", "failed to connect to all addresses", method=method, resource=resource))

    def tick(self) -> None:
        self.now += self.tick_s
        for name, n in list(self.nodes.items()):
            if n.state == "CREATING" and self.now >= n.ready_at:
                if n.vanish:
                    del self.nodes[name]
                    self.ops[f"op-{name}"] = OperationObs(f"op-{name}", True, n.op_error)
                    continue
                n.state = "READY"
                self.ops[f"op-{name}"] = OperationObs(f"op-{name}", True, None)
            if n.flip_at is not None and self.now >= n.flip_at and n.state == "READY":
                n.state, n.health, n.flip_at = "PREEMPTED", "", None
            if n.delete_at is not None and self.now >= n.delete_at:
                del self.nodes[name]
                self._kill_procs(name)
        for p in self.procs.values():
            if p.state == "running" and self.now >= p.ends_at:
                p.state = "exited"

    # -- TpuApi ---------------------------------------------------------------------------
    def _obs(self, n: Node) -> NodeObs:
        hosts = ({"worker": 0, "address": n.name, "port": 22},) if n.state == "READY" else ()
        return NodeObs(n.name, ZONE, n.state, dict(n.labels), hosts, n.health, n.create_time)

    def list_nodes(self, zone: str) -> list[NodeObs]:
        self._api("ListNodes", f"projects/p/locations/{zone}")
        return [self._obs(n) for n in self.nodes.values()] if zone == ZONE else []

    def list_queued(self, zone: str) -> list[QueuedObs]:
        return []

    def get_node(self, zone: str, name: str) -> NodeObs | None:
        self._api("GetNode", f"projects/p/locations/{zone}/nodes/{name}")
        n = self.nodes.get(name)
        return None if n is None else self._obs(n)

    def operation(self, name: str) -> OperationObs | None:
        self._api("GetOperation", name)
        return self.ops.get(name)

    def state_of(self, zone: str, name: str, *, queued: bool = False) -> str | None:
        if queued:  # the simulated cloud makes nodes only
            return None
        node = self.get_node(zone, name)
        return None if node is None else node.state

    def host_keys(self, zone: str, name: str) -> list[str | None]:
        return []

    def create(self, req: CreateRequest) -> Created:
        def act() -> Created:
            parent = f"projects/p/locations/{req.zone}"
            self._api("CreateNode", parent)
            if self.fail_op:  # the create operation ends in an error and changes nothing
                self.fail_op = False
                raise RuntimeError(f"operation create {req.name} failed: INTERNAL")
            refuse, self.refuse = self.refuse, None
            if refuse is not None and not refuse[2] and refuse[0] != "ALREADY_EXISTS":
                raise TpuCallError(ApiFailure(refuse[0], f"{refuse[0]} (simulated)", method="CreateNode",
                                              reason=refuse[1], resource=parent))
            if req.name in self.nodes:
                return Created("adopted")
            if not self.capacity:
                raise TpuCallError(ApiFailure("RESOURCE_EXHAUSTED", f"no capacity for {req.accelerator} in {req.zone}",
                                              method="CreateNode", resource=parent))
            op_error = None
            if refuse is not None and refuse[2]:
                op_error = ApiFailure(refuse[0], f"{refuse[0]} (simulated, in the operation)", method="CreateNode",
                                      reason=refuse[1], in_operation=True, resource=parent)
            self.nodes[req.name] = Node(req.name, "CREATING", dict(req.labels), self.now,
                                        self.now + self.create_ticks * self.tick_s,
                                        vanish=self.fail_create or op_error is not None, op_error=op_error)
            self.ops[f"op-{req.name}"] = OperationObs(f"op-{req.name}", False)
            self.fail_create, self.create_ticks = False, 1.0
            return Created("created", f"op-{req.name}")

        return self.effect(act)

    def delete(self, zone: str, name: str, *, queued: bool = False) -> bool:
        def act() -> bool:
            self._api("DeleteNode", f"projects/p/locations/{zone}/nodes/{name}")
            if self.fail_op:
                self.fail_op = False
                raise RuntimeError(f"operation delete {name} failed: INTERNAL")
            n = self.nodes.get(name)
            if n is None:
                return False
            if n.state == "DELETING":  # as Google answers a second delete of a deleting node
                self.redeletes += 1
                raise RuntimeError(f"FAILED_PRECONDITION: node {name} is being deleted")
            # Two ticks: the pass after a crash still sees it DELETING.
            n.state, n.delete_at = "DELETING", self.now + 2 * self.tick_s
            n.host_alive = False
            self._kill_procs(name)
            return True

        return self.effect(act)

    def await_gone(self, zone: str, name: str, *, queued: bool = False, timeout: float = 0.0) -> bool:
        # The simulated cloud never fails a deletion once under way: it ends within two ticks.
        n = self.nodes.get(name)
        return n is None or n.state == "DELETING"

    def close(self) -> None:
        pass

    # -- Runner ---------------------------------------------------------------------------
    def _host(self, hosts: list[Any]) -> Node | None:
        name = hosts[0]["address"] if hosts else ""
        n = self.nodes.get(name)
        return n if n is not None and n.host_alive and n.state == "READY" else None

    def setup(self, job_id: str, attempt: int, hosts: list[Any], spec: dict, *, workers: list[int] | None = None) -> Any:
        def act() -> SetupReport:
            if self._host(hosts) is None:
                return SetupReport(failures=[(0, "command", "host unreachable")])
            return SetupReport()

        return self.effect(act)

    def start(self, job_id: str, attempt: int, hosts: list[Any], spec: dict, *, extra_args: list[str],
              resume: bool, placed: Any = None) -> dict[int, int]:
        def act() -> dict[int, int]:
            node = self._host(hosts)
            if node is None:
                raise HostUnreachable("host unreachable")
            if (job_id, attempt) not in self.procs:  # the runner starts an attempt once
                env = (spec.get("command") or {}).get("env") or {}
                ticks, code = float(env.get("SIM_TICKS", 2)), int(env.get("SIM_EXIT", 0))
                self.procs[job_id, attempt] = Proc(job_id, attempt, node.name, self.now + ticks * self.tick_s, code)
            return {0: 4242}

        return self.effect(act)

    def probe(self, job_id: str, attempt: int, hosts: list[Any], *, workers: list[int] | None = None) -> dict[int, Any]:
        name = hosts[0]["address"] if hosts else ""
        n = self.nodes.get(name)
        if n is None or not n.host_alive:
            return {0: HostStatus("gone", error="ssh: connection refused")}
        p = self.procs.get((job_id, attempt))
        if p is None:
            return {0: HostStatus("not_started")}
        kinds, p.kinds = p.kinds, []
        if p.state == "running":
            return {0: HostStatus("running", kinds=kinds)}
        return {0: HostStatus("exited", exit_code=p.exit_code, kinds=kinds)}

    def stop(self, job_id: str, attempt: int, hosts: list[Any], *, grace: float = 10, once: bool = False) -> None:
        def act() -> None:
            p = self.procs.get((job_id, attempt))
            if p is not None and p.state == "running":
                p.state, p.exit_code = "exited", 143

        self.effect(act)

    # -- reading --------------------------------------------------------------------------
    def alive_for(self, job_id: str) -> list[str]:
        """Nodes billed for a job (CREATING or READY, labelled with its id, any submission)."""
        return [n.name for n in self.nodes.values() if n.state in ALIVE and labelled(n, job_id)]


def labelled(node: Node, job_id: str) -> bool:
    return node.labels.get(naming.LABEL_JOB) == naming.labels(job_id, "", "", 0)[naming.LABEL_JOB]
