"""Which layer each test belongs to and which external services it uses, decided in one place.

tests/conftest.py calls `classify` for every collected test and adds the markers; nobody
writes `@pytest.mark.postgres` by hand. A test gets a service's marker because it uses a
fixture that starts (or connects to) the service, or because it lives where every test uses
the service. `Guard` then makes the reverse impossible: a test that reaches a service it is not
marked for fails, naming the service (see tests/README.md).

Layers, cheapest first (each test has exactly one):
- unit:        no server of any kind; plain functions, SQLite files, CLI processes on SQLite.
- contract:    the store contract, run once per backend (marker `sqlite` or `postgres`).
- integration: at least one external service (the SERVICES below).
- e2e:         the product as a user runs it (tests/e2e/, tests/*_e2e.py).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

LAYERS = {
    "unit": "no server: pure functions, SQLite files, CLI processes on SQLite",
    "contract": "the store contract, once per backend (with `sqlite` or `postgres`)",
    "integration": "uses at least one external service (see the service markers)",
    "e2e": "the product end to end, as a user runs it (tests/e2e/, tests/*_e2e.py)",
}

SERVICES = {
    "postgres": "a real PostgreSQL server on 127.0.0.1:5432 (scripts/test-services.sh starts it)",
    "sshd": "a real OpenSSH sshd the test starts (/usr/sbin/sshd)",
    "pubsub": "the official Pub/Sub emulator (gcloud's cloud-pubsub-emulator, a JVM)",
    "tpu_emulator": "the Cloud TPU API emulator: a gRPC server and its paramiko SSH hosts",
    "git": "the git binary on real repositories",
    "smtp": "a real SMTP server (aiosmtpd) in the test process",
    "webhook": "a real HTTP server in the test process",
    "gcs": "the project's Cloud Storage JSON API emulator (emulator.gcs) for the real google-cloud-storage client, in the test process",
    "gcloud": "the real gcloud CLI (the test skips where gcloud is not installed)",
    "browser": "headless Chromium through chromedriver (Debian's chromium, chromium-driver; scripts/test-services.sh installs them)",
    "promtool": "Prometheus's promtool checking the shipped alert rules (Debian's prometheus package; scripts/test-services.sh installs it)",
}

BACKENDS = {
    "sqlite": "the SQLite variant of a contract test (a file; no server)",
}

# Fixtures that start or reach a service: (where the fixture is defined, its name) -> services.
# A test using one of them, directly or through other fixtures, gets these markers.
SERVICE_FIXTURES: dict[tuple[str, str], frozenset[str]] = {
    ("tests/postgres", "pg_admin_url"): frozenset({"postgres"}),
    ("tests/remote", "ssh_material"): frozenset({"sshd"}),
    ("tests/remote/test_emulator.py", "emu_pod"): frozenset({"tpu_emulator"}),
    ("tests/fanout", "emulator"): frozenset({"pubsub"}),
    ("tests/fanout/test_fanout_notify.py", "smtp"): frozenset({"smtp"}),
    ("tests/fanout/test_fanout_notify.py", "webhook"): frozenset({"webhook"}),
    ("tests/emulator", "emu"): frozenset({"tpu_emulator"}),
    ("tests/reconciler", "harness"): frozenset({"tpu_emulator"}),
    ("tests/reconciler/test_sigterm.py", "slow_delete"): frozenset({"tpu_emulator"}),
    ("tests/admission", "lab_harness"): frozenset({"tpu_emulator"}),
    ("tests/doctor", "harness"): frozenset({"tpu_emulator"}),
    ("tests/doctor", "pod"): frozenset({"tpu_emulator"}),
    ("tests/postgres/test_pg_ha.py", "pg_harness"): frozenset({"tpu_emulator"}),
    ("tests/gitops", "hub"): frozenset({"git"}),
    ("tests/gitops/test_gitops_forge.py", "api"): frozenset({"webhook"}),  # the GitHub API double
    ("tests/gitops/test_gitops_hostile.py", "fuzz_hub"): frozenset({"git"}),
    ("tests/checkpoints", "checkpoint_hub"): frozenset({"git"}),
    ("tests/dashboard", "browser"): frozenset({"browser"}),
    ("tests/dashboard", "demo_story"): frozenset({"tpu_emulator", "git"}),  # the demo's story (ledger.app.demo)
    ("tests/e2e/test_chaos.py", "chaos_pg"): frozenset({"postgres"}),
    ("tests/joblogs", "gcs"): frozenset({"gcs"}),
    ("tests/observability", "promtool"): frozenset({"promtool"}),
}

# Fixtures parametrized over store backends: a test using one is a contract test, and each
# param adds its backend's marker (the postgres param reaches PostgreSQL through
# request.getfixturevalue, which no fixture closure shows).
BACKEND_FIXTURES: dict[tuple[str, str], Mapping[str, frozenset[str]]] = {
    ("tests/ledger", "store_factory"): {"sqlite": frozenset({"sqlite"}), "postgres": frozenset({"postgres"})},
    ("tests/postgres", "new_ledger_url"): {"sqlite": frozenset({"sqlite"}), "postgres": frozenset({"postgres"})},
}

# Where tests use a service in their own body rather than through a fixture: a directory
# (ending with "/") or a file; every test there gets the markers.
PLACES: dict[str, frozenset[str]] = {
    "tests/emulator/": frozenset({"tpu_emulator"}),
    "tests/emulator/test_lifecycle.py": frozenset({"pubsub"}),  # `ledger emulator --pubsub`
    "tests/emulator/test_gcloud.py": frozenset({"gcloud"}),
    "tests/gitops/test_gitops_bootstrap.py": frozenset({"git"}),
    "tests/spec/test_spec_cli.py": frozenset({"git"}),  # `ledger init` commits the template
    "tests/test_demo_e2e.py": frozenset({"tpu_emulator", "pubsub", "git"}),
    "tests/e2e/test_wheel.py": frozenset({"tpu_emulator", "git"}),  # `ledger init`, `ledger demo --no-pubsub`
    "tests/e2e/test_chaos.py": frozenset({"tpu_emulator", "git"}),  # `ledger chaos`'s run, in the test process
    "tests/observability/test_watch_metrics.py": frozenset({"git"}),  # `ledger init`, `ledger watch`
}

E2E_PLACES = ("tests/e2e/",)
E2E_SUFFIX = "_e2e.py"


def classify(path: str, fixtures: Iterable[tuple[str, str]], params: Mapping[tuple[str, str], str] = {}) -> set[str]:
    """The markers of one test: its layer, its services, its backend.

    `path` is the test file relative to the repository ("tests/x/test_y.py"); `fixtures` the
    (definition place, name) of every fixture it uses, transitively; `params` the param id
    of each parametrized fixture it uses.
    """
    marks: set[str] = set()
    contract = False
    for key in fixtures:
        marks |= SERVICE_FIXTURES.get(key, frozenset())
        if key in BACKEND_FIXTURES:
            contract = True
            marks |= BACKEND_FIXTURES[key].get(params.get(key, ""), frozenset())
    for place, services in PLACES.items():
        if path == place or (place.endswith("/") and path.startswith(place)):
            marks |= services
    if path.startswith(E2E_PLACES) or path.endswith(E2E_SUFFIX):
        layer = "e2e"
    elif contract:
        layer = "contract"
    elif marks & SERVICES.keys():
        layer = "integration"
    else:
        layer = "unit"
    return marks | {layer}


def marker_lines() -> list[str]:
    """pyproject's `markers` entries, from the tables above (a test checks they agree)."""
    return [f"{name}: {meaning}" for table in (LAYERS, SERVICES, BACKENDS) for name, meaning in table.items()]


