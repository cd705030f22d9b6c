"""The QoS-weighted DP: exact against brute force, with the documented tie rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.stages.allocation import (
    best_values_by_capacity,
    covered_values,
    node_recommendation,
    solve_qos_dp,
)


def brute_force(values, capacity):
    """Best value and the lexicographically greatest optimal allocation."""
    best, best_alloc = -np.inf, None
    for alloc in itertools.product(*(range(len(v)) for v in values)):
        if sum(alloc) > capacity:
            continue
        total = sum(v[k] for v, k in zip(values, alloc, strict=True))
        if total > best or (total == best and alloc > best_alloc):
            best, best_alloc = total, alloc
    return list(best_alloc), best


small_int_values = st.lists(
    st.lists(st.integers(-5, 20), min_size=1, max_size=5), min_size=1, max_size=4
)


@settings(max_examples=1500, deadline=None)
@given(values=small_int_values, capacity=st.integers(0, 12))
def test_equals_brute_force_with_exact_ties_on_integer_values(values, capacity):
    # Integer values make ties exact, so the tie rule is checked exactly.
    units, value = solve_qos_dp([[float(x) for x in v] for v in values], capacity)
    expect_units, expect_value = brute_force(values, capacity)
    assert value == expect_value
    assert units == expect_units


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(
        st.lists(st.floats(-10, 100, allow_nan=False), min_size=1, max_size=5),
        min_size=1,
        max_size=4,
    ),
    capacity=st.integers(0, 12),
)
def test_equals_brute_force_on_float_values(values, capacity):
    units, value = solve_qos_dp(values, capacity)
    _, expect = brute_force(values, capacity)
    assert value == pytest.approx(expect, rel=1e-9, abs=1e-9)
    assert sum(units) <= capacity
    achieved = sum(v[k] for v, k in zip(values, units, strict=True))
    assert achieved == pytest.approx(expect, rel=1e-8, abs=1e-8)


@settings(max_examples=100, deadline=None)
@given(
    demands=st.lists(st.floats(0, 3), min_size=1, max_size=4),
    weights=st.lists(st.sampled_from([1.0, 3.0, 8.0]), min_size=4, max_size=4),
    capacity=st.integers(0, 40),
)
def test_covered_values_never_reward_cpu_beyond_demand(demands, weights, capacity):
    values = [covered_values(d, w, 0.1) for d, w in zip(demands, weights, strict=False)]
    units, value = solve_qos_dp(values, capacity)
    for d, k in zip(demands, units, strict=True):
        assert k * 0.1 <= d + 0.1 + 1e-9  # at most one partial unit past the demand
    assert value <= sum(w * d for d, w in zip(demands, weights, strict=False)) + 1e-9


def test_tie_goes_to_the_earlier_application():
    # Two equal apps, room for one: the first in the given order takes it.
    assert solve_qos_dp([[0, 1, 2], [0, 1, 2]], 2) == ([2, 0], 2.0)
    assert solve_qos_dp([[0, 1, 2], [0, 1, 2]], 3) == ([2, 1], 3.0)


def test_heavier_class_is_served_first():
    gold = covered_values(0.5, 8.0, 0.1)
    bronze = covered_values(0.5, 1.0, 0.1)
    units, value = solve_qos_dp([bronze, gold], 6)
    assert units == [1, 5]
    assert value == pytest.approx(8 * 0.5 + 0.1)


def test_one_recursion_gives_every_capacity():
    values = [covered_values(0.7, 3.0, 0.1), covered_values(0.4, 1.0, 0.1)]
    table = best_values_by_capacity(values, 15)
    for c in range(16):
        assert table[c] == pytest.approx(solve_qos_dp(values, c)[1])


@pytest.mark.parametrize(
    ("values", "capacity", "match"),
    [
        ([[0.0, 1.0]], -1, "capacity_units"),
        ([[0.0, 1.0]], 1.5, "capacity_units"),
        ([[]], 3, r"values\[0\]"),
        ([[0.0, float("nan")]], 3, r"values\[0\]"),
        ([[0.0], [[1.0]]], 3, r"values\[1\]"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(values, capacity, match):
    with pytest.raises(ValueError, match=match):
        solve_qos_dp(values, capacity)


def test_no_applications():
    assert solve_qos_dp([], 5) == ([], 0.0)


def test_node_recommendation_needs_gain_above_node_cost():
    # Demand of 30 units, 20 available: a 10-unit node adds 10 value.
    table = best_values_by_capacity([np.arange(31, dtype=float)], 40)
    assert node_recommendation(table, 20, 10, 3, node_cost=4.0).nodes_delta == 1
    # Gain equal to the cost either way: keep.
    assert node_recommendation(table, 20, 10, 3, node_cost=10.0).nodes_delta == 0
    # A node costing more than it earns is better removed.
    assert node_recommendation(table, 20, 10, 3, node_cost=12.0).nodes_delta == -1
    # Capacity far beyond demand: one node fewer loses nothing.
    table = best_values_by_capacity([np.arange(6, dtype=float)], 40)
    rec = node_recommendation(table, 30, 10, 3, node_cost=4.0)
    assert rec.nodes_delta == -1 and rec.value_one_fewer == rec.value_now
    # A single node is never removed.
    assert node_recommendation(table, 30, 10, 1, node_cost=4.0).nodes_delta == 0
