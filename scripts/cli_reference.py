"""Writes the generated references, so they never drift from the commands: docs/cli.md (every
--help), docs/config.md (every setting) and ledger/app/settings.json (the settings index the
config file is checked against). tests/ops/test_config.py checks they are current."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ledger.app import config, reference  # noqa: E402
from ledger.app.cli import cli  # noqa: E402

OUTPUTS = {
    "docs/cli.md": reference.cli_markdown,
    "docs/config.md": reference.config_markdown,
    f"ledger/app/{config.INDEX_FILE}": reference.index_json,
}


def main() -> None:
    for name, render in OUTPUTS.items():
        (ROOT / name).write_text(render(cli))
        print(f"wrote {name}")


if __name__ == "__main__":
    main()
