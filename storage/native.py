"""Rows serialized as ClickHouse Native blocks ahead of their insert.

The span ingest path serializes each export's rows where it decodes them (a decode worker
process, :mod:`inferpath.server.decode_workers`), so that the server's drainer only joins
bytes and hands them to the store: transposing rows and clickhouse-connect's column writers
had taken ~3 µs of the server's GIL per span (bench/README.md, ``server_ingest``).

Format: ClickHouse's ``Native`` format (https://clickhouse.com/docs/interfaces/formats/Native),
a stream of blocks, each ``column count, row count`` (LEB128) and then per column its name,
its type name and its values. Blocks written by :class:`NativeBlockWriter` carry no
``INSERT`` statement, so several of them joined are one valid Native stream; ClickHouse
squashes the blocks of one INSERT into one part per partition as it does for
clickhouse-connect's own multi-block inserts. The values are written by clickhouse-connect's
type classes, the same code that ``Client.insert`` runs, except for an ``Array`` column whose
every value is empty (the span table's seven ``Events.*``/``Links.*`` columns, for nearly
every span): that one is the type's column prefix, taken from clickhouse-connect's own
output for one empty array, and one zero ``UInt64`` offset per row, which is what
clickhouse-connect writes for it, without its loop over the rows (~0.08 µs per span and
column; bench/README.md, ``worker_gc`` section).
"""

from __future__ import annotations

from typing import Any, Sequence

from clickhouse_connect.datatypes.registry import get_from_name
from clickhouse_connect.driver.common import write_leb128
from clickhouse_connect.driver.insert import InsertContext

__all__ = ["NativeBlockWriter"]


class NativeBlockWriter:
    """Writes rows for ``column_names`` of types ``type_names`` (ClickHouse type names, as
    ``DESCRIBE TABLE`` gives them, e.g. ``DateTime64(9)``) as one Native block.

    The block header and each column's name and type are written here; the values by the
    type's ``write_column``, with an insert context built without data. (An ``InsertContext``
    given data keeps a bound method of itself: a reference cycle that holds the rows until
    Python's cycle collector runs, which on the ingest path can be minutes.) One writer may
    serve several threads. Raises ``ValueError`` when the two sequences differ in length or a type name is unknown.
    """

    def __init__(self, column_names: Sequence[str], type_names: Sequence[str]) -> None:
        names, types = tuple(column_names), tuple(type_names)
        if len(names) != len(types) or not names:
            raise ValueError(f"need one type name per column, got {len(names)} columns and {len(types)} types")
        try:
            self._types = [get_from_name(name) for name in types]
        except Exception as exc:  # noqa: BLE001 - the registry raises several kinds
            raise ValueError(f"unknown ClickHouse type among {types!r}: {exc}") from exc
        self.column_names = names
        self.type_names = types
        self._headers = []
        for name, ch_type in zip(names, self._types):
            header = bytearray()
            for text in (name.encode(), ch_type.insert_name.encode()):
                write_leb128(len(text), header)
                header += text
            self._headers.append(bytes(header))
        # Per Array column, the bytes before the offsets, as clickhouse-connect writes them
        # for a column of one empty array (prefix + one zero UInt64 offset); None elsewhere.
        self._empty_array_prefixes: list[bytes | None] = []
        for name, ch_type, type_name in zip(names, self._types, types):
            prefix = None
            if type_name.startswith("Array("):
                sample = bytearray()
                self._write(name, ch_type, ((),), sample, self._context())
                if sample.endswith(bytes(8)):
                    prefix = bytes(sample[:-8])
            self._empty_array_prefixes.append(prefix)

    def _context(self) -> InsertContext:
        # Built without data: given data, an InsertContext keeps a bound method of itself.
        return InsertContext("native_block", self.column_names, self._types, None, column_oriented=True)

    @staticmethod
    def _write(name: str, ch_type: Any, column: Sequence[Any], out: bytearray, context: InsertContext) -> None:
        context.start_column(name)
        try:
            ch_type.write_column(column, out, context)
        except Exception as exc:  # noqa: BLE001 - the type classes raise several kinds
            raise ValueError(f"column {name!r}: {type(exc).__name__}: {exc}") from exc

    def block(self, rows: Sequence[Sequence[Any]]) -> bytes:
        """``rows`` (each in column order; times as the column types take them, e.g. ns
        ticks for ``DateTime64(9)``) as one Native block; ``b""`` for no rows. Raises
        ``ValueError`` for a row of the wrong width, or naming the column whose value the
        type could not write."""
        if not rows:
            return b""
        width = len(self.column_names)
        if set(map(len, rows)) != {width}:
            index = next(i for i, row in enumerate(rows) if len(row) != width)
            raise ValueError(f"row {index} has {len(rows[index])} values for {width} columns")
        out = bytearray()
        write_leb128(width, out)
        write_leb128(len(rows), out)
        zero_offsets = bytes(8 * len(rows))
        context = self._context()
        for name, ch_type, header, empty_prefix, column in zip(
                self.column_names, self._types, self._headers, self._empty_array_prefixes, zip(*rows)):
            out += header
            if empty_prefix is not None and _all_empty(column):  # module docstring
                out += empty_prefix
                out += zero_offsets
            else:
                self._write(name, ch_type, column, out, context)
        return bytes(out)


def _all_empty(column: Sequence[Any]) -> bool:
    """True when every value of ``column`` has length 0; False when one does not, or has no
    length (``None``: the type's writer then refuses it, naming the column)."""
    try:
        return not any(map(len, column))
    except TypeError:
        return False
