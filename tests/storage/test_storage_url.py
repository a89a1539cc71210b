"""Store URL parsing: accepted forms, defaults, credentials, and errors that name the part."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpath.storage.url import default_store_url, demo_store_url, embedded_store_url, parse_store_url


def test_chdb_url_gives_path_and_default_database() -> None:
    url = parse_store_url("chdb:///var/lib/inferpath/store")
    assert url.kind == "chdb"
    assert url.path == Path("/var/lib/inferpath/store")
    assert url.dsn == "chdb:///var/lib/inferpath/store"
    assert url.database == "inferpath"


def test_chdb_url_database_query_parameter() -> None:
    assert parse_store_url("chdb:///tmp/x?database=otel").database == "otel"


def test_http_url_with_credentials_hides_password() -> None:
    url = parse_store_url("https://alice:s3cr%40t@ch.example.com:9440/telemetry", environ={})
    assert (url.kind, url.host, url.port, url.database) == ("http", "ch.example.com", 9440, "telemetry")
    assert url.secure is True
    assert url.username == "alice"
    assert url.password == "s3cr@t"
    for text in (repr(url), str(url), url.dsn):
        assert "s3cr" not in text
    assert "alice@ch.example.com:9440/telemetry" in str(url)


def test_http_url_defaults_and_env_credentials() -> None:
    env = {"CLICKHOUSE_USER": "bob", "CLICKHOUSE_PASSWORD": "pw-from-env"}
    url = parse_store_url("http://localhost", environ=env)
    assert (url.port, url.database, url.secure) == (8123, "inferpath", False)
    assert (url.username, url.password) == ("bob", "pw-from-env")
    assert "pw-from-env" not in repr(url)
    assert parse_store_url("https://h", environ={}).port == 8443


def test_url_credentials_win_over_env() -> None:
    url = parse_store_url("http://carol:x@h:8123/db", environ={"CLICKHOUSE_USER": "bob"})
    assert url.username == "carol"


def test_default_store_url_uses_xdg_data_home(tmp_path: Path) -> None:
    assert default_store_url({"XDG_DATA_HOME": str(tmp_path)}) == f"chdb://{tmp_path}/inferpath/store"
    relative_ignored = default_store_url({"XDG_DATA_HOME": "relative/dir"})
    assert relative_ignored.endswith("/.local/share/inferpath/store")
    assert parse_store_url(relative_ignored).kind == "chdb"


def test_demo_store_is_beside_the_default_store_and_never_it(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path)}
    assert demo_store_url(env) == f"chdb://{tmp_path}/inferpath/demo-store" != default_store_url(env)
    assert parse_store_url(demo_store_url({})).kind == "chdb"


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("", "non-empty"),
        ("ftp://host/db", "scheme"),
        ("/just/a/path", "scheme"),
        ("chdb://relative/path", "three slashes"),
        ("chdb:///tmp/x?flavour=1", "query parameter"),
        ("chdb:///tmp/../etc", "'..'"),
        ("chdb:///tmp/x?database=bad-name", "database"),
        ("http:///db", "host"),
        ("http://host:99999/db", "port"),
        ("http://host:abc/db", "port"),
        ("http://host/db/extra", "path"),
        ("http://host/1db", "database"),
        ("http://host/db?x=1", "query"),
    ],
)
def test_bad_urls_raise_value_error_naming_the_part(url: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_store_url(url, environ={})


def test_error_message_never_contains_password() -> None:
    with pytest.raises(ValueError) as info:
        parse_store_url("http://u:topsecret@host/bad-db", environ={})
    assert "topsecret" not in str(info.value)


def test_embedded_store_url_gives_its_folder_back(tmp_path: Path) -> None:
    for folder in (tmp_path / "store", tmp_path / "a b?c#d%e"):
        url = embedded_store_url(folder)
        assert url.startswith("chdb:///")
        parsed = parse_store_url(url)
        assert parsed.kind == "chdb" and parsed.path == folder
    assert embedded_store_url(tmp_path / "store") == f"chdb://{tmp_path / 'store'}"  # plain paths stay readable
