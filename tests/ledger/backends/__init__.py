"""Store backends the contract tests run against.

Each module here defines `BACKEND`, an object with:
- `name: str` (the pytest param id);
- `skip_reason() -> str | None`: why this backend cannot run here (None = it can);
- `new_url(tmp_path) -> str`: the URL of a new, empty ledger (for `ledger.store.open_store`,
  also from child processes);
- `tamper(url, seq, data_json) -> None`: rewrite one stored event's `data` the way someone
  with database access would (disable the append-only guard, UPDATE, restore the guard);
- `raw_execute(url, sql) -> None`: run one SQL statement directly; errors propagate;
- `cleanup(urls) -> None`: drop what `new_url` made (called at teardown).

Adding a backend = adding a module; the tests do not change.
"""
