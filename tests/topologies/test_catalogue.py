"""Every catalogue figure has a source; names resolve with suggestions."""

import pytest

from topologies import CLUSTERS, GPUS, Cluster, resolve_cluster_spec, resolve_gpu


@pytest.mark.parametrize("gpu", list(GPUS.values()), ids=lambda g: g.name)
def test_every_gpu_figure_has_a_source(gpu):
    figures = set(type(gpu).model_fields) - {"name", "sources"}
    assert figures <= set(gpu.sources), figures - set(gpu.sources)
    assert all(len(text) > 20 for text in gpu.sources.values())


@pytest.mark.parametrize("spec", list(CLUSTERS.values()), ids=lambda c: c.name)
def test_every_cluster_figure_has_a_source(spec):
    needed = {"nvlink_bw_bytes_per_s", "scaleout_bw_bytes_per_s", "nvlink_latency_s", "scaleout_latency_s"}
    assert needed <= set(spec.sources)


def test_datasheet_numbers():
    assert GPUS["H100-SXM"].bf16_flops_per_s == 989.4e12
    assert GPUS["A100-SXM4-80GB"].fp8_flops_per_s is None
    with pytest.raises(ValueError, match="no fp8 tensor cores; it runs fp16, bf16"):
        GPUS["A100-SXM4-80GB"].peak_flops_per_s("fp8")
    # Block-scaled formats are Blackwell's: the H100 refuses them, the B200 runs mxfp8 at its fp8
    # peak (4.5 PFLOP/s dense) and nvfp4 at its fp4 peak (9 PFLOP/s dense).
    with pytest.raises(ValueError, match="H100-SXM \\(hopper\\) has no mxfp8"):
        GPUS["H100-SXM"].peak_flops_per_s("mxfp8")
    assert GPUS["B200"].peak_flops_per_s("mxfp8") == 4.5e15
    assert GPUS["B200"].peak_flops_per_s("nvfp4") == 9e15
    assert (GPUS["A100-SXM4-80GB"].sm_count, GPUS["H100-SXM"].sm_count, GPUS["B200"].sm_count) == (108, 132, 148)
    # NTP study cluster: NVL32 of B200, 1.8 TB/s NVLink (900 GB/s one way), 800 Gb/s NIC per GPU.
    nvl32 = CLUSTERS["b200-nvl32"]
    assert (nvl32.domain_size, nvl32.nvlink_bw_bytes_per_s, nvl32.scaleout_bw_bytes_per_s) == (32, 900e9, 100e9)
    assert CLUSTERS["gb200-nvl72"].domain_size == 72


def test_unknown_names_suggest_close_ones():
    with pytest.raises(ValueError, match="did you mean 'dgx-h100'"):
        resolve_cluster_spec("dgx-h10")
    with pytest.raises(ValueError, match="did you mean 'H100-SXM'"):
        resolve_gpu("H100-SMX")


def test_custom_cluster_yaml(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(
        "gpu: H100-SXM\ndomain_size: 16\ngpus_per_node: 8\nnvlink_bw_bytes_per_s: 4.5e11\n"
        "nvlink_latency_s: 1e-6\nscaleout_bw_bytes_per_s: 5e10\nscaleout_latency_s: 5e-6\nspine_oversubscription: 2\n"
    )
    spec = resolve_cluster_spec(str(f))
    assert (spec.name, spec.domain_size, spec.spine_oversubscription) == ("mine", 16, 2.0)
    assert Cluster(spec=spec, num_gpus=64).num_domains == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu: [unclosed", "not valid YAML"),
        ("- a list", "must hold a mapping"),
        ("gpu: H100-SXM\ndomain_size: 8\n", "gpus_per_node: Field required"),
        (
            "gpu: H101\ndomain_size: 8\ngpus_per_node: 8\nnvlink_bw_bytes_per_s: 4.5e11\nnvlink_latency_s: 0\n"
            "scaleout_bw_bytes_per_s: 5e10\nscaleout_latency_s: 0\n",
            "unknown GPU 'H101'",
        ),
        (
            "gpu: H100-SXM\ndomain_size: 12\ngpus_per_node: 8\nnvlink_bw_bytes_per_s: 4.5e11\nnvlink_latency_s: 0\n"
            "scaleout_bw_bytes_per_s: 5e10\nscaleout_latency_s: 0\n",
            "must divide one another",
        ),
    ],
)
def test_bad_cluster_files(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        resolve_cluster_spec(str(f))
