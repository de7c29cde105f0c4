"""Normalization: defaults, recovery rules, aliases, interpolation, names, hashes, policy."""

from __future__ import annotations

import re

import pytest

from ledger.spec.config import load_repo_config
from ledger.spec.model import spec_hash
from ledger.spec.names import default_tpu_name, job_id_for, job_id_from_path
from ledger.spec.normalize import command_args, validate_text
from ledger.spec.policy import ApprovalPolicy, NotifyOwner, Policy
from ledger.spec.recovery import SHORTHAND, recovery_rules

BASE = "tpu: {{accelerator: {acc}, zone: {zone}, pricing: {pricing}}}\ncommand: {{cmd: python train.py}}\n"


def spec_of(text: str, config, path: str = "jobs/alice/job.yaml") -> dict:
    result = validate_text(text, path, config)
    assert result.ok, [m.format() for m in result.errors]
    return result.spec


def base(pricing: str = "ondemand", acc: str = "v4-8", zone: str = "us-central2-b") -> str:
    return BASE.format(acc=acc, zone=zone, pricing=pricing)


@pytest.mark.parametrize(
    "pricing, preempted, grpc",
    [("spot", "reapply", "resume"), ("preemptible", "reapply", "resume"), ("ondemand", "pass", "resume")],
)
def test_recovery_defaults_follow_pricing(pricing, preempted, grpc, config):
    spec = spec_of(base(pricing), config)
    rules = recovery_rules(spec)
    assert (rules["on_preempted"], rules["on_grpc_error"], rules["on_failure"]) == (preempted, grpc, "pass")
    assert rules["max_restarts"] == 5 and rules["pass_attempt"] is False and rules["attempt_flag"] is None


def test_reserved_tpu_defaults_like_ondemand(config):
    spec = spec_of(base("reserved").replace("pricing: reserved", "pricing: reserved, reservation: lab-v4"), config)
    assert spec["tpu"]["reservation"] == "lab-v4"
    assert (spec["recovery"]["on_preempted"], spec["recovery"]["on_grpc_error"]) == ("pass", "resume")


@pytest.mark.parametrize("rule", sorted(SHORTHAND))
def test_shorthand_rules_map_to_the_three_kinds(rule, config):
    spec = spec_of(base("spot") + f"recovery: {rule}\n", config)
    assert {k: spec["recovery"][k] for k in SHORTHAND[rule]} == SHORTHAND[rule]
    assert spec["recovery"]["rule"] == rule


def test_shorthand_table_is_the_tpu_tools():
    assert SHORTHAND["pre"] == {"on_preempted": "reapply", "on_grpc_error": "resume"}
    assert SHORTHAND["rerun"] == {"on_preempted": "reapply", "on_grpc_error": "rerun"}
    assert SHORTHAND["resume"] == {"on_preempted": "pass", "on_grpc_error": "resume"}
    assert SHORTHAND["pass"] == {"on_preempted": "pass", "on_grpc_error": "pass"}


def test_explicit_kinds_beat_the_rule_and_attempt_flag_implies_passing(config):
    text = base("spot") + "recovery: {rule: pass, on_grpc_error: rerun, on_failure: resume, max_restarts: 2, attempt_flag: --stage}\n"
    rules = recovery_rules(spec_of(text, config))
    assert rules == {
        "on_preempted": "pass", "on_grpc_error": "rerun", "on_failure": "resume", "max_restarts": 2,
        "on_host_unhealthy": "reapply", "on_tpu_busy": "resume",  # the host kinds' defaults
        "error_patterns": [], "pass_attempt": True, "attempt_flag": "--stage",
    }


def test_recovery_rules_of_a_bare_spec_uses_pricing():
    assert recovery_rules({"tpu": {"pricing": "spot"}})["on_preempted"] == "reapply"
    assert recovery_rules({})["on_preempted"] == "pass"


def test_workers_are_normalized(config):
    assert spec_of(base() , config)["command"]["workers"] == [0]
    pod = base(acc="v4-32")
    assert spec_of(pod.replace("cmd: python train.py", "cmd: go, workers: 3"), config)["command"]["workers"] == [3]
    assert spec_of(pod.replace("cmd: python train.py", "cmd: go, workers: [2, 0]"), config)["command"]["workers"] == [0, 2]
    assert spec_of(pod.replace("cmd: python train.py", "cmd: go, workers: all"), config)["command"]["workers"] == "all"


