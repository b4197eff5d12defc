"""HOW MUCH a layout costs: model and training specs, FLOPs, memory, collectives, pipeline, step time.

Names load on first use (PEP 562): importing one submodule does not build the catalogues.
"""

from importlib import import_module

_WHERE = {
    "MODELS": "cost_models.catalogue",
    "resolve_model": "cost_models.catalogue",
    "DEFAULT_EFFICIENCY": "cost_models.efficiency",
    "Efficiency": "cost_models.efficiency",
    "ParallelLayout": "cost_models.layout",
    "check_layout": "cost_models.layout",
    "ModelSpec": "cost_models.model",
    "StepCost": "cost_models.step",
    "estimate_step": "cost_models.step",
    "TrainingSpec": "cost_models.training",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'cost_models' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
