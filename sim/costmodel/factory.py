"""The one place that turns a cost-model name into a cost model.

Names (``COST_MODELS``, the only list of them: the CLI's ``--cost-model`` choices, the sweep
file's ``cost_models`` and their help come from it):

- ``auto``: the profiled model where ``profiler/data`` ships an artifact for the GPU type (H100,
  H200), else the roofline;
- ``profiled``: the profiled model; an error for a GPU type without an artifact;
- ``roofline``: the analytic roofline model (any GPU type in the catalog).
"""

from __future__ import annotations

from pathlib import Path

from tlora_sim.sim.costmodel.interface import CostModel
from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
from tlora_sim.sim.costmodel.roofline import RooflineCostModel
from tlora_sim.traces.errors import InputError

COST_MODELS: dict[str, str] = {
    "auto": "profiled where profiler/data has an artifact for the GPU (H100, H200), else roofline",
    "profiled": "the shipped profiled model of the GPU type (sim/costmodel/profiled/model.py)",
    "roofline": "analytic roofline model (sim/costmodel/roofline.py), any GPU type",
}
COST_MODEL_CHOICES = tuple(COST_MODELS)


def make_cost_model(name: str, gpu_name: str, artifact: str | Path | None = None) -> CostModel:
    """The cost model called ``name`` (a key of ``COST_MODELS``) for GPU type ``gpu_name``;
    ``artifact``: a profiled artifact file to use instead of the shipped one (``auto`` or
    ``profiled`` only; e.g. one written by ``tlora-sim costmodel calibrate``).

    Raises:
        InputError: unknown name, ``profiled`` for a GPU type with no shipped artifact, or an
            ``artifact`` that cannot be read, is malformed, is of another GPU type, or is given
            with ``roofline``.
    """
    if artifact:
        if name == "roofline":
            raise InputError("--artifact is a profiled model's; it does not go with --cost-model roofline",
                             field="--artifact")
        art = load_artifact(artifact)
        if str(art["gpu"]).upper() != str(gpu_name).upper():
            raise InputError(f"artifact {art['id']} is of GPU type {art['gpu']}, the cluster's is {gpu_name}",
                             file=str(artifact), field="gpu")
        return ProfiledCostModel(art)
    if name == "auto":
        return default_cost_model(gpu_name)
    if name == "roofline":
        return RooflineCostModel()
    if name == "profiled":
        p = artifact_path(gpu_name)
        if not p.is_file():
            raise InputError(f"no profiled cost model for {gpu_name} (expected {p}); use --cost-model roofline "
                             f"or profile that GPU", field="--cost-model")
        return ProfiledCostModel(load_artifact(p))
    raise InputError(f"unknown cost model {name!r}; expected one of {', '.join(COST_MODELS)}",
                     field="--cost-model")


def default_cost_model(gpu_name: str, directory: str | Path | None = None) -> CostModel:
    """The profiled model where ``directory`` (default ``profiler/data``) has an artifact for
    ``gpu_name``, else the analytic ``RooflineCostModel``."""
    p = artifact_path(gpu_name, directory)
    if p.is_file():
        return ProfiledCostModel(load_artifact(p))
    return RooflineCostModel()
