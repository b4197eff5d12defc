"""HOW MUCH a layout costs: model and training specs, FLOPs, memory, collectives, pipeline, step time."""

from cost_models.catalogue import MODELS, resolve_model
from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.layout import ParallelLayout, check_layout
from cost_models.model import ModelSpec
from cost_models.step import StepCost, estimate_step
from cost_models.training import TrainingSpec

__all__ = [
    "DEFAULT_EFFICIENCY",
    "MODELS",
    "Efficiency",
    "ModelSpec",
    "ParallelLayout",
    "StepCost",
    "TrainingSpec",
    "check_layout",
    "estimate_step",
    "resolve_model",
]
