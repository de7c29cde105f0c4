"""tpu-ledger: a GitOps, event-sourced job manager for Cloud TPU training jobs."""

__version__ = "0.1.0"
