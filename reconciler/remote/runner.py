"""RemoteRunner: setup modules, detached start, status probe with output fetch, stop.

The imperative shell around the pure parts (layout, scripts, modules, patterns): one
parallel round of SSH calls per operation, every host keyed by its worker id.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO, TypeVar

from ledger import defaults
from ledger.spec.redact import Redactor, complete, secret_refs
from ledger.spec.secrets import SecretError, SecretsDir
from reconciler.remote import layout, modules, patterns, scripts
from reconciler.remote.errors import (
    AuthFailed,
    HostKeyMismatch,
    HostUnreachable,
    RemoteError,
    StartFailed,
)
from reconciler.remote.ssh import SSHPool
from reconciler.remote.types import (
    DEFAULT_USERNAME,
    CommandResult,
    Host,
    HostStatus,
    Placed,
    SetupReport,
)
from reconciler.remote.watch import Watchers

T = TypeVar("T")
log = logging.getLogger("tpu_ledger.remote")
MAX_FETCH = 4 << 20  # bytes of output fetched per host per probe


class RemoteRunner:
    def __init__(
        self,
        *,
        private_key_path: Path,
        known_hosts_path: Path,
        log_dir: Path,
        username: str = DEFAULT_USERNAME,
        connect_timeout: float = 10,
        command_timeout: float = 300,
        retries: int = 5,
        probe_retries: int = 1,
        backoff: float = 0.5,
        secrets_dir: Path | None = None,
        max_parallel: int = 64,
        watch: bool = True,
    ) -> None:
        """`username` applies to hosts whose username is the Host default; `secrets_dir` is
        the admin's secrets folder: the files a spec names (keys, requirements, conda files)
        are read from `<secrets_dir>/<owner>/` only (ledger.spec.secrets), never from
        anywhere else on this host, and never the reconciler's own key.

        `watch`: keep a watcher channel per running host (reconciler.remote.watch): its
        output streams in, its end (or the connection's) calls the `on_change` listeners at
        once, and a probe of a watched host is answered from what arrived, with no round
        trip. Without it every probe is one exec per host, as before."""
        self.pool = SSHPool(
            private_key_path=Path(private_key_path), known_hosts_path=Path(known_hosts_path),
            connect_timeout=connect_timeout, retries=retries, backoff=backoff,
        )
        self.log_dir = Path(log_dir)
        self.username = username
        self.command_timeout = command_timeout
        self.probe_timeout = max(connect_timeout, 30.0)
        self.probe_retries = probe_retries
        self.secrets = SecretsDir(Path(secrets_dir) if secrets_dir else defaults.secrets_dir(), Path(private_key_path))
        self._executor = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="remote")
        self._scanned: dict[tuple[str, int, int], int] = {}
        # (job, attempt, worker) -> the newest checkpoint step seen in that output, kept
        # until the attempt ends so the planner sees it on the pass its throttle allows
        self._checkpoint_steps: dict[tuple[str, int, int], int] = {}
        self._scan_lock = threading.Lock()
        # (job, attempt) -> the masks of the secrets it received (ledger.spec.redact)
        self._redactors: dict[tuple[str, int], Redactor] = {}
        self.watch = watch
        self.watchers = Watchers()

    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call `callback(job_id)` as soon as a watched host's attempt ends or its connection
        is lost (the reconciler wakes and looks: it never learns the outcome from here)."""
        self.watchers.on_change.append(callback)

    # -- plumbing ------------------------------------------------------------------------
    def _host(self, h: Host) -> Host:
        if h.username == DEFAULT_USERNAME and self.username != DEFAULT_USERNAME:
            return dataclasses.replace(h, username=self.username)
        return h

    def _parallel(self, hosts: Sequence[Host], fn: Callable[[Host], T]) -> dict[int, T]:
        """`fn` on every host at once (every slice's too), keyed by each host's id (rank)."""
        futures = {h.id: self._executor.submit(fn, self._host(h)) for h in hosts}
        return {w: f.result() for w, f in futures.items()}

    @staticmethod
    def _select(hosts: Sequence[Host], ids: Sequence[int] | str | None) -> list[Host]:
        """The hosts with these ids (ranks: a one-slice job's worker ids); all for None."""
        if ids is None or ids == "all":
            return list(hosts)
        wanted = {int(w) for w in ids}
        known = {h.id for h in hosts}
        missing = wanted - known
        if missing:
            raise ValueError(f"workers {sorted(missing)} are not among the hosts {sorted(known)}")
        return [h for h in hosts if h.id in wanted]

    @staticmethod
    def _in_each_slice(hosts: Sequence[Host], workers: Sequence[int] | str | None) -> list[Host]:
        """The hosts a spec's `command.workers` selects: those workers in every slice."""
        if workers is None or workers == "all":
            return list(hosts)
        wanted = {int(w) for w in ([workers] if isinstance(workers, int) else workers)}
        missing = wanted - {h.worker for h in hosts}
        if missing:
            raise ValueError(f"workers {sorted(missing)} are not among the hosts {sorted({h.worker for h in hosts})}")
        return [h for h in hosts if h.worker in wanted]

    def _reader(self, job_id: str) -> modules.Reader:
        """Reads for one job: from its owner's secrets folder, checked again here (defence
        in depth: validation refused escapes, but the folder may have changed since)."""
        owner = job_id.partition("/")[0]
        return lambda ref: self.secrets.read(owner, ref)

    def _redactor(self, job_id: str, refs: list[str]) -> Redactor:
        """The masks of the secrets `refs` name in the job owner's folder (one that cannot
        be read now was never handed out by this runner either)."""
        values = []
        for ref in refs:
            try:
                values.append(self._reader(job_id)(ref))
            except SecretError:
                continue
        return Redactor(values)

    def _attempt_redactor(self, job_id: str, attempt: int) -> Redactor:
        """The attempt's masks, from the references `start` saved (kept for the attempt)."""
        key = (job_id, attempt)
        with self._scan_lock:
            found = self._redactors.get(key)
        if found is None:
            found = self._redactor(job_id, list(self._saved_patterns(job_id, attempt).get("secrets") or []))
            with self._scan_lock:
                self._redactors = {k: v for k, v in self._redactors.items() if k[0] != job_id or k[1] >= attempt}
                self._redactors[key] = found
        return found

    # -- setup ---------------------------------------------------------------------------
    def setup(
        self, job_id: str, attempt: int, hosts: list[Host], spec: Mapping, *,
        workers: list[int] | None = None,
    ) -> SetupReport:
        """Run the spec's setup modules (all but "command") on the selected hosts in parallel.

        Per host, modules run in order; each module's check passing skips it; a host stops at
        its first failing step. Logs: <log_dir>/<job>/<attempt>/<module>_worker_<i>.log.
        """
        names = [m for m in (spec.get("setup") or {}).get("modules") or [] if m != "command"]
        report = SetupReport()
        try:
            built = [modules.build(n, spec, self._reader(job_id)) for n in names]
        except (OSError, KeyError, ValueError, SecretError) as exc:
            for h in self._select(hosts, workers):
                report.failures.append((h.id, "spec", f"cannot build setup steps: {exc}"))
            return report
        redact = self._redactor(job_id, secret_refs(spec))
        results = self._parallel(self._select(hosts, workers),
                                 lambda h: self._setup_host(job_id, attempt, h, built, redact))
        for w, (outcomes, failure) in sorted(results.items()):
            report.outcomes[w] = outcomes
            if failure is not None:
                report.failures.append((w, failure[0], failure[1]))
        return report

    def _setup_host(self, job_id: str, attempt: int, host: Host, built: list[modules.Module],
                    redact: Redactor) -> tuple[dict[str, str], tuple[str, str] | None]:
        outcomes: dict[str, str] = {m.name: "not-run" for m in built}
        for mod in built:
            path = layout.setup_log(self.log_dir, job_id, attempt, mod.name, host.worker, host.slice)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as raw:
                log = _RedactedLog(raw, redact)
                log.write(f"== {mod.name} on {host.label} ({host.address}:{host.port}) {_now()}\n")
                try:
                    if mod.check and modules.fits_one_trip(mod):
                        skipped, failed = self._module_one_trip(host, mod, log)
                    elif mod.check and self._steps(host, mod.check, log) is None:
                        skipped, failed = True, None
                    else:
                        skipped, failed = False, self._steps(host, mod.setup, log)
                    if skipped:
                        log.write("check passed: already set up, skipping\n")
                        outcomes[mod.name] = "skipped"
                        continue
                    if failed is not None:
                        label, code = failed
                        log.write(f"FAILED: {label} exited {code}\n")
                        outcomes[mod.name] = "failed"
                        return outcomes, (mod.name, f"{label} exited {code} (see {path})")
                    log.write("done\n")
                    outcomes[mod.name] = "done"
                except RemoteError as exc:
                    log.write(f"FAILED: {exc}\n")
                    outcomes[mod.name] = "failed"
                    return outcomes, (mod.name, str(exc))
        return outcomes, None

    def _module_one_trip(self, host: Host, mod: modules.Module, log: _RedactedLog) -> tuple[bool, tuple[str, int] | None]:
        """(skipped, first failure) of a module checked and set up in one round trip."""
        nonce = secrets.token_hex(8)
        res = self.pool.run(host, scripts.bash(modules.module_script(mod, nonce)), timeout=self.command_timeout, idempotent=True)
        checks = modules.parse_batch(res.stdout, nonce, "c")
        for step, (output, code) in zip(mod.check, checks, strict=False):
            _log_step(log, step, output, code)
        if len(checks) == len(mod.check) and all(code == 0 for _, code in checks):
            return True, None
        if not any(code != 0 for _, code in checks):
            return False, (mod.check[len(checks)].label, res.exit_code or -1)
        ran = modules.parse_batch(res.stdout, nonce, "s")
        for step, (output, code) in zip(mod.setup, ran, strict=False):
            _log_step(log, step, output, code)
            if code != 0:
                return False, (step.label, code)
        if len(ran) < len(mod.setup):
            step = mod.setup[len(ran)]
            _log_step(log, step, res.stdout[-2000:] + res.stderr[-2000:], res.exit_code or -1)
            return False, (step.label, res.exit_code or -1)
        return False, None

    def _steps(self, host: Host, steps: list[modules.Step], log: _RedactedLog) -> tuple[str, int] | None:
        """Run steps in order, one SSH round trip per batch; (label, code) of the first failure."""
        for batch in modules.batches(steps):
            if len(batch) == 1 and isinstance(batch[0], modules.Put) and len(batch[0].data) > modules.INLINE_MAX:
                step = batch[0]
                res = self.pool.run(host, modules.put_command(step), timeout=self.command_timeout, stdin=step.data)
                _log_step(log, step, res.stdout + res.stderr, res.exit_code)
                if res.exit_code != 0:
                    return step.label, res.exit_code
                continue
            nonce = secrets.token_hex(8)
            # Setup modules are idempotent by design: a batch whose channel was lost may run again.
            res = self.pool.run(host, scripts.bash(modules.batch_script(batch, nonce)), timeout=self.command_timeout, idempotent=True)
            ran = modules.parse_batch(res.stdout, nonce)
            for step, (output, code) in zip(batch, ran, strict=False):
                _log_step(log, step, output, code)
                if code != 0:
                    return step.label, code
            if len(ran) < len(batch):
                step = batch[len(ran)]
                _log_step(log, step, res.stdout[-2000:] + res.stderr[-2000:], res.exit_code or -1)
                return step.label, res.exit_code or -1
        return None

    # -- start ---------------------------------------------------------------------------
    def start(
        self, job_id: str, attempt: int, hosts: list[Host], spec: Mapping, *,
        extra_args: list[str], resume: bool, workers: list[int] | str | None = None, placed: Placed | None = None,
    ) -> dict[int, int]:
        """Start the command detached on the selected hosts (`workers`: host ids; else the
        spec's command.workers, in every slice); returns {host id: pid}. `placed`: where the
        attempt runs, as the command's environment says (docs/placement.md). Idempotent per
        attempt: a repeated start returns the pid of the first and never runs the command
        twice. Raises StartFailed (with the pids that did start) when any host could not be
        started."""
        chosen = (self._select(hosts, workers) if workers is not None
                  else self._in_each_slice(hosts, (spec.get("command") or {}).get("workers", "all")))
        adir = layout.local_attempt_dir(self.log_dir, job_id, attempt)
        adir.mkdir(parents=True, exist_ok=True)
        extra = list((spec.get("recovery") or {}).get("error_patterns") or [])
        checkpoint = ((spec.get("job") or {}).get("checkpoints") or {}).get("pattern")
        # the names (never the values) of the secrets the attempt received: its output is
        # redacted of their values as it is collected, even by a reconciler started later
        _atomic_write(adir / "patterns.json", json.dumps({"error_patterns": extra, "checkpoint_pattern": checkpoint,
                                                          "secrets": secret_refs(spec)}))
        built = {h.id: scripts.bash(scripts.start_script(spec, job_id, attempt, h.worker, extra_args=extra_args, resume=resume,
                                                         slice_=h.slice, placed=placed)) for h in chosen}

        def one(h: Host) -> int | str:
            try:
                res = self.pool.run(h, built[h.id], timeout=self.command_timeout, idempotent=True)
            except RemoteError as exc:
                return str(exc)
            if res.exit_code != 0:
                return f"start script exited {res.exit_code}: {res.stderr.decode(errors='replace')[-500:]}"
            try:
                return scripts.parse_start(res.stdout)
            except ValueError as exc:
                return str(exc)

        results = self._parallel(chosen, one)
        pids = {w: v for w, v in results.items() if isinstance(v, int)}
        errors = {w: v for w, v in results.items() if isinstance(v, str)}
        if errors:
            raise StartFailed(pids, errors)
        return pids

    # -- probe ---------------------------------------------------------------------------
    def probe(
        self, job_id: str, attempt: int, hosts: list[Host], *, workers: list[int] | None = None,
        patterns_extra: list[str] | None = None,
    ) -> dict[int, HostStatus]:
        """One round of parallel SSH: each host's state, new output fetched by offset into
        the local log, and pattern matches in the new complete lines."""
        saved = self._saved_patterns(job_id, attempt)
        extra = patterns_extra if patterns_extra is not None else list(saved.get("error_patterns") or [])
        compiled = patterns.compile_patterns(extra)
        checkpoint = patterns.checkpoint_rx(saved.get("checkpoint_pattern"))
        chosen = self._select(hosts, workers)
        # Checkpoint lines are looked for on the first selected host only (the planner
        # records that one's): one regex pass per probe, not one per host.
        first = min((h.id for h in chosen), default=None)
        def one(h: Host) -> HostStatus:
            return self._probe_host(job_id, attempt, self._host(h), compiled, checkpoint if h.id == first else None)

        # Watched hosts answer from memory, here; only the others cost a thread and a round trip.
        watched = [h for h in chosen if self.watch and self.watchers.live((job_id, attempt, h.id))]
        others = [h for h in chosen if h not in watched]
        found = {h.id: one(h) for h in watched}
        found.update(self._parallel(others, lambda h: self._probe_host(
            job_id, attempt, h, compiled, checkpoint if h.id == first else None)) if others else {})
        return {h.id: found[h.id] for h in chosen}

    def _saved_patterns(self, job_id: str, attempt: int) -> dict:
        """What `start` saved of the attempt's spec: its error and checkpoint patterns."""
        p = layout.local_attempt_dir(self.log_dir, job_id, attempt) / "patterns.json"
        try:
            saved = json.loads(p.read_text())
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def _probe_host(self, job_id: str, attempt: int, host: Host, compiled: list[tuple[str, re.Pattern[str]]],
                    checkpoint: re.Pattern[str] | None) -> HostStatus:
        out = layout.output_log(self.log_dir, job_id, attempt, host.worker, host.slice)
        out.parent.mkdir(parents=True, exist_ok=True)
        offset = out.stat().st_size if out.exists() else 0
        key = (job_id, attempt, host.id)
        # An unfinished last line waits for its end only where secrets are masked (_collect):
        # otherwise the local log holds what a fetch by offset would, progress lines included.
        redact = self._attempt_redactor(job_id, attempt)
        streamed = self.watchers.take(key, MAX_FETCH, whole_lines=bool(redact)) if self.watch else None
        if streamed == b"":  # a live watcher and nothing new: no file to touch
            with self._scan_lock:
                step = self._checkpoint_steps.get((job_id, attempt, host.id))
            return HostStatus("running", output_bytes=offset, checkpoint=step)
        if streamed is not None:  # a live watcher: its process runs, its output is here
            ans = scripts.ProbeAnswer("running", None, offset, streamed)
        else:
            script = scripts.bash(scripts.probe_script(job_id, host.worker, attempt, offset, MAX_FETCH, host.slice))
            try:
                res = self.pool.run(host, script, timeout=self.probe_timeout, retries=self.probe_retries, idempotent=True,
                                    fail_fast=True)
                if res.exit_code != 0:
                    return HostStatus("unknown", error=f"probe exited {res.exit_code}: {res.stderr.decode(errors='replace')[-300:]}")
                ans = scripts.parse_probe(res.stdout)
            except (HostKeyMismatch, AuthFailed) as exc:
                return HostStatus("unknown", error=str(exc))
            except HostUnreachable as exc:
                return HostStatus("gone", error=str(exc))
            except (RemoteError, ValueError) as exc:
                return HostStatus("unknown", error=str(exc))
        if ans.state != "absent":
            _collect(out, ans.data, redact, final=ans.state in ("exited", "gone"))
        found = self._scan(job_id, attempt, host.id, out, final=ans.state in ("exited", "gone"),
                           compiled=compiled, fetched_from=offset, checkpoint=checkpoint)
        state = {"starting": "running", "absent": "gone"}.get(ans.state, ans.state)
        error = {"absent": "the attempt was never started on this host",
                 "gone": "the process is gone and left no exit code"}.get(ans.state)
        with self._scan_lock:
            step = self._checkpoint_steps.get((job_id, attempt, host.id))
        status = HostStatus(state, ans.exit_code, [m for _, m in found], error, [k for k, _ in found], ans.size + len(ans.data),  # type: ignore[arg-type]
                            checkpoint=step)
        if ans.state in ("exited", "gone"):
            _atomic_write(layout.status_file(self.log_dir, job_id, attempt, host.worker, host.slice),
                          json.dumps({"state": state, "exit_code": ans.exit_code, "error": error, "time": _now()}))
        elif streamed is None and self.watch and ans.state in ("running", "starting") and not self.watchers.legacy(key):
            self._arm(job_id, attempt, host, key, out.stat().st_size if out.exists() else 0)
        return status

    def _arm(self, job_id: str, attempt: int, host: Host, key: tuple[str, int, int], offset: int) -> None:
        """Open the host's watcher channel, streaming from `offset` (what is collected here).
        A host that cannot take one now is probed again next pass, and armed then."""
        try:
            chan = self.pool.open_channel(host)
            chan.exec_command(scripts.bash(scripts.watch_script(job_id, host.worker, attempt, offset, host.slice)))
        except Exception as exc:  # paramiko's own errors included: the probe said what matters
            log.debug("%s: no watcher for %s attempt %d: %s", host.label, job_id, attempt, exc)
            return
        self.watchers.arm(key, chan, host.label)

    def _scan(self, job_id: str, attempt: int, worker: int, out: Path, *, final: bool,
              compiled: list[tuple[str, re.Pattern[str]]],
              fetched_from: int, checkpoint: re.Pattern[str] | None = None) -> list[tuple[str, str]]:
        """Scan complete lines not scanned before; after a restart, lines that were already in
        the local log before this probe's fetch count as scanned (reported before the restart).
        The newest checkpoint line among them sets the step this host reports from now on
        (the output is fetched by offset, at most MAX_FETCH bytes a probe: the pattern runs
        here, on bounded lines, never in a shell on the host)."""
        key = (job_id, attempt, worker)
        if not out.exists():
            return []
        with self._scan_lock:
            start = self._scanned.get(key)
        with open(out, "rb") as f:
            if start is None:
                head = f.read(fetched_from)
                start = head.rfind(b"\n") + 1
            f.seek(start)
            data = f.read()
        end = len(data) if final else data.rfind(b"\n") + 1
        text = data[:end].decode(errors="replace")
        step = patterns.newest_step(text, checkpoint) if checkpoint is not None else None
        with self._scan_lock:
            self._scanned[key] = start + end
            if step is not None:
                self._checkpoint_steps[key] = step
        return patterns.scan(text, compiled)

    # -- stop ----------------------------------------------------------------------------
    def stop(self, job_id: str, attempt: int, hosts: list[Host], *, grace: float = 10,
             workers: list[int] | None = None, once: bool = False) -> dict[int, str | None]:
        """SIGTERM to each selected host's process group, SIGKILL after `grace` seconds.
        Returns {worker: error or None}; an unreachable host is reported, not raised.
        `once`: one dial a host, no retries (its TPU is deleted next)."""
        # stopping on purpose: its watchers' ending is no news to wake anyone for
        self.watchers.forget(lambda k: k[0] != job_id)

        def one(h: Host) -> str | None:
            script = scripts.bash(scripts.stop_script(job_id, h.worker, attempt, grace, h.slice))
            try:
                res = self.pool.run(h, script, timeout=grace + self.command_timeout, idempotent=True,
                                    retries=0 if once else None, fail_fast=once)
            except RemoteError as exc:
                return str(exc)
            return None if res.exit_code == 0 else f"stop exited {res.exit_code}: {res.stderr.decode(errors='replace')[-300:]}"

        return self._parallel(self._select(hosts, workers), one)

    def connect(self, hosts: list[Host], *, retries: int | None = None) -> dict[int, str | None]:
        """Open (or check) the connection to each host in parallel: {worker: error or None}.
        Useful right after a node turns READY, while its SSH servers may still be starting."""
        def one(h: Host) -> str | None:
            try:
                self.pool.connect(h, retries=retries)
                return None
            except RemoteError as exc:
                return str(exc)

        return self._parallel(hosts, one)

    def run(self, host: Host, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run one raw exec request (already quoted) on one host; for tools and tests."""
        return self.pool.run(self._host(host), command, timeout=timeout or self.command_timeout)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.watchers.close()
        self.pool.close()

    def __enter__(self) -> RemoteRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collect(out: Path, data: bytes, redact: Redactor, *, final: bool) -> None:
    """Append fetched output to the collected log, the secrets the job received masked.
    With secrets to mask, an unfinished last line waits for its end (it is fetched again
    next time: the log's size is where the next fetch starts), so a secret split across two
    fetches is still recognised."""
    if redact and not final:
        # a line longer than a whole fetch is collected as it comes: it cannot wait forever
        data = data[:complete(data) or (len(data) if len(data) >= MAX_FETCH else 0)]
    if data:
        with open(out, "ab") as f:
            f.write(redact(data))


class _RedactedLog:
    """A setup log that masks the job's secrets in whatever is written to it."""

    def __init__(self, raw: TextIO, redact: Redactor) -> None:
        self.raw, self.redact = raw, redact

    def write(self, text: str) -> None:
        self.raw.write(self.redact.text(text))

    def flush(self) -> None:
        self.raw.flush()


def _log_step(log: _RedactedLog, step: modules.Step, output: bytes, code: int) -> None:
    if isinstance(step, modules.Put):
        log.write(f"$ upload {step.label} ({len(step.data)} bytes, mode {step.mode:o})\n")
    else:
        log.write(f"$ {step.label}: {step.script}\n")
    if output:
        text = output.decode(errors="replace")
        log.write(text if text.endswith("\n") else text + "\n")
    log.write(f"-> exit {code}\n")
    log.flush()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
