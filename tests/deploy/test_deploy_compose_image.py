"""The compose file against the Compose specification (the JSON schema vendored by
check-jsonschema, nothing downloaded), and the Dockerfile against the README's install step."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from importlib import resources

import pytest
from deploy_manifests import DEPLOY_DIR, INFERPATH_IMAGE, REPO_ROOT, compose, workload

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("check_jsonschema")

DASHBOARD_SCRIPT = "/opt/inferpath/dashboard_app.py"


@pytest.fixture(scope="module")
def compose_validator():
    text = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    schema = json.loads(text)
    return jsonschema.Draft202012Validator(schema)


def test_compose_file_matches_the_compose_specification(compose_validator) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in compose_validator.iter_errors(compose())]
    assert errors == []


def test_compose_validation_rejects_an_unknown_service_key(compose_validator) -> None:
    broken = copy.deepcopy(compose())
    broken["services"]["server"]["comand"] = ["inferpath"]
    assert list(compose_validator.iter_errors(broken))


def test_compose_roles_run_the_same_commands_as_kubernetes() -> None:
    services = compose()["services"]
    server = workload("Deployment", "inferpath-server")["spec"]["template"]["spec"]["containers"][0]
    dashboard = workload("Deployment", "inferpath-dashboard")["spec"]["template"]["spec"]["containers"][0]
    assert services["server"]["command"] == server["command"] == ["inferpath", "up", "--no-dashboard"]
    assert services["dashboard"]["command"] == dashboard["command"]
    for name in ("server", "dashboard", "agent", "agent-gpu"):
        assert services[name]["image"] == "${INFERPATH_IMAGE:-" + INFERPATH_IMAGE + "}", name
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["agent-gpu"]["profiles"] == ["gpu"] and services["dcgm-exporter"]["profiles"] == ["gpu"]
    assert services["otel-collector"]["profiles"] == ["otelcol"]
    assert services["server"]["environment"]["INFERPATH_STORE"].startswith("http://")
    assert "clickhouse:8123/inferpath" in services["server"]["environment"]["INFERPATH_STORE"]


def test_compose_holds_no_secret_values() -> None:
    for name, service in compose()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if "PASSWORD" in key or "TOKEN" in key:
                assert str(value).startswith("${"), f"{name}.{key} must come from the environment"


def test_dashboard_command_matches_the_launcher_flags() -> None:
    from inferpath.dashboard.launch import dashboard_command

    manifest = compose()["services"]["dashboard"]["command"]
    launcher = dashboard_command(port=8501, host="0.0.0.0")
    assert manifest[:3] == ["python", "-m", "streamlit"] and launcher[1:3] == ["-m", "streamlit"]
    assert manifest[4] == DASHBOARD_SCRIPT
    assert manifest[5:] == launcher[5:]


def _dockerfile() -> str:
    return (DEPLOY_DIR / "Dockerfile").read_text(encoding="utf-8")


def test_image_installs_with_the_readme_install_step() -> None:
    dockerfile = _dockerfile()
    (install,) = re.findall(r'pip install "\.\[\$\{INFERPATH_EXTRAS\}\]"', dockerfile)
    extras = re.search(r"ARG INFERPATH_EXTRAS=([\w,]+)", dockerfile).group(1)
    readme = (DEPLOY_DIR / "README.md").read_text(encoding="utf-8")
    assert f"pip install '.[{extras}]'" in readme
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.split(",")) <= set(declared)
    assert "demo" not in extras.split(","), "the demo's tokenizer and corpus do not belong in the image"


def test_image_is_multi_stage_non_root_and_copies_every_package_folder() -> None:
    dockerfile = _dockerfile()
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) >= 2
    user = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    # Each component folder is linked into the package (inferpath/<folder> -> ../<folder>).
    linked = {p.name for p in (REPO_ROOT / "inferpath").iterdir() if p.is_symlink()}
    assert {"server", "storage", "dashboard"} <= linked
    folders = linked | {"inferpath"}
    copied = set(re.findall(r"^COPY (\w+)/ ", dockerfile, re.M))
    assert folders <= copied
    ignore = (DEPLOY_DIR / "Dockerfile.dockerignore").read_text().split()
    for folder in folders:
        assert f"!{folder}/" in ignore, folder
    assert DASHBOARD_SCRIPT in dockerfile
    assert "STOPSIGNAL SIGINT" in dockerfile
    assert 'CMD ["inferpath", "up", "--no-dashboard"]' in dockerfile
