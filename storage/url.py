"""Store URLs: which ClickHouse to use, parsed and validated once.

Two kinds, one client library (clickhouse-connect) behind both:

- ``chdb:///absolute/path[?database=name]`` — embedded chDB keeping its files under the path.
- ``http(s)://[user[:password]@]host[:port][/database][?cluster=NAME]`` — a ClickHouse server,
  or with ``cluster`` a cluster (replicated + distributed tables, ``storage/cluster.py``).
  Credentials missing from the URL are taken from ``CLICKHOUSE_USER`` and
  ``CLICKHOUSE_PASSWORD``. The password never appears in ``repr``/``str`` or in logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

ENV_CLICKHOUSE_USER = "CLICKHOUSE_USER"
ENV_CLICKHOUSE_PASSWORD = "CLICKHOUSE_PASSWORD"
ENV_XDG_DATA_HOME = "XDG_DATA_HOME"

DEFAULT_DATABASE = "inferpath"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFAULT_PORTS = {"http": 8123, "https": 8443}


def validate_identifier(value: str, what: str = "database") -> str:
    """Return ``value`` if it is a plain ClickHouse identifier (``^[A-Za-z_][A-Za-z0-9_]*$``).

    Raises ``ValueError`` naming ``what`` otherwise; identifiers are substituted into SQL,
    so nothing else may pass.
    """
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise ValueError(f"{what} must match ^[A-Za-z_][A-Za-z0-9_]*$, got {value!r}")
    return value


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL.

    ``kind``: ``"chdb"`` or ``"http"`` (``https`` is ``kind="http"`` with ``secure=True``).
    ``dsn``: for chdb the DSN handed to ``clickhouse_connect.get_client(dsn=...)``; for http
    the URL without password (for display). ``path``: chDB data folder (``None`` for http).
    ``database``: validated identifier. ``password`` is excluded from ``repr``.
    ``cluster``: ClickHouse cluster name (http only) or ``None`` for a single node.
    """

    kind: Literal["chdb", "http"]
    dsn: str
    path: Path | None
    database: str
    host: str | None = None
    port: int | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)
    secure: bool = False
    cluster: str | None = None

    def __str__(self) -> str:
        return self.dsn


def _data_home(env: Mapping[str, str]) -> Path:
    # A relative XDG_DATA_HOME is ignored, as the XDG base-directory spec requires.
    base = env.get(ENV_XDG_DATA_HOME) or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base)


def embedded_store_url(path: str | os.PathLike[str]) -> str:
    """The store URL of an embedded chDB store kept under ``path`` (made absolute):
    ``chdb:///abs/path``, with the characters a URL would misread (``?``, ``#``, ``%``,
    spaces) percent-encoded, so that :func:`parse_store_url` gives ``path`` back."""
    return "chdb://" + quote(str(Path(path).absolute()), safe="/")


def default_store_url(environ: Mapping[str, str] | None = None) -> str:
    """The embedded default: ``chdb:///<XDG_DATA_HOME or ~/.local/share>/inferpath/store``.

    A relative ``XDG_DATA_HOME`` is ignored, as the XDG base-directory spec requires.
    """
    return embedded_store_url(_data_home(os.environ if environ is None else environ) / "inferpath" / "store")


def demo_store_url(environ: Mapping[str, str] | None = None) -> str:
    """The demo's own embedded store: ``chdb:///<XDG_DATA_HOME or ~/.local/share>/inferpath/demo-store``.

    Beside the default store and never it, so that ``inferpath up`` does not serve the
    demo's requests as if they were production data.
    """
    return embedded_store_url(_data_home(os.environ if environ is None else environ) / "inferpath" / "demo-store")


