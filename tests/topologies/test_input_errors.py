"""Bad cluster input ends in one sentence: InputError (or pydantic's ValidationError), never a
traceback, a hang or a plan of nulls. Bounds carry units and reasons; files are read defensively."""

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from topologies import CLUSTERS, GPUS, Cluster, ClusterSpec, GPUSpec, InputError, resolve_cluster_spec
from topologies.bounds import Bound, show
from topologies.cluster import MAX_GPUS
from topologies.cluster_catalogue import first_error, load_cluster_spec
from topologies.files import MAX_DEPTH, MAX_FILE_BYTES, read_mapping

H100 = CLUSTERS["dgx-h100"].model_dump()


def sentence(exc: BaseException) -> str:
    """The one line a user sees; fails the test if there is more than one."""
    text = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
    assert text and "\n" not in text, text
    return text


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


def test_bound_message_shows_range_unit_and_reason():
    bound = Bound(1, 10_000_000, "sequences", "published runs step 1,000 to 16,000 sequences")
    assert bound.check(5) == 5 and bound.check(None) is None
    with pytest.raises(InputError) as err:
        bound.check(10**30)
    assert str(err.value) == (
        "must lie in 1..10,000,000 sequences, not 1e+30: published runs step 1,000 to 16,000 sequences"
    )


@pytest.mark.parametrize(
    ("value", "text"), [(0, "0"), (12_345, "12,345"), (10**8, "1e+08"), (0.5, "0.5"), (1e-300, "1e-300")]
)
def test_show(value, text):
    assert show(value) == text


# ---- ClusterSpec ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("nvlink_bw_bytes_per_s", 1e-300, "nvlink_bw_bytes_per_s: must lie in 1e+08..1e+14 bytes/s, not 1e-300"),
        ("nvlink_bw_bytes_per_s", math.inf, "nvlink_bw_bytes_per_s: Input should be a finite number"),
        ("scaleout_bw_bytes_per_s", math.nan, "scaleout_bw_bytes_per_s: Input should be a finite number"),
        ("scaleout_bw_bytes_per_s", 400, "is the unit bytes/s?"),  # 400 Gb/s given as a number of bytes/s
        ("scaleout_bw_bytes_per_s", 0, "scaleout_bw_bytes_per_s: Input should be greater than 0"),
        ("scaleout_latency_s", 5, "scaleout_latency_s: must lie in 0..1 s, not 5"),
        ("nvlink_latency_s", -1e-6, "nvlink_latency_s: Input should be greater than or equal to 0"),
        ("domain_size", 10**30, "domain_size: must lie in 1..4,096 GPUs, not 1e+30"),
        ("gpus_per_node", 0, "gpus_per_node: Input should be greater than 0"),
        ("nodes_per_leaf", 10**9, "nodes_per_leaf: must lie in 1..100,000 hosts"),
        ("spine_oversubscription", 1e6, "spine_oversubscription: must lie in 1..1,000 x"),
        ("gpu", "H101", "unknown GPU 'H101': did you mean"),
        ("name", "", "name: String should have at least 1 character"),
        ("domain_size", 12, "domain_size (12) and gpus_per_node (8) must divide one another"),
    ],
)
def test_bad_cluster_spec_fields(field, value, message):
    with pytest.raises(ValueError) as err:
        ClusterSpec(**{**H100, field: value})
    assert message in sentence(err.value)


NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=2000)
@given(
    field=st.sampled_from(
        [
            "domain_size",
            "gpus_per_node",
            "nvlink_bw_bytes_per_s",
            "nvlink_latency_s",
            "scaleout_bw_bytes_per_s",
            "scaleout_latency_s",
            "nodes_per_leaf",
            "spine_oversubscription",
        ]
    ),
    value=NUMBERS,
)
def test_any_cluster_field_value_is_accepted_finite_or_refused_in_one_line(field, value):
    try:
        spec = ClusterSpec(**{**H100, field: value})
    except ValueError as exc:
        sentence(exc)
        return
    number = getattr(spec, field)
    assert math.isfinite(number) and number >= 0
    if field.endswith("bw_bytes_per_s"):
        assert 1e8 <= number <= 1e14  # neither free nor endless collectives


