"""The one converter of values crossing into storage.

Every value :meth:`Store.insert <inferpath.storage.store.Store.insert>` sends (unless its
caller built the rows from checked values) passes through :func:`convert_columns`, which
turns it into what its ClickHouse column holds or names the reason why its row cannot be
stored. Without it the driver decided: ``NaN`` went into a ``Nullable(Int64)`` as 0 (an
``avg()`` of 0), ``pandas.NA`` or a string in a numeric column raised inside the driver and
lost the whole batch, and a ``None`` in a non-Nullable column did the same.

Rules, by what arrives (the column type decides what it becomes):

- *Missing* — ``None``, float or ``Decimal`` NaN, ``pandas.NA``, ``pandas.NaT``, NumPy
  ``NaT``: ``NULL`` in a ``Nullable`` column; anywhere else the row is rejected (a 0 or an
  empty string would be a made-up value).
- NumPy scalars and arrays, pandas ``Timestamp``: their Python values (``.item()``,
  ``.tolist()``); ``Decimal``: a number.
- Numbers into ``Int*``/``UInt*``: whole numbers in the type's range; ``812.5`` or ``inf``
  reject the row. Into ``Float*``: finite numbers; ``±inf`` rejects the row (it would blank
  every aggregate, as the OTLP receiver already decides for data points). Into ``Bool``:
  ``True``/``False``, 0 and 1.
- Text (``str``, ``bytes``) into a number column: parsed (``"812.5"``, ``" 42 "``,
  ``"nan"`` is missing); text that is not a number rejects the row. Into a ``String``
  column: numbers as their decimal text, ``bytes`` decoded as UTF-8 (the driver takes a
  column as all str or all bytes; bytes that are not UTF-8 reject the row).
- Datetimes into ``DateTime``/``DateTime64``: timezone-aware ones in any zone (ClickHouse
  stores UTC); naive ones (also naive pandas/NumPy times) reject the row, since their zone is
  unknown; ISO 8601 text with an offset is parsed; an ``int`` is taken as the column's ticks
  (Unix ns for ``DateTime64(9)``, the ingest path's form).
- ``Array``: a list, tuple or NumPy array, element by element; ``Map``: a dict, key by key and
  value by value. Other column types (Enum, UUID, …) take values as they are, missing values
  aside.

A column whose values already have the target's exact types (and are finite, in range, UTC)
is passed on unchanged after one C-level scan, so the common case costs no per-value Python
call.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from functools import partial
from itertools import chain
from typing import Any

__all__ = ["Rejection", "RowsRejected", "convert_columns", "convert_value"]

_NONE_TYPE = type(None)
_is_not_none = partial(operator.is_not, None)
_tzinfo = operator.attrgetter("tzinfo")
_UTC_ZONES = frozenset({timezone.utc})
_SHOWN_CHARS = 60


@dataclass(frozen=True)
class Rejection:
    """A row that cannot be stored: ``row`` (index in the rows given), ``column`` (its name,
    ``None`` when the row as a whole is malformed) and ``reason`` (what was found)."""

    row: int
    column: str | None
    reason: str

    def __str__(self) -> str:
        if self.column is None:  # "row 2 has 21 values for 22 columns"
            return f"row {self.row} {self.reason}"
        return f"row {self.row} column {self.column!r}: {self.reason}"


class RowsRejected(ValueError):
    """Raised by ``Store.insert`` when rows cannot be stored; nothing was inserted.

    ``rejections``: every :class:`Rejection`, in row order. The message names the first few.
    """

    def __init__(self, rejections: Sequence[Rejection], total_rows: int) -> None:
        self.rejections = tuple(rejections)
        rows = len({r.row for r in self.rejections})
        shown = "; ".join(map(str, self.rejections[:5]))
        more = f"; and {len(self.rejections) - 5} more" if len(self.rejections) > 5 else ""
        super().__init__(f"{rows} of {total_rows} row{'s' * (total_rows != 1)} cannot be stored: {shown}{more}")


class _Unstorable(Exception):
    """A value its column cannot hold; the message is the reason."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _plain(value: Any) -> Any:
    """``value`` as a plain Python value: NumPy scalars and arrays, pandas' missing markers and
    ``Timestamp`` unwrapped; ``None`` for every missing marker (NaN stays a float here)."""
    kind = type(value)
    module = kind.__module__
    if module == "builtins" or module == "datetime":
        return value
    if module == "numpy" or module.startswith("numpy."):
        if kind.__name__ in ("datetime64", "timedelta64"):
            if str(value) == "NaT":
                return None
            raise _Unstorable(f"a NumPy {kind.__name__} has no time zone; pass a timezone-aware datetime")
        if hasattr(value, "tolist") and getattr(value, "ndim", False):  # an array
            return value.tolist()
        if hasattr(value, "item"):
            return value.item()
        return value
    if module.startswith("pandas"):
        if kind.__name__ in ("NAType", "NaTType"):
            return None
        if kind.__name__ == "Timestamp":
            return value.to_pydatetime(warn=False)  # µs: what a Python datetime holds
        if hasattr(value, "tolist"):  # Series, Index, extension arrays
            return value.tolist()
    return value


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if type(value) is float:
        return value != value
    return isinstance(value, Decimal) and value.is_nan()


