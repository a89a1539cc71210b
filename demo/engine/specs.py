"""Static facts about the emulated model and GPU: weight and KV-cache sizes, memory, power.

These numbers turn the scheduler's block counts into GPU memory bytes and its busy fraction
into watts. They are published architecture and datasheet figures, not measurements of this
emulator, and each carries its source:

- Llama-2-70B: 68,976,648,192 parameters, 80 layers, grouped-query attention with 8 KV heads
  of dimension 128 (Touvron et al., "Llama 2", 2023, table 1 and the released config.json).
- BLOOM-176B: 176,247,271,424 parameters, 70 layers, 112 heads of dimension 128, no GQA
  (BigScience, "BLOOM", 2022, table 3).
- KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes (fp16 = 2),
  the formula of the vLLM paper (Kwon et al., SOSP 2023, section 2).
- Memory totals are what ``nvidia-smi`` reports for the 80 GB parts (81,559 MiB for H100 SXM5
  80GB HBM3, 81,920 MiB for A100-SXM4-80GB); TDPs from NVIDIA's datasheets (H100 SXM 700 W,
  A100 SXM 400 W). Idle draw is an approximation of a loaded-but-idle GPU in P0, not a
  measured value.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ModelSpec:
    """Size facts of a served model (fp16 weights and KV cache)."""

    name: str
    parameters: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def weights_bytes(self) -> int:
        """Bytes of all weights across the tensor-parallel group."""
        return self.parameters * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token across the group: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet facts of one GPU; ``model_name`` is the string dcgm-exporter puts in ``modelName``."""

    hardware: str
    model_name: str
    memory_total_bytes: int
    tdp_watts: float
    idle_watts: float


MODELS: dict[str, ModelSpec] = {
    "llama2-70b": ModelSpec("llama2-70b", 68_976_648_192, 80, 8, 128),
    "bloom-176b": ModelSpec("bloom-176b", 176_247_271_424, 70, 112, 128),
}

GPUS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec("h100-80gb", "NVIDIA H100 80GB HBM3", 81_559 * MIB_BYTES, 700.0, 70.0),
    # Same silicon with a power cap; SplitwiseSim profiles it separately.
    "h100-80gb-pcap": GpuSpec("h100-80gb-pcap", "NVIDIA H100 80GB HBM3", 81_559 * MIB_BYTES, 700.0, 70.0),
    "a100-80gb": GpuSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", 81_920 * MIB_BYTES, 400.0, 55.0),
}


def model_spec(name: str) -> ModelSpec:
    """Look up a model by profile name; raises ``ValueError`` naming the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model: unknown {name!r}, expected one of {sorted(MODELS)}") from None


def gpu_spec(hardware: str) -> GpuSpec:
    """Look up a GPU by profile hardware name; raises ``ValueError`` naming the known ones."""
    try:
        return GPUS[hardware]
    except KeyError:
        raise ValueError(f"hardware: unknown {hardware!r}, expected one of {sorted(GPUS)}") from None
