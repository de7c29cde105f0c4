"""Writes ledger/resources/schemas/event.schema.json from the event classes (ledger/events).

    python scripts/event_schema.py          # write it
    python scripts/event_schema.py --check  # exit 1 when the committed file differs

The schema is generated, never edited: change the classes in ledger/events/ and run
`make schemas`. tests/ledger/test_events_schema.py fails when the file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ledger.events.schema import schema_text  # noqa: E402

TARGET = Path(__file__).resolve().parent.parent / "ledger" / "resources" / "schemas" / "event.schema.json"


def main() -> int:
    text = schema_text()
    if "--check" in sys.argv[1:]:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is stale: run `make schemas`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
