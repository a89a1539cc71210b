"""inferpath.storage: ClickHouse (embedded chDB or a server) behind one small API.

- :mod:`~inferpath.storage.url` — store URLs (``chdb:///path``, ``http(s)://…``)
- :mod:`~inferpath.storage.store` — :class:`Store`: connect, migrate, insert, query
- :mod:`~inferpath.storage.rows` — row dataclasses and the exporter's column orders
- :mod:`~inferpath.storage.writer` — :class:`BatchWriter`: bounded, batched inserts
- :mod:`~inferpath.storage.reader` — :class:`Reader`: the parameterized read queries
- :mod:`~inferpath.storage.cluster` — the schema as ``ON CLUSTER`` replicated + distributed DDL

Submodules are imported on use so that ``import inferpath.storage.rows`` does not load
clickhouse-connect.
"""