def test_pod_without_workers_warns(config):
    result = validate_text(base(acc="v4-32"), "jobs/alice/pod.yaml", config)
    assert result.ok
    assert [m.pointer for m in result.warnings] == ["/command"]
    assert "workers: all" in result.warnings[0].hint and result.warnings[0].severity == "warning"


def test_zone_without_the_family_warns_but_validates(config):
    result = validate_text(base(zone="europe-west4-a"), "jobs/alice/x.yaml", config)
    assert result.ok
    assert result.warnings[0].pointer == "/tpu/zone" and "us-central2-b" in result.warnings[0].hint


def test_defaults_fill_every_section(config):
    spec = spec_of(base(), config)
    assert set(spec) == {"job", "tpu", "gcsfuse", "ssh", "docker", "conda", "venv", "setup", "command", "recovery", "args", "priority"}
    assert spec["job"] == {"name": "job", "env_type": "none", "loop": False, "tags": [], "priority": 500, "notes": None}
    tpu = spec["tpu"]
    assert tpu["allocation_mode"] == "tpu-vm" and tpu["version"] == "tpu-ubuntu2204-base"
    assert tpu["shared"] is False and tpu["hosts"] == 1 and tpu["chips"] == 4
    assert tpu["network"] == {"enable_external_ips": True, "can_ip_forward": False}
    assert tpu["name"] == default_tpu_name("alice/job")
    assert spec["setup"] == {"modules": ["command"]}
    assert spec["gcsfuse"] is None and spec["docker"] is None


def test_setup_modules_default_to_configured_sections_in_order(config):
    text = base() + "docker: {image: img, env_vars: {HOME: /home/u, DEBUG: true}}\ngcsfuse: {bucket_name: my-bucket, mount_path: /mnt/b}\nssh: {private_key: secret://id_rsa}\n"
    spec = spec_of(text, config)
    assert spec["setup"]["modules"] == ["ssh", "gcsfuse", "docker", "command"]
    assert spec["docker"]["env_vars"] == ["HOME=/home/u", "DEBUG=true"]
    assert spec["job"]["env_type"] == "docker"


def test_interpolation(config):
    text = (
        "job: {name: 'bert ${tpu.accelerator}', tags: [a]}\n"
        "tpu: {accelerator: v4-8, zone: us-central2-b, name: 'alice-${tpu.accelerator}'}\n"
        "command:\n  cmd: echo ${HOME} $USER ${tpu.name} ${job.loop}\n  env: {TAGS: '${job.name}'}\n"
    )
    spec = spec_of(text, config)
    assert spec["tpu"]["name"] == "alice-v4-8"
    assert spec["job"]["name"] == "bert v4-8"
    assert spec["command"]["cmd"] == "echo ${HOME} $USER alice-v4-8 false"  # shell variables untouched
    assert spec["command"]["env"] == {"TAGS": "bert v4-8"}


def test_interpolated_tpu_name_must_be_valid(config):
    text = "tpu: {accelerator: v4-8, zone: us-central2-b, name: 'Alice_${tpu.accelerator}'}\ncommand: {cmd: go}\n"
    result = validate_text(text, "jobs/alice/x.yaml", config)
    assert [m.pointer for m in result.errors] == ["/tpu/name"]
    assert "'Alice_v4-8' is not valid on Google Cloud" in result.errors[0].message


def test_args_resolve_through_aliases_into_flags(config):
    text = base() + "args: {lr: 0.01, config.training.num_epochs: 10, b1: true, wd: null, bs: 8}\n"
    spec = spec_of(text, config)
    assert spec["command"]["args_flags"] == command_args(spec, config) == [
        "--config.training.learning_rate=0.01",
        "--config.training.num_epochs=10",
        "--config.training.adam_b1=True",
        "--config.training.weight_decay=None",
        "--config.training.batch_size=8",
    ]


def test_two_args_for_one_flag_is_an_error(config):
    result = validate_text(base() + "args: {lr: 0.1, config.training.learning_rate: 0.2}\n", "jobs/alice/x.yaml", config)
    assert "both set config.training.learning_rate" in result.errors[0].message


def test_priority_names_and_agreement(config):
    assert spec_of(base() + "job: {priority: high}\n", config)["priority"] == 750
    assert spec_of(base() + "priority: 42\n", config)["job"]["priority"] == 42
    result = validate_text(base() + "priority: 1\njob: {priority: 2}\n", "jobs/alice/x.yaml", config)
    assert result.errors[0].pointer == "/priority"


