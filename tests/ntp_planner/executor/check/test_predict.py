"""The validate prediction of a degraded replica is the planner's one degraded-replica cost
(``cost_models.degraded``): a replica at TP 1 instead of 2 computes twice as long per
micro-batch and sends no TP traffic, its data-parallel sync is the healthy replicas'."""

import pytest

from ntp_planner.executor.check.predict import predict_run
from ntp_planner.executor.spec import TinyConfig, make_spec
from ntp_planner.profiler.cluster import local_cluster
from tests.ntp_planner.test_profile_validate import cpu_profile


def test_a_tp1_replica_beside_tp2_ones_doubles_the_compute_and_drops_tp_traffic():
    # collectives far faster than compute, so that the degraded replica paces the pipeline; 8
    # cores, so that 3 and 4 processes compute at one speed (no shared-host slowdown)
    fast = [f.model_copy(update={"alpha_s": 1e-7, "bw_bytes_per_s": 1e12}) for f in cpu_profile().collective_fits]
    profile = cpu_profile(cores=8).model_copy(update={"collective_fits": tuple(fast)})
    cluster = local_cluster(profile)
    healthy = make_spec(TinyConfig(), [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 2, 8)
    degraded = make_spec(TinyConfig(), [[2, 2, 2, 2]], [([2], 2), ([1], 2)], 2, 8)
    h = predict_run(healthy, "llama3-8b", profile, cluster)
    d = predict_run(degraded, "llama3-8b", profile, cluster)
    # tp2 -> tp1: the one GPU holds every head, column and row, twice its tp2 share (work 2.0);
    # same 2 micro-batches, no TP ring left, so the pipeline is compute only, and 2 x compute
    # beats compute + TP traffic whenever the traffic is below the compute
    assert h.time_split_s["tp_comm"] < h.time_split_s["compute"]
    assert d.time_split_s["compute"] == pytest.approx(2 * h.time_split_s["compute"], rel=1e-12)
    assert d.time_split_s["tp_comm"] == 0.0
    assert d.time_split_s["dp_sync"] == pytest.approx(h.time_split_s["dp_sync"], rel=1e-12)
    assert d.time_split_s["optimizer"] == pytest.approx(h.time_split_s["optimizer"], rel=1e-12)
