"""The shipped alert rules and Grafana dashboard: valid for promtool, firing when they
should (promtool test rules), and naming only metrics tpu-ledger exports."""

from __future__ import annotations

import importlib.resources
import json
import re
import subprocess
from pathlib import Path

from ledger.app.observability.metrics import COUNTERS, GAUGES

RESOURCES = importlib.resources.files("ledger") / "resources" / "observability"
HERE = Path(__file__).parent

# What the code defines: scrape-time gauges and counters here, the rest registered as
# prometheus_client objects (their series names with suffixes).
DEFINED = set(GAUGES) | {f"{c}_total" for c in COUNTERS} | {
    "tpu_ledger_events_appended_total", "tpu_ledger_tpu_api_calls_total", "tpu_ledger_tpu_api_errors_total",
    "tpu_ledger_ssh_errors_total", "tpu_ledger_snapshot_save_failures_total",
    *(f"{h}_{s}" for h in ("tpu_ledger_reconcile_pass_duration_seconds", "tpu_ledger_tpu_api_call_duration_seconds",
                           "tpu_ledger_preemption_recreate_seconds", "tpu_ledger_snapshot_save_duration_seconds")
      for s in ("bucket", "count", "sum")),
}


def _names(text: str) -> set[str]:
    return set(re.findall(r"\btpu_ledger_[a-z_]+", text))


def test_promtool_checks_the_rules(promtool: str) -> None:
    rules = Path(str(RESOURCES / "alerts.yml"))
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 8 rules found" in out.stdout


def test_the_rules_fire_when_they_should(promtool: str, tmp_path: Path) -> None:
    tests = (HERE / "alerts_test.yml").read_text().replace("ALERTS_FILE", str(RESOURCES / "alerts.yml"))
    (tmp_path / "alerts_test.yml").write_text(tests)
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "alerts_test.yml")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_and_dashboard_name_only_metrics_we_export() -> None:
    rules = (RESOURCES / "alerts.yml").read_text()
    dashboard = json.loads((RESOURCES / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for used in (_names(rules), _names(exprs)):
        assert used and used <= DEFINED, sorted(used - DEFINED)


def test_the_docs_list_every_metric(repo_root: Path) -> None:
    doc = (repo_root / "docs" / "metrics.md").read_text()
    missing = {n for n in DEFINED if n.rsplit("_", 1)[-1] not in ("bucket", "count", "sum") and n not in doc}
    assert not missing, sorted(missing)