def test_spec_hash_ignores_layout_and_order_but_not_values(config):
    a = spec_of("command: {cmd: go}\ntpu: {zone: us-central2-b, accelerator: v4-8}\n", config)
    b = spec_of("# a comment\ntpu:\n  accelerator: v4-8\n  zone: us-central2-b\ncommand:\n  cmd: go\n", config)
    c = spec_of("command: {cmd: go!}\ntpu: {zone: us-central2-b, accelerator: v4-8}\n", config)
    assert spec_hash(a) == spec_hash(b) != spec_hash(c)
    assert re.fullmatch(r"[0-9a-f]{64}", spec_hash(a))


@pytest.mark.parametrize("owner, name", [("run", "false"), ("v2-32-2", "run"), ("false", "v2-32-2"), ("a1", "0"), ("alice", "bert_large-2")])
def test_awkward_words_are_just_names(owner, name, config):
    result = validate_text(base(), f"jobs/{owner}/{name}.yaml", config)
    assert result.ok and result.job_id == f"{owner}/{name}"
    tpu_name = result.spec["tpu"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", tpu_name) and len(tpu_name) <= 63


@pytest.mark.parametrize(
    "path, needle, hint",
    [
        ("jobs/Alice/x.yaml", "uppercase", "'alice'"),
        ("jobs/élodie/x.yaml", "non-ASCII", "'elodie'"),
        ("jobs/张伟/x.yaml", "non-ASCII", "rename it"),
        ("jobs/alice/x.yml", "not .yml", "x.yaml"),
        ("jobs/x.yaml", "not at jobs/<owner>/<name>.yaml", "move the file"),
        ("jobs/alice/sub/x.yaml", "not at jobs/<owner>/<name>.yaml", "move the file"),
        ("other/alice/x.yaml", "not at jobs/<owner>/<name>.yaml", "move the file"),
        ("jobs/alice/-x.yaml", "may use only", "'x'"),
        ("jobs/al--ice/x.yaml", "may use only", "'al-ice'"),
        ("jobs/alice/x y.yaml", "may use only", "'x-y'"),
        ("jobs/alice/" + "n" * 64 + ".yaml", "longer than 63", "rename"),
    ],
)
def test_bad_paths_are_refused_clearly(path, needle, hint, config):
    result = validate_text(base(), path, config)
    assert not result.ok and result.job_id is None and result.spec is None
    m = result.errors[0]
    assert m.pointer == "" and needle in m.message and hint in m.hint, m.format()


def test_default_tpu_names_do_not_collide():
    names = {default_tpu_name(j) for j in ("a-b/c", "a/b-c", "a/b_c", "ab/c")}
    assert len(names) == 4
    assert job_id_from_path("jobs/a/b.yaml")[0] == "a/b"


def test_shared_tpu_by_alias_and_by_full_name(config):
    by_alias = spec_of("tpu: v4-32-py2\ncommand: {cmd: go, workers: all}\n", config)
    by_name = spec_of("tpu: {name: kmh-tpuvm-v4-32-py2, shared: true}\ncommand: {cmd: go, workers: all}\n", config)
    assert by_alias["tpu"] == by_name["tpu"]
    assert by_alias["tpu"]["hosts"] == 4 and by_alias["tpu"]["zone"] == "us-central2-b"
    assert by_alias["recovery"]["on_preempted"] == "reapply"  # spot, from aliases.yaml


def test_policy_defaults_and_limits():
    cfg = load_repo_config(policy_text=(
        "defaults:\n  recovery: {max_restarts: 7, on_failure: rerun}\n  job: {tags: [lab]}\n"
        "  tpu: {zone: us-central2-b}\n  command: {env: {WANDB_MODE: offline}}\n"
        "limits: {max_restarts: 8, accelerators: [v4-8, v4-32], max_priority: 600}\n"
    ))
    assert cfg.errors == ()
    spec = spec_of("tpu: {accelerator: v4-8}\ncommand: {cmd: go, env: {A: '1'}}\n", cfg)
    assert spec["tpu"]["zone"] == "us-central2-b"
    assert spec["recovery"]["max_restarts"] == 7 and spec["recovery"]["on_failure"] == "rerun"
    assert spec["job"]["tags"] == ["lab"]
    assert spec["command"]["env"] == {"WANDB_MODE": "offline", "A": "1"}
    # A rule in the spec beats the policy's per-kind defaults.
    spec = spec_of("tpu: {accelerator: v4-8}\ncommand: {cmd: go}\nrecovery: pass\n", cfg)
    assert spec["recovery"]["on_failure"] == "pass" and spec["recovery"]["max_restarts"] == 7
    result = validate_text("tpu: {accelerator: v4-16}\ncommand: {cmd: go}\nrecovery: {max_restarts: 9}\njob: {priority: 700}\n", "jobs/a/b.yaml", cfg)
    assert {m.pointer for m in result.errors} == {"/tpu/accelerator", "/recovery/max_restarts", "/job/priority"}
    # A shared TPU takes nothing from the policy's tpu defaults.
    shared = load_repo_config(aliases_text="tpus: {t1: {name: t1, zone: us-central1-a, accelerator: v2-8}}\n",
                              policy_text="defaults: {tpu: {zone: us-central2-b}}\n")
    assert spec_of("tpu: t1\ncommand: {cmd: go}\n", shared)["tpu"]["zone"] == "us-central1-a"


def test_error_from_a_policy_default_says_so():
    cfg = load_repo_config(policy_text="defaults:\n  tpu: {zone: nowhere}\n")
    result = validate_text("tpu: {accelerator: v4-8}\ncommand: {cmd: go}\n", "jobs/a/b.yaml", cfg)
    assert result.errors[0].pointer == "/tpu/zone"
    assert "(value from .ledger/policy.yaml defaults)" in result.errors[0].message


def test_repo_config_defaults_and_errors():
    empty = load_repo_config()
    assert empty.policy == Policy()
    assert (empty.policy.approval.mode, empty.policy.approval.approvers) == ("either", None)
    assert empty.aliases["config"]["lr"] == "config.training.learning_rate" and empty.aliases["tpus"] == {}
    cfg = load_repo_config(
        aliases_text="tpus:\n  x: {name: Bad_Name, zone: us-central1-a, accelerator: v2-8}\n",
        policy_text="approval: {mode: sometimes, required: 0}\nnotify: {owners: {alice: {email: a@b.c, opt_out: true}}}\n",
    )
    pointers = {(m.file, m.pointer) for m in cfg.errors}
    assert (".ledger/aliases.yaml", "/tpus/x/name") in pointers
    assert (".ledger/policy.yaml", "/approval/mode") in pointers and (".ledger/policy.yaml", "/approval/required") in pointers
    assert all(m.line >= 1 for m in cfg.errors)
    good = load_repo_config(policy_text="approval: {mode: trailers, required: 2, approvers: [alice@lab.org]}\nnotify: {owners: {alice: {email: a@b.c, opt_out: true}}, webhook: 'https://hooks.example/x'}\n")
    assert good.errors == ()
    assert good.policy.approval == ApprovalPolicy(mode="trailers", required=2, approvers=("alice@lab.org",))
    assert good.policy.notify.owners["alice"] == NotifyOwner("a@b.c", frozenset({"webhook", "email"}))


def test_empty_config_files_mean_defaults():
    cfg = load_repo_config(aliases_text="# nothing yet\n", policy_text=b"")
    assert cfg.errors == ()
    assert cfg.policy == Policy() and cfg.aliases["tpus"] == {}


def test_job_paths_and_ignored_examples(config):
    from ledger.spec.files import is_ignored
    from ledger.spec.layout import is_job_path

    assert is_job_path("jobs/alice/x.yaml") and is_job_path("jobs/Alice/x.yml")
    assert not is_job_path("jobs/README.md") and not is_job_path(".ledger/policy.yaml")
    # the watcher's stream for a path: the parts unchecked (a bad name is rejected under it)
    assert job_id_for("jobs/Alice/x.yml") == "Alice/x" and job_id_for("jobs/alice/x.yaml") == "alice/x"
    assert job_id_for("jobs/alice/deep/x.yaml") is None and job_id_for("jobs//x.yaml") is None
    assert job_id_for("jobs/alice/.yaml") is None and job_id_for("jobs/alice/x.json") is None
    assert is_ignored("jobs/examples/pod.yaml", config) and not is_ignored("jobs/alice/pod.yaml", config)


def test_a_shared_tpu_name_without_shared_true_gets_a_precise_hint(config):
    result = validate_text("tpu: {name: kmh-tpuvm-v2-32-6}\ncommand: {cmd: go}\n", "jobs/a/b.yaml", config)
    assert [m.pointer for m in result.errors] == ["/tpu/accelerator"]
    assert "add `shared: true`" in result.errors[0].hint