def _number_from_text(value: str | bytes) -> int | float | Decimal:
    """Parse number text, as scraped or read from CSV: ``"812.5"``, ``" 42 "``, ``"nan"``.

    The grammar is Python's ``float()`` (so ``"sNaN"`` or ``"1,5"`` are not numbers); the value
    is the exact decimal one, so ``"9007199254740993"`` stays that integer."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            raise _Unstorable("bytes that are not number text") from None
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise _Unstorable("text that is not a number") from None
    if not math.isfinite(number):
        return number
    try:
        return Decimal(text)
    except InvalidOperation:  # a float() spelling Decimal lacks
        return number


class _Column:
    """What one column type accepts. ``clean``: the value types that need no conversion
    (``None``: any type); :meth:`fast_ok` checks a column made only of those; :meth:`value`
    converts one value or raises :class:`_Unstorable`."""

    parses_text = False

    def __init__(self, nullable: bool) -> None:
        self.nullable = nullable
        self.clean: frozenset[type] | None = None

    def _with_none(self, *types: type) -> frozenset[type]:
        return frozenset(types + ((_NONE_TYPE,) if self.nullable else ()))

    def fast_ok(self, column: Sequence[Any]) -> bool:
        return True

    def value(self, value: Any) -> Any:
        value = _plain(value)
        if self.parses_text and isinstance(value, (str, bytes, bytearray)):
            value = _number_from_text(bytes(value) if isinstance(value, bytearray) else value)
        if _is_missing(value):
            if self.nullable:
                return None
            raise _Unstorable("no value (None/NaN/NA) for a column that is not Nullable")
        return self._convert(value)

    def _convert(self, value: Any) -> Any:
        return value


class _Int(_Column):
    parses_text = True

    def __init__(self, nullable: bool, type_name: str) -> None:
        super().__init__(nullable)
        bits = int(type_name[type_name.index("t") + 1 :])  # "UInt64" -> 64
        self.type_name = type_name
        self.low: int
        self.high: int
        self.low, self.high = (
            (0, 2**bits - 1) if type_name.startswith("U") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        )
        self.clean = self._with_none(int)

    def fast_ok(self, column: Sequence[Any]) -> bool:
        numbers = list(filter(_is_not_none, column)) if self.nullable else column
        return not numbers or (self.low <= min(numbers) and max(numbers) <= self.high)

    def _convert(self, value: Any) -> int:
        if isinstance(value, (float, Decimal)):
            if not math.isfinite(value):
                raise _Unstorable(f"{value} is not a finite number")
            if value != int(value):
                raise _Unstorable(f"{value} is not a whole number ({self.type_name})")
            value = int(value)
        elif not isinstance(value, int):  # bool is an int
            raise _Unstorable(f"a {type(value).__name__} is not a number")
        value = int(value)
        if not self.low <= value <= self.high:
            raise _Unstorable(f"{value} is outside {self.type_name}")
        return value


class _Float(_Column):
    parses_text = True

    def __init__(self, nullable: bool) -> None:
        super().__init__(nullable)
        self.clean = self._with_none(float, int)

    def fast_ok(self, column: Sequence[Any]) -> bool:
        try:
            return all(map(math.isfinite, filter(_is_not_none, column) if self.nullable else column))
        except OverflowError:  # an int beyond any float
            return False

    def _convert(self, value: Any) -> float:
        if not isinstance(value, (int, float, Decimal)):
            raise _Unstorable(f"a {type(value).__name__} is not a number")
        try:
            number = float(value)
        except OverflowError:
            raise _Unstorable(f"{value} is too large for a float") from None
        if not math.isfinite(number):
            raise _Unstorable(f"{number} is not a finite number")
        return number


class _Bool(_Column):
    _TEXT = {"true": True, "false": False, "1": True, "0": False}

    def __init__(self, nullable: bool) -> None:
        super().__init__(nullable)
        self.clean = self._with_none(bool)

    def _convert(self, value: Any) -> bool:
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if isinstance(value, str) and value.strip().lower() in self._TEXT:
            return self._TEXT[value.strip().lower()]
        if isinstance(value, (int, float, Decimal)) and value in (0, 1):
            return bool(value)
        raise _Unstorable(f"{_show(value)} is not a boolean")


class _String(_Column):
    def __init__(self, nullable: bool) -> None:
        super().__init__(nullable)
        self.clean = self._with_none(str)

    def _convert(self, value: Any) -> str | bytes:
        if isinstance(value, str):
            return str(value)  # a str subclass as a plain str
        if isinstance(value, (bytes, bytearray)):
            # The driver takes a String column as all str or all bytes, never a mix.
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise _Unstorable("bytes that are not UTF-8 text") from None
        if isinstance(value, (int, float, Decimal)):  # bool too: "True"
            return str(value)
        raise _Unstorable(f"a {type(value).__name__} is not text")


class _DateTime(_Column):
    def __init__(self, nullable: bool) -> None:
        super().__init__(nullable)
        self.clean = self._with_none(datetime, int)

    def fast_ok(self, column: Sequence[Any]) -> bool:
        kinds = set(map(type, column))
        if datetime not in kinds:  # ticks (and NULLs) only
            return True
        times = column if len(kinds) == 1 else [v for v in column if type(v) is datetime]
        return set(map(_tzinfo, times)) <= _UTC_ZONES

    def _convert(self, value: Any) -> datetime | int:
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                raise _Unstorable("text that is not an ISO 8601 time") from None
        if isinstance(value, datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise _Unstorable("a naive datetime; pass a timezone-aware datetime")
            return value.astimezone(timezone.utc)
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # ticks of the column (Unix ns for DateTime64(9))
        raise _Unstorable(f"a {type(value).__name__} is not a time; pass a timezone-aware datetime")


class _Array(_Column):
    def __init__(self, element: _Column) -> None:
        super().__init__(False)
        self.element = element
        self.clean = frozenset({list, tuple})

    def fast_ok(self, column: Sequence[Any]) -> bool:
        items = list(chain.from_iterable(column))
        if not items:
            return True
        clean = self.element.clean
        return clean is None or (set(map(type, items)) <= clean and self.element.fast_ok(items))

    def _convert(self, value: Any) -> list:
        if not isinstance(value, (list, tuple)):
            raise _Unstorable(f"a {type(value).__name__} is not an array")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(self.element.value(item))
            except _Unstorable as exc:
                raise _Unstorable(f"element {index}: {exc}") from None
        return out


class _Map(_Column):
    def __init__(self, key: _Column, value: _Column) -> None:
        super().__init__(False)
        self.key, self.item = key, value
        self.clean = frozenset({dict})

    def fast_ok(self, column: Sequence[Any]) -> bool:
        for part, kind in ((map(dict.keys, column), self.key), (map(dict.values, column), self.item)):
            items = list(chain.from_iterable(part))
            if items and kind.clean is not None and not (set(map(type, items)) <= kind.clean and kind.fast_ok(items)):
                return False
        return True

    def _convert(self, value: Any) -> dict:
        if not isinstance(value, dict):
            raise _Unstorable(f"a {type(value).__name__} is not a map")
        out = {}
        for key, item in value.items():
            try:
                out[self.key.value(key)] = self.item.value(item)
            except _Unstorable as exc:
                raise _Unstorable(f"key {_show(key)}: {exc}") from None
        return out


_INT_TYPES = frozenset(f"{sign}Int{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64, 128, 256))
_converters: dict[str, _Column] = {}


def _column_for(ch_type: Any) -> _Column:
    """The converter for a clickhouse-connect ``ClickHouseType`` (cached by type name)."""
    found = _converters.get(ch_type.name)
    if found is not None:
        return found
    base, nullable = ch_type.base_type, bool(ch_type.nullable)
    if base in _INT_TYPES:
        made: _Column = _Int(nullable, base)
    elif base in ("Float32", "Float64", "BFloat16"):
        made = _Float(nullable)
    elif base == "Bool":
        made = _Bool(nullable)
    elif base == "String":
        made = _String(nullable)
    elif base in ("DateTime", "DateTime64"):
        made = _DateTime(nullable)
    elif base == "Array":
        made = _Array(_column_for(ch_type.element_type))
    elif base == "Map":
        made = _Map(_column_for(ch_type.key_type), _column_for(ch_type.value_type))
    else:
        made = _Column(nullable)
    _converters[ch_type.name] = made
    return made


def convert_value(value: Any, ch_type: Any) -> Any:
    """``value`` as a column of ``ch_type`` (a clickhouse-connect ``ClickHouseType``) holds it.

    Raises ``ValueError`` with the reason when the column cannot hold it (module docstring).
    """
    try:
        return _column_for(ch_type).value(value)
    except _Unstorable as exc:
        raise ValueError(f"{exc} (got {_show(value)})") from None


def convert_columns(
    columns: Sequence[Sequence[Any]], names: Sequence[str], ch_types: Sequence[Any]
) -> tuple[list[Sequence[Any]], list[Rejection]]:
    """Convert column-oriented values for storage.

    ``columns[i]`` holds the values of column ``names[i]`` of type ``ch_types[i]``
    (clickhouse-connect ``ClickHouseType`` objects, as an insert context gives them), one per
    row. Returns the converted columns, with every rejected row left out of all of them, and
    the :class:`Rejection` of each (row, column) that could not be stored, in row order.
    Never raises for a value.
    """
    converted: list[Sequence[Any]] = []
    rejections: list[Rejection] = []
    for column, name, ch_type in zip(columns, names, ch_types):
        kind = _column_for(ch_type)
        clean = kind.clean
        if clean is None and not kind.nullable:
            converted.append(column)
            continue
        if clean is not None and set(map(type, column)) <= clean and kind.fast_ok(column):
            converted.append(column)
            continue
        out = []
        for index, value in enumerate(column):
            try:
                out.append(kind.value(value))
            except _Unstorable as exc:
                out.append(None)
                rejections.append(Rejection(index, name, f"{exc} (got {_show(value)})"))
        converted.append(out)
    if not rejections:
        return converted, []
    rejections.sort(key=operator.attrgetter("row"))
    bad_rows = {r.row for r in rejections}
    kept: list[Sequence[Any]] = [[v for index, v in enumerate(column) if index not in bad_rows] for column in converted]
    return kept, rejections
