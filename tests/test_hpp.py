"""HPP (Algorithm 1): the chain DP over forms equals brute force over 4^n form sequences, fastest and leanest."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import ir
from planner.cluster import cluster_from_dict, group_of
from planner.costmodel import FORM_INDEX, Grid, layer_table, summarise
from planner.search.hpp import hpp, memory_weight, stage_tables, stage_tables_many
from tests.conftest import make_cluster_dict, make_profile_dict


def _objective(table, first, end, forms, m, lean=False) -> float:
    s = summarise(table, first, end, [FORM_INDEX[f] for f in forms])
    return m * s["time"] + s["sync"] + memory_weight(table, m, lean) * (s["static0"] + s["act"])


@st.composite
def tables(draw, n=None, m=None):
    n = draw(st.integers(1, 6)) if n is None else n
    d = make_profile_dict(n, batch_size=8)
    for layer in d["layers"]:
        layer["forward_s"] = draw(st.floats(1e-5, 0.05))
        layer["param_bytes"] = draw(st.sampled_from([0, 1_000, 100_000_000]))
        layer["param_count"] = layer["param_bytes"] // 4
        layer["output_bytes"] = draw(st.sampled_from([1_000, 1_000_000, 100_000_000]))
        layer["saved_bytes"] = draw(st.sampled_from([1_000, 500_000, 50_000_000]))  # work_max: a maximum
        if layer["param_count"] and draw(st.booleans()):
            layer["in_features"], layer["out_features"] = 64, 64
        if draw(st.booleans()):
            layer["block"] = {"hidden": 64, "heads": 4, "kv_heads": draw(st.sampled_from([1, 2, 4])), "ffn": 256,
                              "seq_len": draw(st.sampled_from([16, 512]))}
    profile = ir.ModelProfile.from_dict(d)
    c = make_cluster_dict(2, 2)
    c["links"]["inter_node"]["bandwidth_Bps"] = draw(st.sampled_from([1e8, 1e10]))
    cluster = cluster_from_dict(c)
    devices = draw(st.sampled_from([["n0.g0"], ["n0.g0", "n0.g1"], [g.name for g in cluster.gpus]]))
    m = draw(st.sampled_from([1, 4])) if m is None else m
    group = group_of(cluster, devices)
    tp = draw(st.sampled_from([t for t in (1, 2, len(devices)) if len(devices) % t == 0]))
    grid = Grid(group, tp, draw(st.sampled_from(["fp32", "bf16"])), draw(st.booleans()))
    return layer_table(profile, grid, m, draw(st.sampled_from(["sgd", "adam"]))), n, m


@given(tables(), st.booleans())
def test_hpp_equals_brute_force_over_forms(arg, lean) -> None:
    table, n, m = arg
    for first in range(n):
        for end in range(first + 1, n + 1):
            forms, cost = hpp(table, first, end, m, lean)
            best = min(
                (_objective(table, first, end, fs, m, lean) for fs in itertools.product(ir.ALL_FORMS,
                                                                                         repeat=end - first)
                 if all(table.allowed[first + k, FORM_INDEX[f]] for k, f in enumerate(fs))),
                default=np.inf,  # a layer with no open form (a dp form whose samples the group does not divide)
            )
            assert cost == pytest.approx(best, rel=1e-9)
            if np.isfinite(best):
                assert _objective(table, first, end, forms, m, lean) == pytest.approx(cost, rel=1e-9)


@given(tables(), st.booleans())
def test_stage_tables_agree_with_hpp(arg, lean) -> None:
    table, n, m = arg
    t = stage_tables(table, list(range(n + 1)), m, lean)
    for first in range(n):
        for end in range(first + 1, n + 1):
            forms, cost = hpp(table, first, end, m, lean)
            if not np.isfinite(cost):  # no open form sequence: the table says so
                assert np.isinf(t.time[first, end])
                continue
            s = summarise(table, first, end, [FORM_INDEX[f] for f in forms])
            for key, values in t.agg.items():
                assert values[first, end] == pytest.approx(s[key], rel=1e-9, abs=1e-12), key
    assert np.isinf(t.time[1, 0]) or n == 0


@given(st.integers(1, 6), st.sampled_from([1, 4]), st.data())
def test_tables_swept_together_equal_each_alone(n, m, data) -> None:
    """One sweep over several tables of one layer count (the search's way) gives each table's own, over
    any boundaries, fastest or leanest per table."""
    same = [t for t, _, _ in data.draw(st.lists(tables(n, m), min_size=2, max_size=3))]
    cuts = data.draw(st.sets(st.integers(1, n - 1), max_size=n - 1)) if n > 1 else set()
    bounds = [0, *sorted(cuts), n]
    lean = [data.draw(st.booleans()) for _ in same]
    together = stage_tables_many(same, bounds, m, lean)
    for table, flag, got in zip(same, lean, together, strict=True):
        alone = stage_tables(table, bounds, m, flag)
        for key in alone.agg:
            np.testing.assert_array_equal(got.agg[key], alone.agg[key], err_msg=key)


def test_big_fc_layer_splits_on_slow_link() -> None:
    d = make_profile_dict(1, batch_size=8)
    d["layers"][0].update(param_bytes=400_000_000, param_count=100_000_000, output_bytes=1000,
                          in_features=10000, out_features=10000)
    profile = ir.ModelProfile.from_dict(d)
    c = make_cluster_dict(2, 1)
    c["links"]["inter_node"]["bandwidth_Bps"] = 1.25e8
    cluster = cluster_from_dict(c)
    table = layer_table(profile, group_of(cluster, ["n0.g0", "n1.g0"]), 1, "sgd")
    forms, _ = hpp(table, 0, 1, 1)
    assert forms[0] != "dp"


def test_no_shapes_means_dp_only() -> None:
    profile = ir.ModelProfile.from_dict(make_profile_dict(3))
    cluster = cluster_from_dict(make_cluster_dict(1, 2))
    table = layer_table(profile, group_of(cluster, ["n0.g0", "n0.g1"]), 1, "sgd")
    assert hpp(table, 0, 3, 1)[0] == ("dp", "dp", "dp")