# ------------------------------------------------------------------------------ the guard
class ServiceNotMarked(RuntimeError):
    """A test reached a service it has no marker for."""


SERVICE_BINARIES = {"git": "git", "sshd": "sshd", "cloud-pubsub-emulator": "pubsub",
                    "psql": "postgres", "pg_ctl": "postgres", "pg_ctlcluster": "postgres",
                    "chromedriver": "browser", "chromium": "browser", "promtool": "promtool"}
# Child processes cannot be watched from here: these stand-ins come first on PATH in a test
# without the marker, so a `ledger` process it starts cannot reach the binary either.
PATH_SHIMS = {"git": "git"}
SHIM = """#!/bin/sh
if [ "$*" = --version ] || [ "$*" = version ]; then  # asking for the version is not using it
  PATH=$(printf %s "$PATH" | tr : '\\n' | grep -vxF "$(dirname "$0")" | paste -sd: -) exec {binary} "$@"
fi
echo "tests: '{binary}' run by a test without the '{service}' marker (see tests/README.md)" >&2
echo "{service}: {binary} $*" >> "{log}"
exit 97
"""


def services_of_command(args: object, env: Mapping[str, str] | None) -> set[str]:
    """The services a new process will use, as far as its command line tells."""
    argv = shlex.split(args) if isinstance(args, str) else [os.fsdecode(a) for a in args]  # type: ignore[union-attr]
    found: set[str] = set()
    if not argv:
        return found
    binary = os.path.basename(argv[0])
    if binary in SERVICE_BINARIES and argv[1:] not in (["version"], ["--version"]):
        found.add(SERVICE_BINARIES[binary])
    if any(a.startswith(("postgresql://", "postgres://")) for a in argv):
        found.add("postgres")
    if env and str(env.get("LEDGER_STORE", "")).startswith(("postgresql://", "postgres://")):
        found.add("postgres")
    # the CLI: `ledger demo` and `ledger emulator` run the TPU emulator (demo: Pub/Sub too)
    rest = argv[1:]
    if binary.startswith("python") and rest[:2] in (["-m", "ledger"], ["-m", "emulator"]):
        binary, rest = rest[1], rest[2:]
    if binary == "ledger":
        command, words = "", iter(rest)
        for word in words:
            if word == "--store":
                next(words, None)  # the global option's value
            elif not word.startswith("-"):
                command = word
                break
        if command in ("demo", "emulator"):
            found.add("tpu_emulator")
            if (command == "demo" and "--no-pubsub" not in rest) or "--pubsub" in rest:
                found.add("pubsub")
    elif binary == "emulator":
        found.add("tpu_emulator")
    return found


