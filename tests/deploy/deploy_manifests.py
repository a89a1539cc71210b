"""Paths and loaders shared by the deployment tests (all offline)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"
KUBERNETES_DIR = DEPLOY_DIR / "kubernetes"
INFERPATH_IMAGE = "inferpath:0.1.0"


def kubernetes_documents() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object of ``deploy/kubernetes/*.yaml`` as ``(file name, object)``."""
    found = []
    for path in sorted(KUBERNETES_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document:
                found.append((path.name, document))
    return found


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind/name, pod spec)`` of every workload (Deployment, DaemonSet, StatefulSet, Job)."""
    for _, document in kubernetes_documents():
        if document["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{document['kind']}/{document['metadata']['name']}", document["spec"]["template"]["spec"]


def workload(kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` named ``name``; fails the test when absent."""
    for _, document in kubernetes_documents():
        if document["kind"] == kind and document["metadata"]["name"] == name:
            return document
    pytest.fail(f"no {kind} named {name} in {KUBERNETES_DIR}")


def compose() -> dict[str, Any]:
    """``deploy/compose.yaml`` parsed (YAML merge keys resolved, as Compose does)."""
    return yaml.safe_load((DEPLOY_DIR / "compose.yaml").read_text(encoding="utf-8"))
