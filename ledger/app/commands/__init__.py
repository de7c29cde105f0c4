"""The `ledger` subcommands: one module per group of related commands.

`COMMANDS` maps each command's name to where it is defined. The CLI imports a module only
when one of its commands runs (or `--help` lists them all), so `ledger validate` in a
pre-commit hook never pays for gRPC, paramiko or the Pub/Sub client. A new command: write it
in a module here and add a line to this table.
"""

from __future__ import annotations

COMMANDS: dict[str, str] = {
    # the jobs repository
    "init": "init:init_cmd",
    "validate": "validate:validate_cmd",
    "plan": "watch:plan_cmd",
    # git -> events
    "watch": "watch:watch_cmd",
    "ingest": "watch:ingest_cmd",
    "install-hook": "watch:install_hook_cmd",
    # events -> TPUs -> events, and the audited overrides
    "reconcile": "reconcile:reconcile",
    "cancel": "overrides:cancel",
    "resume": "overrides:resume",
    "rerun": "overrides:rerun",
    "tpus": "tpus:tpus",
    "admit": "overrides:admit_cmd",
    "queue": "queue:queue_cmd",
    "doctor": "doctor:doctor_cmd",
    # questions to the ledger
    "replay": "replay:replay_cmd",
    "inspect": "inspect:inspect_cmd",
    "list": "list:list_cmd",
    "logs": "logs:logs",
    "tail": "fanout:tail_cmd",
    "usage": "usage:usage_cmd",
    "dashboard": "dashboard:dashboard_cmd",
    "status": "status:status_cmd",
    # the ledger's integrity and portability
    "verify": "verify:verify_cmd",
    "export": "export:export_cmd",
    "import": "export:import_cmd",
    "migrate": "migrate:migrate_command",
    "checkpoint": "checkpoint:checkpoint_cmd",
    "backup": "backup:backup_cmd",
    "restore": "backup:restore_cmd",
    "upgrade": "upgrade:upgrade_cmd",
    # fan-out
    "fanout": "fanout:fanout_cmd",
    "notify": "fanout:notify_cmd",
    # rehearsal
    "emulator": "emulator:emulator_group",
    "demo": "demo:demo",
    "chaos": "chaos:chaos_cmd",
    # operating it
    "config": "settings:config_cmd",
    "deploy": "deploy:deploy_group",
}
