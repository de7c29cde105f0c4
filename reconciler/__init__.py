"""The reconciler: replay the ledger, observe TPUs and hosts, plan, act, record."""
