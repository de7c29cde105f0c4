"""`ledger dashboard`: a read-only web view of the ledger, live by Server-Sent Events.

- `live`: the one live read model per server: the ledger's state and usage, folded
  incrementally from the store's tail, and the fan-out of new events to the pages.
- `views`, `timeline`, `weeks`, `charts`: pure functions from that state to what a page or
  `/api/` shows (the CLI's `--json` shapes come from `ledger.app.readmodels`).
- `server`: the Starlette application: GET routes only, templates and static assets shipped
  in this package, a strict Content-Security-Policy.

docs/dashboard.md explains each page.
"""