# ---- GPUSpec ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("bf16_flops_per_s", 1e30, "bf16_flops_per_s: must lie in 1e+08..1e+18 FLOP/s, not 1e+30"),
        ("hbm_bytes", 80, "hbm_bytes: must lie in"),
        ("hbm_bw_bytes_per_s", math.inf, "Input should be a finite number"),
        ("sm_count", 10**12, "sm_count: must lie in 1..10,000 SMs"),
        ("fp8_flops_per_s", -1.0, "fp8_flops_per_s: Input should be greater than 0"),
    ],
)
def test_bad_gpu_spec_fields(field, value, message):
    with pytest.raises(ValidationError) as err:
        GPUSpec(**{**GPUS["H100-SXM"].model_dump(), field: value})
    assert message in sentence(err.value)


def test_format_errors_are_input_errors_without_cli_flags():
    with pytest.raises(InputError, match="choose a format this GPU runs") as err:
        GPUS["A100-SXM4-80GB"].peak_flops_per_s("fp8")
    assert "--" not in str(err.value)
    with pytest.raises(InputError, match="unknown number format 'fp7'"):
        GPUS["B200"].peak_flops_per_s("fp7")


# ---- Cluster ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_gpus=10**30), "num_gpus: must lie in 1..1,000,000 GPUs, not 1e+30: the largest training clusters"),
        (dict(num_gpus=MAX_GPUS + 8), "num_gpus: must lie in 1..1,000,000 GPUs, not 1,000,008"),
        (dict(num_gpus=0), "num_gpus: Input should be greater than 0"),
        (dict(num_gpus=12), "12 GPUs is not a multiple of dgx-h100's host size 8 (12 % 8 = 4); use 8 or 16"),
        (dict(num_gpus=16, gpus_per_domain=16), "16 GPUs per domain is more than dgx-h100's NVLink domain size 8"),
        (dict(num_gpus=16, failed_gpus=frozenset({16})), "failed GPU ids [16] are outside 0..15"),
    ],
)
def test_bad_cluster_sizes(kwargs, message):
    with pytest.raises(ValueError) as err:
        Cluster(spec=CLUSTERS["dgx-h100"], **kwargs)
    assert message in sentence(err.value)


def test_a_million_gpus_is_accepted_in_constant_time():
    assert Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=MAX_GPUS).num_nodes == MAX_GPUS // 8


def test_unknown_cluster_name_is_an_input_error_without_cli_words():
    with pytest.raises(InputError, match="did you mean 'dgx-h100'") as err:
        resolve_cluster_spec("dgx-h10")
    assert "--" not in str(err.value) and "ntp " not in str(err.value)


# ---- files ------------------------------------------------------------------------------
GOOD_YAML = (
    "gpu: H100-SXM\ndomain_size: 8\ngpus_per_node: 8\nnvlink_bw_bytes_per_s: 4.5e11\nnvlink_latency_s: 1e-6\n"
    "scaleout_bw_bytes_per_s: 5e10\nscaleout_latency_s: 5e-6\n"
)


