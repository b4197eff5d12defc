"""B300 and GB300 (Blackwell Ultra): per-GPU figures derived from NVIDIA's system datasheets.

NVIDIA prints system totals with sparsity; the catalogue holds one GPU's dense rate, so each check
redoes that division from the printed figure: HGX B300 (8 GPUs) FP16/BF16 36 PF, FP8 72 PF sparse,
FP4 108 PF dense; GB300 NVL72 (72 GPUs) FP16/BF16 360 PF, FP8 720 PF sparse, FP4 1,080 PF dense.
"""

import pytest

from topologies import CLUSTERS, GPUS, Cluster

PF = 1e15


@pytest.mark.parametrize(
    ("gpu", "gpus", "bf16_sparse", "fp8_sparse", "fp4_dense"),
    [("B300", 8, 36, 72, 108), ("GB300", 72, 360, 720, 1080)],
)
def test_rates_are_the_system_figures_per_gpu_dense(gpu, gpus, bf16_sparse, fp8_sparse, fp4_dense):
    g = GPUS[gpu]
    assert g.peak_flops_per_s("bf16") == pytest.approx(bf16_sparse * PF / gpus / 2)
    assert g.peak_flops_per_s("fp8") == pytest.approx(fp8_sparse * PF / gpus / 2)
    assert g.peak_flops_per_s("mxfp8") == g.peak_flops_per_s("fp8")
    assert g.peak_flops_per_s("nvfp4") == pytest.approx(fp4_dense * PF / gpus)
    # Blackwell Ultra's gain is NVFP4: 1.5x the B200 / GB200 rate, the 16-bit rates unchanged.
    base = GPUS["B200" if gpu == "B300" else "GB200"]
    assert g.fp4_flops_per_s / base.fp4_flops_per_s == pytest.approx(1.5)
    assert g.bf16_flops_per_s == base.bf16_flops_per_s


def test_memory_288_gib_at_8_tb_per_s():
    for name in ("B300", "GB300"):
        assert GPUS[name].hbm_bytes == 288 * 2**30
        assert GPUS[name].hbm_bw_bytes_per_s == 8e12
    # GB300 NVL72 prints "up to 21 TB" for the rack: 72 x 288 GB = 20.7 TB.
    assert 72 * 288e9 == pytest.approx(21e12, rel=0.02)


def test_clusters_nvlink5_and_connectx8():
    b300, nvl72 = CLUSTERS["dgx-b300"], CLUSTERS["gb300-nvl72"]
    assert (b300.gpu, b300.domain_size, b300.gpus_per_node) == ("B300", 8, 8)
    assert (nvl72.gpu, nvl72.domain_size, nvl72.gpus_per_node) == ("GB300", 72, 4)
    for spec in (b300, nvl72):
        assert spec.nvlink_bw_bytes_per_s == 1.8e12 / 2  # 1.8 TB/s bidirectional
        assert spec.scaleout_bw_bytes_per_s == 800e9 / 8  # 800 Gb/s
    # 144 GPUs of NVL72 racks: two domains of 72, 18 trays each; GPUs 71 and 72 meet over the NICs.
    c = Cluster(spec=nvl72, num_gpus=144)
    assert c.num_domains == 2
    assert c.group_links([71, 72]).domains == 2
