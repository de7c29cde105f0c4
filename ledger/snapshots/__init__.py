"""The job-state snapshot: its index (`columns`), its encoding (`jobs`), its lazy reader
(`lazy`), and the plain-data unpickler every kind of snapshot is read with (`plain`).
ledger.replay checks a stored snapshot and folds the events after it."""
