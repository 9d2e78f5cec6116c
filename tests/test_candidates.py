"""Configuration generation (Hops §3.6) and its class-level description."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.policies.hops.candidates import FreeIndex, generate_configs
from scheduling.policies.hops.classes import (
    ClassOption,
    ServerClass,
    class_options,
    complete_pattern,
    maximal_patterns,
    realise_patterns,
    server_classes,
)
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve, config_throughput
from shared.ids import GpuType, JobId, ServerId

A, B = GpuType("A"), GpuType("B")
CURVE = ThroughputCurve(agg=(10.0, 9.5, 9.0, 8.5, 8.0, 7.5, 7.0, 6.5), dist=(8.0, 7.0, 6.0))
LOW = {A: 1.2, B: 1.2}  # rho below sigma = 1.4
HIGH = {A: 2.0, B: 2.0}


def cluster_of(types: Sequence[GpuType], gpus: int = 8) -> Cluster:
    """One server per entry of ``types``, named s0, s1, ... in that order."""
    specs = tuple(GpuTypeSpec(t, 1e9, 1e8) for t in sorted(set(types)))
    servers = tuple(Server(ServerId(f"s{i}"), t, gpus) for i, t in enumerate(types))
    return Cluster(specs, servers)


def free_of(*idle: int) -> dict[ServerId, int]:
    return {ServerId(f"s{i}"): g for i, g in enumerate(idle)}


def est_of(curve: ThroughputCurve = CURVE, **by_server: ThroughputCurve) -> JobEstimate:
    return JobEstimate(
        JobId("j"), {A: curve, B: curve}, {ServerId(k): v for k, v in by_server.items()}
    )


def parts(cands: Sequence[object]) -> set[tuple[tuple[str, int], ...]]:
    return {tuple(c.config.parts) for c in cands}  # type: ignore[attr-defined]


def gen(
    cluster: Cluster, free: Mapping[ServerId, int], reqs: Sequence[int],
    rho: Mapping[GpuType, float], est: JobEstimate | None = None,
) -> set[tuple[tuple[str, int], ...]]:
    return parts(generate_configs(cluster, free, tuple(reqs), rho, est or est_of()))


def test_aggregated_where_requirement_fits_including_a_whole_server() -> None:
    cluster = cluster_of([A, A, A])
    # R_k == S_t is allowed: a job needing all 8 idle GPUs of a server takes them.
    assert gen(cluster, free_of(2, 4, 8), [4], HIGH) == {(("s1", 4),), (("s2", 4),)}
    assert gen(cluster, free_of(2, 4, 8), [8], HIGH) == {(("s2", 8),)}


def test_high_sensitivity_gets_only_aggregated() -> None:
    cluster = cluster_of([A, A, A])
    assert gen(cluster, free_of(2, 2, 2), [4], HIGH) == set()
    assert gen(cluster, free_of(2, 2, 2), [4], LOW) == {
        (("s0", 2), ("s1", 2)),
        (("s1", 2), ("s2", 2)),
    }


def test_high_sensitivity_distributed_when_r1_exceeds_every_server() -> None:
    cluster = cluster_of([A, A, A])
    # R_1 = 16 > 8 GPUs of the largest server: distributed is the only way.
    assert gen(cluster, free_of(8, 8, 8), [16], HIGH) == {
        (("s0", 8), ("s1", 8)),
        (("s1", 8), ("s2", 8)),
    }
    # R_1 = 4 fits a server, so the sensitive job gets no distributed 16.
    assert gen(cluster, free_of(8, 8, 8), [4, 16], HIGH) == {
        (("s0", 4),), (("s1", 4),), (("s2", 4),)
    }


def test_distributed_fills_adjacent_nodes_and_stops() -> None:
    cluster = cluster_of([A, A, A, A])
    # From each start: all idle GPUs of each node, the last one partly; start
    # s3 has only 6 GPUs after it (< 7), so generation stops there.
    assert gen(cluster, free_of(3, 5, 2, 6), [7], LOW) == {
        (("s0", 3), ("s1", 4)),
        (("s1", 5), ("s2", 2)),
        (("s2", 2), ("s3", 5)),
    }
    assert gen(cluster_of([A, A, A]), free_of(4, 4, 4), [10], LOW) == {
        (("s0", 4), ("s1", 4), ("s2", 2))
    }


def test_adjacency_skips_busy_servers_and_other_types() -> None:
    cluster = cluster_of([A, B, A, A])
    got = gen(cluster, free_of(4, 8, 0, 4), [8], LOW)
    # s1 (type B) and s2 (no idle GPUs) are not part of type A's adjacency.
    assert got == {(("s1", 8),), (("s0", 4), ("s3", 4))}


def test_count_is_linear_in_servers() -> None:
    for n in (4, 16, 64):
        cluster = cluster_of([A] * n)
        cands = generate_configs(cluster, {s.id: 2 for s in cluster.servers}, (1, 4), LOW, est_of())
        aggregated = [c for c in cands if not c.config.is_distributed]
        distributed = [c for c in cands if c.config.is_distributed]
        assert len(aggregated) == n  # R=1 on every server; R=4 fits none
        assert len(distributed) == n - 1  # one per start, the last start stops


def test_throughput_by_section_3_5_and_zero_dropped() -> None:
    cluster = cluster_of([A, A])
    slow = ThroughputCurve(agg=(5.0,) * 8, dist=(2.0,))
    est = est_of(s1=slow)
    cands = generate_configs(cluster, free_of(4, 4), (2, 8), LOW, est)
    by_parts = {tuple(c.config.parts): c.throughput for c in cands}
    assert by_parts[(("s0", 2),)] == pytest.approx(2 * 9.5)
    assert by_parts[(("s1", 2),)] == pytest.approx(2 * 5.0)
    # Distributed: the slowest node's per-GPU throughput times all GPUs.
    assert by_parts[(("s0", 4), ("s1", 4))] == pytest.approx(8 * 2.0)
    no_dist = est_of(ThroughputCurve(agg=(1.0,) * 8))
    assert gen(cluster, free_of(4, 4), [8], LOW, no_dist) == set()


def test_duplicates_removed() -> None:
    cluster = cluster_of([A, A])
    cands = generate_configs(cluster, free_of(8, 8), (4, 4, 8), LOW, est_of())
    # 4 or 8 on either server; a fill of 8 from s0 stays on one node.
    assert len(cands) == len({c.config for c in cands}) == 4


def test_server_classes_split_by_type_idle_and_curve() -> None:
    cluster = cluster_of([A, A, A, B, A])
    other = ThroughputCurve(agg=(1.0,) * 8)
    classes = server_classes(cluster, free_of(8, 8, 4, 8, 8), [est_of(), est_of(s4=other)])
    assert [(k.gpu_type, k.free, k.servers) for k in classes] == [
        (A, 8, ("s0", "s1")),
        (A, 4, ("s2",)),
        (B, 8, ("s3",)),
        (A, 8, ("s4",)),
    ]
    # A per-server curve equal to the type's curve changes nothing.
    same = server_classes(cluster, free_of(8, 8, 0, 0, 8), [est_of(s1=CURVE)])
    assert [k.servers for k in same] == [("s0", "s1", "s4")]


def test_class_options() -> None:
    cluster = cluster_of([A, A, A])
    klass = ServerClass(A, 8, (ServerId("s0"), ServerId("s1"), ServerId("s2")))
    low = class_options(cluster, [klass], (4, 12, 32), LOW, est_of())
    assert [(o.gpus, o.full, o.part) for o in low] == [(4, 0, 4), (12, 1, 4)]  # 32 > 3 servers
    assert low[1].throughput == pytest.approx(12 * 8.0)
    assert class_options(cluster, [klass], (4, 12), HIGH, est_of())[-1].gpus == 4
    only_dist = class_options(cluster, [klass], (16,), HIGH, est_of())
    assert [(o.full, o.part, o.distributed) for o in only_dist] == [(2, 0, True)]


def agg(*sizes: int) -> list[tuple[int, bool]]:
    return [(g, False) for g in sizes]


def test_maximal_patterns() -> None:
    assert set(maximal_patterns(8, agg(8, 4, 2), 100) or ()) == {
        tuple(agg(8)), tuple(agg(4, 4)), tuple(agg(4, 2, 2)), tuple(agg(2, 2, 2, 2))
    }
    assert set(maximal_patterns(8, agg(3, 2), 100) or ()) == {
        tuple(agg(3, 3, 2)), tuple(agg(3, 2, 2)), tuple(agg(2, 2, 2, 2))
    }
    assert maximal_patterns(8, [], 100) == []
    assert maximal_patterns(16, agg(*range(1, 17)), 50) is None  # 231 partitions > 50


def test_patterns_hold_at_most_one_tail() -> None:
    # Two distributed jobs cannot both end on one server (§3.6 fill).
    tail = (4, True)
    got = set(maximal_patterns(8, [tail, (4, False)], 100) or ())
    assert got == {(tail, (4, False)), ((4, False), (4, False))}
    assert complete_pattern([tail], 8, [tail, (2, False)]) == (tail, (2, False), (2, False))
    assert complete_pattern(agg(2), 8, agg(4, 2, 1)) == tuple(agg(4, 2, 2))


def test_realise_patterns_feasible_and_consecutive() -> None:
    klass = ServerClass(A, 8, tuple(ServerId(f"s{i}") for i in range(4)))
    four = ClassOption(0, 4, 1.0, 0, 4)
    demands = [four, ClassOption(0, 20, 1.0, 2, 4), four]
    patterns = [tuple(agg(8)), ((4, True), (4, False))]
    configs = realise_patterns(klass, patterns, [2, 1], demands)
    # The distributed job: its whole nodes, then its tail, consecutively.
    assert configs[1] == Configuration.of({"s0": 8, "s1": 8, "s2": 4})
    assert configs[0] == Configuration.of({"s2": 4})
    # Only one aggregated 4-slot exists beside the tail.
    assert configs[2] is None


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Cluster, dict[ServerId, int], tuple[int, ...], JobEstimate]:
    types = draw(st.lists(st.sampled_from([A, B]), min_size=1, max_size=8))
    cluster = cluster_of(types)
    free = free_of(*draw(st.lists(st.integers(0, 8), min_size=len(types), max_size=len(types))))
    reqs = tuple(sorted(draw(st.sets(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), min_size=1))))
    return cluster, free, reqs, est_of()


@given(scenes(), st.sampled_from([LOW, HIGH]))
@settings(max_examples=80, deadline=None)
def test_generation_invariants(
    scene: tuple[Cluster, dict[ServerId, int], tuple[int, ...], JobEstimate],
    rho: Mapping[GpuType, float],
) -> None:
    cluster, free, reqs, est = scene
    cands = generate_configs(cluster, free, reqs, rho, est)
    assert len({c.config for c in cands}) == len(cands)
    assert len(cands) <= FreeIndex(cluster, free).count(reqs, rho, est)
    for c in cands:
        assert c.config.total_gpus in reqs
        assert all(g <= free[s] for s, g in c.config.parts)
        assert {cluster.by_id[s].gpu_type for s in c.config.servers} == {c.gpu_type}
        assert c.throughput > 0
        assert c.throughput == pytest.approx(config_throughput(est, cluster, c.config))
        if rho is HIGH and c.config.is_distributed:
            assert min(reqs) > 8
