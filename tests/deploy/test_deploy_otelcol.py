"""The OpenTelemetry Collector config writes exactly what inferpath reads.

Checked against the real tables (a chDB store created by inferpath's migrations), the schema
files, the Collector ClickHouse exporter's insert column lists and the signal catalog.
"""

from __future__ import annotations

import re

import pytest
import yaml
from deploy_manifests import DEPLOY_DIR
from otel_exporter_columns import EXPORTER_INSERT_COLUMNS

from inferpath.collectors.catalog import CATALOG, SIGNALS
from inferpath.storage.schema_files import SCHEMA_DIR
from inferpath.storage.store import Store


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load((DEPLOY_DIR / "otelcol.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def exporter(config: dict) -> dict:
    return config["exporters"]["clickhouse"]


@pytest.fixture(scope="module")
def real_columns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Columns of every table of a store created by inferpath's own migrations."""
    path = tmp_path_factory.mktemp("otelcol") / "store"
    with Store.open(f"chdb://{path}") as store:
        tables = [
            row[0]
            for row in store.query(
                "SELECT name FROM system.tables WHERE database = {db:String}", {"db": store.database}
            )
        ]
        return {table: [name for name, _ in store.table_columns(table)] for table in tables}


def _exporter_tables(exporter: dict) -> dict[str, str]:
    tables = {"traces": exporter["traces_table_name"]}
    tables.update({kind: spec["name"] for kind, spec in exporter["metrics_tables"].items()})
    return tables


def test_exporter_never_creates_tables_of_its_own(exporter: dict) -> None:
    # Its own DDL would differ from inferpath's (TTL, JSON variant, engine on a cluster).
    assert exporter["create_schema"] is False
    assert exporter["database"] == "inferpath"


def test_exporter_tables_are_created_by_the_schema_files(exporter: dict) -> None:
    created = set()
    for path in SCHEMA_DIR.glob("*.sql"):
        created |= set(re.findall(r"CREATE TABLE IF NOT EXISTS `\{database\}`\.(\w+)", path.read_text()))
    tables = _exporter_tables(exporter)
    assert set(tables) == {"traces", "gauge", "sum", "histogram"}
    assert set(tables.values()) <= created


@pytest.mark.parametrize("kind", ["traces", "gauge", "sum", "histogram"])
def test_exporter_insert_columns_exist_in_the_real_table(exporter: dict, real_columns: dict, kind: str) -> None:
    table = _exporter_tables(exporter)[kind]
    # Same names in the same order: the exporter binds values by position.
    assert real_columns[table] == EXPORTER_INSERT_COLUMNS[kind]


def test_metrics_the_exporter_cannot_store_are_filtered_out(config: dict) -> None:
    pipeline = config["service"]["pipelines"]["metrics"]
    assert pipeline["exporters"] == ["clickhouse"]
    processors = pipeline["processors"]
    assert processors.index("filter/catalog") < processors.index("transform/catalog") < processors.index("batch")
    (condition,) = config["processors"]["filter/catalog"]["metrics"]["metric"]
    pattern = re.fullmatch(r'not IsMatch\(name, "(.*)"\)', condition).group(1).replace("$$", "$")
    kept = {row.metric for row in CATALOG if re.fullmatch(pattern, row.metric)}
    mapped = set(_renames(config))
    assert kept == mapped, "the filter must keep exactly the metrics the transform maps"
    assert not re.fullmatch(pattern, "vllm:e2e_request_latency_seconds_bucket")


def _renames(config: dict) -> dict[str, str]:
    statements = _statements(config, "metric")
    renames = {}
    for statement in statements:
        match = re.fullmatch(r'set\(name, "([^"]+)"\) where name == "([^"]+)"', statement)
        if match:
            renames[match.group(2)] = match.group(1)
    return renames


def _statements(config: dict, context: str) -> list[str]:
    blocks = config["processors"]["transform/catalog"]["metric_statements"]
    return [s for block in blocks if block["context"] == context for s in block["statements"]]


def test_renames_and_units_follow_the_signal_catalog(config: dict) -> None:
    renames = _renames(config)
    catalog = {(row.source, row.metric): row.signal for row in CATALOG}
    jobs = {job["job_name"] for job in config["receivers"]["prometheus"]["config"]["scrape_configs"]}
    assert jobs <= {row.source for row in CATALOG}
    assert renames, "no metric is mapped"
    for source_metric, signal in renames.items():
        sources = [s for (s, m), sig in catalog.items() if m == source_metric and sig == signal]
        assert sources, f"{source_metric} -> {signal} is not a catalog row"
        assert set(sources) <= jobs, f"{source_metric}: its source is not scraped"
    units = {}
    for statement in _statements(config, "metric"):
        match = re.fullmatch(r'set\(unit, "([^"]+)"\) where name == "([^"]+)"', statement)
        if match:
            units[match.group(2)] = match.group(1)
    assert set(units) == set(renames)
    for source_metric, signal in renames.items():
        assert units[source_metric] == SIGNALS[signal].unit, source_metric
    # Unit statements run while the metric still has its source name.
    metric_statements = _statements(config, "metric")
    for source_metric in renames:
        unit_at = next(
            i for i, s in enumerate(metric_statements) if s.startswith("set(unit") and f'"{source_metric}"' in s
        )
        name_at = next(
            i for i, s in enumerate(metric_statements) if s.startswith("set(name") and f'"{source_metric}"' in s
        )
        assert unit_at < name_at


def test_value_scales_equal_the_catalog_conversions(config: dict) -> None:
    scales = {}
    for statement in _statements(config, "datapoint"):
        match = re.fullmatch(
            r'set\(value_double, value_double \* ([0-9.e+-]+)\) where metric\.name == "([^"]+)"', statement
        )
        if match:
            scales[match.group(2)] = float(match.group(1))
    assert scales, "no conversion found"
    for source_metric in _renames(config):
        row = next(r for r in CATALOG if r.metric == source_metric)
        expected = row.convert(1.0)
        assert scales.get(source_metric, 1.0) == pytest.approx(expected), source_metric


def test_host_label_and_source_metric_match_the_scrape_loop(config: dict) -> None:
    from inferpath.vocabulary import SOURCE_METRIC_ATTRIBUTE

    statements = _statements(config, "datapoint")
    assert statements[0] == f'set(attributes["{SOURCE_METRIC_ATTRIBUTE}"], metric.name)'
    for label in ("Hostname", "hostname"):
        assert f'set(attributes["host"], attributes["{label}"]) where attributes["{label}"] != nil' in statements
        assert f'delete_key(attributes, "{label}")' in statements


def test_traces_reach_the_inferpath_server_for_request_assembly(config: dict) -> None:
    pipeline = config["service"]["pipelines"]["traces"]
    assert pipeline["exporters"] == ["otlphttp/inferpath"]
    assert config["exporters"]["otlphttp/inferpath"]["endpoint"] == "${env:INFERPATH_SERVER_URL}"


def test_every_pipeline_component_is_defined(config: dict) -> None:
    for pipeline in config["service"]["pipelines"].values():
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in config[section], component
