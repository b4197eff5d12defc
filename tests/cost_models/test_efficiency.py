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


def test_tile_quantisation_pads_each_weight_dimension_to_whole_tiles():
    from cost_models.efficiency import tile_quantisation

    # GPT-OSS's 2,880 on Blackwell's 256-wide tiles: 12 tiles, 3,072 computed, 16/15 per dimension; the
    # forward (n), the data gradient (k) and the weight gradient (n x k) average to (16/15 * 2 + 256/225) / 3
    assert tile_quantisation(2880, 2880, 256) == pytest.approx((2 * 16 / 15 + 256 / 225) / 3)
    # on Hopper's 128-row tiles: 23 tiles, 2,944 computed
    assert tile_quantisation(2880, 2880, 128) == pytest.approx((2 * 2944 / 2880 + (2944 / 2880) ** 2) / 3)
    # Qwen3-30B's 768-wide experts beside its 2,048 hidden size, DeepSeek-V3's 2,048 beside 7,168: whole tiles
    assert tile_quantisation(768, 2048, 256) == 1.0 and tile_quantisation(2048, 7168, 256) == 1.0
    # narrower than one tile: no padding (a router's 8 or 128 experts); one tile and a bit: two
    assert tile_quantisation(8, 4096, 256) == tile_quantisation(128, 2048, 256) == 1.0
    assert tile_quantisation(384, 4096, 256) == pytest.approx((2 * 512 / 384 + 1) / 3)  # forward, weight gradient
    eff = DEFAULT_EFFICIENCY
    assert eff.tile_factor("blackwell", 2880, 2880) == tile_quantisation(2880, 2880, 256)
    assert eff.tile_factor("hopper", 2880, 2880) == tile_quantisation(2880, 2880, 128)
    assert eff.tile_factor("ampere", 2880, 2880) == 1.0  # no tile stated: no padding costed


def test_power_headroom_is_blackwell_ultras_extra_power_at_nvidias_own_exponent():
    import math

    # the exponent is the B200 / GB200 pair's: 1.111x the peak for 1.2x the power
    b200, gb200 = GPUS["B200"], GPUS["GB200"]
    exponent = math.log(gb200.bf16_flops_per_s / b200.bf16_flops_per_s) / math.log(gb200.tdp_watts / b200.tdp_watts)
    assert DEFAULT_EFFICIENCY.power_rate_exponent == pytest.approx(exponent, abs=5e-4)
    ultra = {
        name: DEFAULT_EFFICIENCY.power_headroom(g.tdp_watts, g.peak_basis_watts, "mxfp8") for name, g in GPUS.items()
    }
    assert ultra["GB300"] == pytest.approx((1400 / 1200) ** 0.578) and ultra["GB300"] == pytest.approx(1.0932, abs=1e-4)
    assert ultra["B300"] == pytest.approx(1.1**0.578) and ultra["B300"] == pytest.approx(1.0566, abs=1e-4)
    assert all(v == 1.0 for name, v in ultra.items() if name not in ("B300", "GB300"))
    # NVFP4's Blackwell Ultra peak is its own (1.5x Blackwell's): no headroom on top
    assert DEFAULT_EFFICIENCY.power_headroom(1400, 1200, "nvfp4") == 1.0