class Guard:
    """Fails a test that reaches an external service its markers do not name.

    In the test process: an audit hook sees every new process, and the in-process entry
    points (psycopg's connect, the TPU emulator's start) are wrapped. In child processes: the
    PATH shims above. Outside a test (collection, session teardown) everything is allowed.
    """

    def __init__(self) -> None:
        self.allowed: frozenset[str] | None = None
        self.test = ""
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._shims = Path(tempfile.mkdtemp(prefix="tests-guard-"))
        self._log = self._shims / "violations.log"
        self._path: str | None = None

    # -- installation (once per session)
    def install(self) -> None:
        sys.addaudithook(self._audit)
        for binary, service in PATH_SHIMS.items():
            d = self._shims / service
            d.mkdir()
            shim = d / binary
            shim.write_text(SHIM.format(binary=binary, service=service, log=self._log))
            shim.chmod(0o755)
        self._wrap_psycopg()
        self._wrap_emulator()

    def _wrap_psycopg(self) -> None:
        try:
            import psycopg
        except ImportError:  # without the driver nobody reaches PostgreSQL in-process
            return
        guard = self
        original = psycopg.Connection.__dict__["connect"].__func__

        def connect(cls, *args, **kwargs):
            conn = original(cls, *args, **kwargs)  # reaching = connecting: a refused attempt is not
            try:
                guard.check("postgres", "psycopg.connect")
            except ServiceNotMarked:
                conn.close()
                raise
            return conn

        psycopg.Connection.connect = classmethod(connect)  # type: ignore[method-assign]
        psycopg.connect = psycopg.Connection.connect  # the module keeps its own alias

    def _wrap_emulator(self) -> None:
        from emulator.core import Emulator

        original = Emulator.start
        guard = self

        def start(emu):
            guard.check("tpu_emulator", "emulator.Emulator.start")
            return original(emu)

        Emulator.start = start  # type: ignore[method-assign]

    def close(self) -> None:
        import shutil

        shutil.rmtree(self._shims, ignore_errors=True)

    # -- per test
    def begin(self, test: str, marks: set[str]) -> None:
        self.test = test
        self.allowed = frozenset(marks)
        forbidden = [str(self._shims / s) for s in PATH_SHIMS.values() if s not in marks]
        self._path = os.environ.get("PATH", "")
        if forbidden:
            os.environ["PATH"] = os.pathsep.join([*forbidden, self._path])

    def end(self) -> list[str]:
        """Ends the test; returns what it reached without a marker."""
        if self._path is not None:
            os.environ["PATH"] = self._path
            self._path = None
        self.allowed = None
        found = self._drain()
        return found

    def _drain(self) -> list[str]:
        with self._lock:
            found, self.violations = self.violations, []
        if self._log.exists():
            found += [f"{line} (in a child process)" for line in self._log.read_text().splitlines()]
            self._log.unlink()
        return found

    @contextlib.contextmanager
    def expect_violation(self) -> Iterator[list[str]]:
        """For the guard's own tests: what the block reached, taken off the test's record."""
        caught: list[str] = []
        before = self._drain()
        try:
            yield caught
        finally:
            caught += self._drain()
            with self._lock:
                self.violations[:0] = before

    @contextlib.contextmanager
    def shared_teardown(self, service: str) -> Iterator[None]:
        """A module- or session-scoped fixture's own teardown reaches its service: pytest runs
        it in the teardown of whichever test of the module came last on this worker (under
        pytest-xdist, maybe one without the marker), so it is not that test's doing."""
        before = self.allowed
        if before is not None:
            self.allowed = before | {service}
        try:
            yield
        finally:
            self.allowed = before

    def check(self, service: str, what: str) -> None:
        allowed = self.allowed
        if allowed is None or service in allowed:
            return
        message = f"{service}: {what}"
        with self._lock:
            self.violations.append(message)
        raise ServiceNotMarked(
            f"{self.test} reached {what} without the '{service}' marker: use the fixture that "
            f"provides {service} (tests/layers.py SERVICE_FIXTURES) or add it there")

    def _audit(self, event: str, args: tuple) -> None:
        if event != "subprocess.Popen" or self.allowed is None:
            return
        _, argv, _, env = args
        for service in sorted(services_of_command(argv, env) - self.allowed):
            self.check(service, f"a process `{shlex.join(map(str, argv)) if not isinstance(argv, str) else argv}`"[:200])
