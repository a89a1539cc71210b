"""The schema files ``storage/schema/NNN_name.sql``: their versions, statements and tables.

A file holds one or more statements separated by ``;`` at the end of a line, with two
placeholders, both validated before they are filled: ``{database}`` (identifier) and
``{ttl_days}`` (positive integer). Applying them to a store is :mod:`.migrations`; their
cluster form is :mod:`.cluster`; both read the files through this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from inferpath.storage.url import validate_identifier

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
MAX_TTL_DAYS = 3650
_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*(?:\n|$)")


@dataclass(frozen=True)
class Migration:
    """One schema file: ``version`` (from the ``NNN_`` prefix), ``name``, raw ``sql`` text."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """sha256 of the raw file text, recorded so a changed file can be noticed."""
        return sha256(self.sql.encode()).hexdigest()

    def statements(self, database: str, ttl_days: int, ttl_days_by_table: Mapping[str, int] | None = None) -> list[str]:
        """The file's statements with placeholders filled; comments-only chunks dropped.

        ``ttl_days_by_table`` (table name → days) overrides ``ttl_days`` in the statement
        that creates that table. Raises ``ValueError`` for a bad database name or TTL.
        """
        validate_identifier(database)
        validate_ttl_days(ttl_days)
        overrides = {
            validate_identifier(t, "table"): validate_ttl_days(d) for t, d in (ttl_days_by_table or {}).items()
        }
        out = []
        for raw in self.raw_statements():
            created = created_table(raw)
            days = overrides.get(created, ttl_days) if created else ttl_days
            out.append(raw.replace("{database}", database).replace("{ttl_days}", str(days)))
        return out

    def raw_statements(self) -> list[str]:
        """The file's statements with placeholders left in; comments-only chunks dropped."""
        # Whole-line comments go first so that a ';' ending a comment line splits nothing.
        code = "\n".join(line for line in self.sql.splitlines() if not line.lstrip().startswith("--"))
        return [chunk.strip() for chunk in _STATEMENT_END.split(code) if chunk.strip()]


_CREATE_TABLE = re.compile(
    r"^CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+`\{database\}`\.([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE
)


def created_table(raw_statement: str) -> str | None:
    """The table a raw ``CREATE TABLE IF NOT EXISTS `{database}`.name`` statement creates, else None."""
    match = _CREATE_TABLE.match(raw_statement.strip())
    return match.group(1) if match else None


def validate_ttl_days(ttl_days: int) -> int:
    """Return ``ttl_days`` if it is an int in 1..3650, else raise ``ValueError`` naming it."""
    if isinstance(ttl_days, bool) or not isinstance(ttl_days, int) or not 1 <= ttl_days <= MAX_TTL_DAYS:
        raise ValueError(f"ttl_days must be an integer in 1..{MAX_TTL_DAYS}, got {ttl_days!r}")
    return ttl_days


def load_migrations(schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """All migration files of ``schema_dir`` sorted by version.

    Raises ``ValueError`` for a ``.sql`` file with a malformed name or a duplicate version.
    """
    found: dict[int, Migration] = {}
    for path in sorted(schema_dir.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise ValueError(f"schema file name must look like 001_name.sql: {path.name}")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two schema files share version {version:03d}: {path.name}")
        found[version] = Migration(version, match.group(2), path.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


__all__ = ["MAX_TTL_DAYS", "SCHEMA_DIR", "Migration", "created_table", "load_migrations", "validate_ttl_days"]
