"""Efficiency lookups: every catalogue GPU is covered, and an uncovered one is an error, not a guess."""

import pytest

from cost_models.efficiency import DEFAULT_EFFICIENCY, FORMAT_CLASS, Efficiency
from topologies.errors import InputError
from topologies.gpus import FORMATS, GPUS


@pytest.mark.parametrize("gpu", list(GPUS))
def test_every_catalogue_gpu_has_a_figure_for_each_format_it_runs(gpu):
    spec = GPUS[gpu]
    for dtype in FORMATS:
        if spec.supports(dtype):
            assert 0.3 < DEFAULT_EFFICIENCY.gemm_peak_fraction(spec.architecture, dtype) < 0.9
    for kernel in ("cudnn", "flash2"):
        assert 0.2 < DEFAULT_EFFICIENCY.attention_fraction(spec.architecture, kernel) < 0.7


def test_an_architecture_without_figures_is_an_error_that_says_what_is_covered():
    eff = Efficiency(gemm_max={"hopper": {"16-bit": 0.64}}, flash_efficiency={"hopper": {"cudnn": 0.54}})
    assert eff.gemm_peak_fraction("hopper", "bf16") == 0.64 and FORMAT_CLASS["bf16"] == "16-bit"
    with pytest.raises(InputError, match=r"gemm_max has no figure for blackwell 16-bit \(it covers hopper: 16-bit\)"):
        eff.gemm_peak_fraction("blackwell", "bf16")
    with pytest.raises(InputError, match="gemm_max has no figure for hopper fp8"):
        eff.gemm_peak_fraction("hopper", "fp8")
    with pytest.raises(InputError, match="flash_efficiency has no figure for ampere cudnn"):
        eff.attention_fraction("ampere", "cudnn")
