"""Who a series belongs to: one host attribute, and GPU series keyed by host and GPU UUID.

dcgm-exporter spells the host ``Hostname`` in its default image and ``hostname`` in others,
and reports ``localhost`` when it runs without host networking; NVML knows none of these
labels. Both spellings become ``host``, and ``localhost`` becomes the scraped machine, so a
scrape of one GPU under either spelling continues the same series and two GPUs with the same
index on different hosts never merge. GPU labels keep dcgm-exporter's names (``UUID``,
``gpu``, ``modelName``, ``pci_bus_id``, MIG ``GPU_I_ID``/``GPU_I_PROFILE``, Kubernetes
``pod``/``namespace``/``container``): Grafana dashboards built on dcgm-exporter keep working,
and the NVML poller writes the same names so both sources line up.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

HOST = "host"
GPU_UUID = "UUID"
GPU_INDEX = "gpu"
GPU_MODEL = "modelName"
GPU_PCI_BUS_ID = "pci_bus_id"
GPU_MIG_INSTANCE_ID = "GPU_I_ID"
GPU_MIG_PROFILE = "GPU_I_PROFILE"

RENAMED_LABELS: dict[str, str] = {"Hostname": HOST, "hostname": HOST}

# Host names that say "the machine you scraped", not a machine.
_LOOPBACK_HOSTS = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "::1", "ip6-localhost", ""})

# Attributes that identify one GPU (or MIG instance) series.
DEVICE_KEY: tuple[str, ...] = (HOST, GPU_UUID, GPU_MIG_INSTANCE_ID)


def target_host(url: str) -> str:
    """The host part of a scrape URL (``http://10.0.0.7:9400/metrics`` -> ``10.0.0.7``)."""
    return urlsplit(url).hostname or ""


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses, which name no particular machine."""
    return host.strip().lower() in _LOOPBACK_HOSTS


def attributes_from_labels(
    labels: Mapping[str, str], *, scrape_host: str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Series labels -> attributes: host label renamed ``host`` and resolved, ``extra`` added.

    A ``host`` of ``localhost`` (or a loopback address) becomes ``scrape_host`` when one is
    given: the exporter runs on the scraped machine. ``extra`` wins over labels of the same
    name.
    """
    attributes = {RENAMED_LABELS.get(k, k): v for k, v in labels.items()}
    if scrape_host and is_loopback_host(attributes.get(HOST, "x")):
        attributes[HOST] = scrape_host
    if extra:
        attributes.update(extra)
    return attributes


def device_key(attributes: Mapping[str, str]) -> tuple[str, ...]:
    """(host, GPU UUID, MIG instance) of a GPU series; missing parts are empty strings."""
    return tuple(attributes.get(k, "") for k in DEVICE_KEY)
