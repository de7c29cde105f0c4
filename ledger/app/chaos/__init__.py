"""`ledger chaos`: the real services under random, bounded faults, and the invariants as figures.

scenario (settings, seeded schedule) -> world (ledger, jobs hub) -> procs (the services as
child processes) -> faults (kill -9, the emulator's control API) -> sampler (what the cloud
holds) -> report (the invariants); run.py puts them together.
"""
