"""Operating the services: Prometheus metrics, /healthz and /readyz, heartbeats.

`metrics.py` defines every metric; `collectors.py` computes gauges at scrape time from what
a service holds; `health.py` the readiness checks; `server.py` the `--metrics-address`
listener; `heartbeat.py` the row each instance keeps in the store; `service.py` puts them
together for a command. docs/metrics.md is the operator's side of it.
"""
