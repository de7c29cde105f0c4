#!/usr/bin/env bash
# Start the real peers the tests talk to, where this machine does not run them yet.
set -euo pipefail

# PostgreSQL on 127.0.0.1:5432 (trust auth) for the shared-store tests.
if command -v pg_ctlcluster >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

# OpenSSH server binary for the real-sshd tests (the fixture starts it; no service runs).
if [ ! -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null) || \
    echo "warning: could not install openssh-server; real-sshd tests will be skipped" >&2
fi
mkdir -p -m755 /run/sshd 2>/dev/null || true

# systemd-analyze checks the unit files `ledger deploy systemd` writes (tests/ops/test_deploy.py).
if ! command -v systemd-analyze >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null) || \
    echo "warning: could not install systemd; the unit files cannot be verified" >&2
fi
# Chromium and its driver for the dashboard's browser tests (Selenium drives the system
# browser; a browser download of its own is not reachable here).
if { ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; } && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || \
    echo "warning: could not install chromium and chromium-driver; the dashboard's browser tests will be skipped" >&2
fi

# promtool (Debian's prometheus package) checks the shipped alert rules: `promtool check rules`
# and `promtool test rules` in tests/observability.
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) || \
    echo "warning: could not install prometheus (promtool); the alert-rule tests will be skipped" >&2
fi
