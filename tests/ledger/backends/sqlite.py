from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path


class SQLiteBackend:
    name = "sqlite"

    def skip_reason(self) -> str | None:
        return None

    def new_url(self, tmp_path: Path) -> str:
        n = len(list(tmp_path.glob("ledger-*.db")))
        return f"sqlite:///{tmp_path / f'ledger-{n}.db'}"

    @staticmethod
    def _path(url: str) -> str:
        return url.removeprefix("sqlite:///")

    def tamper(self, url: str, seq: int, data_json: str) -> None:
        # Through the sqlite3 shell when there is one, as a person would do it.
        script = (
            "DROP TRIGGER events_no_update;\n"
            f"UPDATE events SET data = '{data_json.replace(chr(39), chr(39) * 2)}' WHERE seq = {int(seq)};\n"
            "CREATE TRIGGER events_no_update BEFORE UPDATE ON events\n"
            "BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: events cannot be updated'); END;\n"
        )
        try:
            subprocess.run(["sqlite3", self._path(url)], input=script, text=True, check=True, capture_output=True, timeout=60)
        except FileNotFoundError:
            db = sqlite3.connect(self._path(url), isolation_level=None)
            try:
                db.executescript(script)
            finally:
                db.close()

    def raw_execute(self, url: str, sql: str) -> None:
        db = sqlite3.connect(self._path(url), isolation_level=None)
        try:
            db.execute(sql)
        finally:
            db.close()

    def cleanup(self, urls: list[str]) -> None:
        pass  # files live in tmp_path


BACKEND = SQLiteBackend()