def parse_store_url(url: str, environ: Mapping[str, str] | None = None) -> StoreURL:
    """Parse and validate a store URL (see the module docstring for the accepted forms).

    Raises ``ValueError`` naming the part that is wrong (scheme, path, host, port,
    database, query parameter). The message never contains the password.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("store url must be a non-empty string")
    env = os.environ if environ is None else environ
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
        raise ValueError(f"store url is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "chdb":
        return _parse_chdb(parts)
    if scheme in _DEFAULT_PORTS:
        return _parse_http(parts, scheme, env)
    raise ValueError(f"store url scheme must be chdb, http or https, got {parts.scheme or '(none)'!r}")


def _parse_chdb(parts) -> StoreURL:
    if parts.netloc:
        raise ValueError(
            f"chdb store url must be chdb:///absolute/path (three slashes); got host part {parts.netloc!r}"
        )
    if not parts.path or not parts.path.startswith("/"):
        raise ValueError("chdb store url path must be absolute, e.g. chdb:///var/lib/inferpath")
    path = Path(unquote(parts.path))
    if ".." in path.parts:
        raise ValueError(f"chdb store url path must not contain '..': {str(path)!r}")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"database"})
    if unknown:
        raise ValueError(f"chdb store url has unknown query parameter(s): {', '.join(unknown)}")
    database = validate_identifier(query.get("database", [DEFAULT_DATABASE])[-1])
    return StoreURL(kind="chdb", dsn=f"chdb://{path}", path=path, database=database)


def _parse_http(parts, scheme: str, env: Mapping[str, str]) -> StoreURL:
    host = parts.hostname
    if not host:
        raise ValueError(f"{scheme} store url needs a host, e.g. {scheme}://localhost:8123/inferpath")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        raise ValueError(f"{scheme} store url port must be a number in 1-65535") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{scheme} store url port must be in 1-65535, got {port}")
    segments = [s for s in parts.path.split("/") if s]
    if len(segments) > 1:
        raise ValueError(f"{scheme} store url path must be at most one segment (the database)")
    database = validate_identifier(unquote(segments[0]) if segments else DEFAULT_DATABASE)
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"cluster"})
    if unknown:
        raise ValueError(f"{scheme} store url has unknown query parameter(s): {', '.join(unknown)} (only cluster=NAME)")
    cluster = validate_identifier(query["cluster"][-1], "cluster") if "cluster" in query else None
    username = unquote(parts.username) if parts.username else env.get(ENV_CLICKHOUSE_USER) or None
    if parts.password is not None:
        password: str | None = unquote(parts.password)
    else:
        password = env.get(ENV_CLICKHOUSE_PASSWORD) or None
    shown_host = f"[{host}]" if ":" in host else host
    user_part = f"{username}@" if username else ""
    dsn = f"{scheme}://{user_part}{shown_host}:{port}/{database}" + (f"?cluster={cluster}" if cluster else "")
    return StoreURL(
        kind="http",
        dsn=dsn,
        path=None,
        database=database,
        host=host,
        port=port,
        username=username,
        password=password,
        secure=scheme == "https",
        cluster=cluster,
    )


UNREACHABLE_TEXTS = ("Connection refused", "Name or service not known", "No route to host", "timed out")
"""Driver error texts that mean the ClickHouse server could not be reached at all."""


def shown_store_url(url: str) -> str:
    """``url`` as it may be printed: a password in it shown as ``***``
    (``https://user:***@host:8443/db``); anything else as given."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    ends = [at for at in (rest.find(c) for c in "/?#") if at >= 0]
    netloc, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    userinfo, at, host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{tail}"


def invalid_store_url(url: str, problem: Exception) -> str:
    """The message for a store URL that does not parse: the URL (password hidden) and what is
    wrong, with the ``chdb://`` URL meant when a bare folder path was given."""
    message = f"invalid store URL {shown_store_url(url)!r}: {problem}"
    try:
        bare_path = bool(url.strip()) and not urlsplit(url.strip()).scheme
    except ValueError:
        bare_path = False
    if bare_path:
        message += f"; did you mean {embedded_store_url(Path(url.strip()).expanduser())}?"
    return message


def store_open_failure(url: str | None, exc: BaseException) -> str:
    """One sentence on why the store at ``url`` (default: the default store) could not be
    opened: the URL with its password hidden and the cause's first line, without Python
    class names."""
    url = url or default_store_url()
    try:
        parsed = parse_store_url(url)
    except ValueError as bad:
        return invalid_store_url(url, bad)
    shown = shown_store_url(url)
    text = str(exc).replace(url, shown)
    if parsed.password:
        text = text.replace(f":{parsed.password}@", ":***@")
    refused = next((why for why in UNREACHABLE_TEXTS if why in text), None)
    if parsed.kind == "http" and refused is not None:
        return (
            f"cannot open the store {shown}: cannot reach ClickHouse at {parsed.host}:{parsed.port} "
            f"({refused.lower()}): start it or correct the URL, or use an embedded store (chdb:///path)"
        )
    other = re.search(r"HTTP driver received HTTP status (\d+)", text)
    if parsed.kind == "http" and other is not None and "DB::Exception" not in text and "Code:" not in text:
        # ClickHouse answers its errors as "Code: N. DB::Exception: ..."; anything else is
        # another program on that port (a web server, the inferpath server itself).
        return (
            f"cannot open the store {shown}: {parsed.host}:{parsed.port} answered HTTP {other.group(1)} and is not "
            "ClickHouse: give --store ClickHouse's HTTP interface (port 8123 by default), or an embedded store "
            "(chdb:///path)"
        )
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    first = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return f"cannot open the store {shown}: {first}"
