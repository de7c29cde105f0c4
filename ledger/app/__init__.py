"""The application shell: the `ledger` CLI, the demo, and the wiring of settings to adapters.

Nothing in the core (`ledger.*` outside `ledger.app`) or in `reconciler` imports this
package; it is the one place that knows every part (see docs/architecture.md).
"""