def _bomb(levels: int = 9) -> str:
    """A YAML 'billion laughs': nine lines that expand to 10**9 values."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("latin1.yaml", "gpu: H100\xa0SXM\n".encode("latin-1"), "is not UTF-8 text (byte 0xa0 at offset 9)"),
        ("deep.json", b"[" * 200_000 + b"]" * 200_000, f"nests deeper than {MAX_DEPTH} levels"),
        ("nan.json", json.dumps({**H100, "nvlink_bw_bytes_per_s": math.nan}).encode(), "Input should be a finite"),
        ("deep.yaml", b"a: " + b"[" * 5_000 + b"]" * 5_000, "nests deeper than"),
        ("bomb.yaml", _bomb().encode(), "reuses a block through a YAML alias"),
        ("loop.yaml", b"a: &x [*x]\n", "reuses a block through a YAML alias"),
        ("huge-int.json", b'{"domain_size": ' + b"9" * 5000 + b"}", "holds a number of more than 4,300 digits"),
        ("bad-date.yaml", b"gpu: 2024-13-45\n", "is not valid YAML: month must be in 1..12"),
        ("twice.json", b'{"gpu": "H100-SXM", "gpu": "B200"}', "gives the key 'gpu' twice in one mapping"),
        ("twice.yaml", b"gpu: H100-SXM\nsources: {a: x, a: y}\n", "gives the key 'a' twice in one mapping"),
        ("twice-quoted.yaml", b"gpu: H100-SXM\n'gpu': B200\n", "gives the key 'gpu' twice in one mapping"),
        ("list.yaml", b"- 1\n- 2\n", "must hold a mapping of keys to values"),
        ("empty.yaml", b"", "must hold a mapping of keys to values"),
        ("keys.yaml", b"1: a\n", "has key 1, which is not text"),
        ("syntax.json", b"{not json", "is not valid JSON"),
        ("nan.yaml", GOOD_YAML.replace("4.5e11", ".nan").encode(), "nvlink_bw_bytes_per_s: Input should be a finite"),
        ("inf.yaml", GOOD_YAML.replace("5e10", "1e999").encode(), "scaleout_bw_bytes_per_s: Input should be a finite"),
        ("tiny.yaml", GOOD_YAML.replace("5e10", "1e-300").encode(), "scaleout_bw_bytes_per_s: must lie in 1e+08"),
        ("extra.yaml", (GOOD_YAML + "color: red\n").encode(), "color: Extra inputs are not permitted"),
        ("date.yaml", (GOOD_YAML + "description: 2024-01-01\n").encode(), "description: Input should be a valid"),
        # a quoted number or a boolean is refused, not converted (true was read as 1 GPU per domain)
        (
            "bool.json",
            json.dumps({**H100, "domain_size": True}).encode(),
            "domain_size: Input should be a valid integer",
        ),
        ("str.json", json.dumps({**H100, "domain_size": "8"}).encode(), "domain_size: Input should be a valid integer"),
        (
            "quoted.yaml",
            GOOD_YAML.replace("5e10", "'5e10'").encode(),
            "scaleout_bw_bytes_per_s: Input should be a valid",
        ),
        ("float.json", json.dumps({**H100, "gpus_per_node": 8.0}).encode(), "gpus_per_node: Input should be a valid"),
    ],
)
def test_hostile_cluster_files(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_cluster_spec(path)
    text = sentence(err.value)
    assert message in text and str(path) in text  # the file is always named


def test_good_cluster_file_with_a_bom_loads(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_YAML.encode())
    assert load_cluster_spec(path).name == "mine"


def test_huge_folder_and_pipe_are_refused_without_reading(tmp_path):
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written or read
    with pytest.raises(InputError, match="more than the 16,777,216 a cluster file can need"):
        load_cluster_spec(huge)
    with pytest.raises(InputError, match="it is a folder"):
        load_cluster_spec(tmp_path)
    with pytest.raises(InputError, match="No such file"):
        load_cluster_spec(tmp_path / "missing.yaml")
    pipe = tmp_path / "pipe.yaml"
    os.mkfifo(pipe)  # reading it would block for ever
    with pytest.raises(InputError, match="not a regular file"):
        load_cluster_spec(pipe)


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_give_a_mapping_or_one_sentence(tmp_path, content):
    for suffix in (".json", ".yaml"):
        path = tmp_path / f"fuzz{suffix}"
        path.write_bytes(content)
        try:
            assert isinstance(read_mapping(path, "cluster file"), dict)
        except InputError as exc:
            assert str(path) in sentence(exc)


@settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(sorted(ClusterSpec.model_fields)),
    value=NUMBERS | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
def test_any_cluster_file_loads_or_fails_in_one_sentence(tmp_path, field, value):
    data = {**json.loads(json.dumps(H100)), field: value}
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(data))
    try:
        spec = load_cluster_spec(path)
    except InputError as exc:
        assert str(path) in sentence(exc)
        return
    assert Cluster(spec=spec, num_gpus=spec.gpus_per_node).num_gpus == spec.gpus_per_node
