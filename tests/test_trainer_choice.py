"""Which models a GPU's resident trainers keep (executor.trainer_choice,
Hare's speculative memory management): properties over random sequences,
and the rule's own cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.trainer_choice import kept, next_use, place

JOBS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
SEQUENCES = st.lists(JOBS, min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(resident=st.sets(JOBS, max_size=6), upcoming=SEQUENCES,
       capacity=st.integers(1, 4))
def test_kept_fits_keeps_the_next_and_is_deterministic(
        resident: set[str], upcoming: list[str], capacity: int) -> None:
    out = kept(resident, upcoming, capacity)
    assert len(out) <= capacity
    assert upcoming[0] in out
    assert out <= resident | {upcoming[0]}
    assert out == kept(sorted(resident, reverse=True), upcoming, capacity)
    # Belady: whatever is dropped is needed no sooner than anything kept.
    dropped = (resident | {upcoming[0]}) - out
    if dropped:
        assert len(out) == capacity
        assert min(next_use(j, upcoming) for j in dropped) >= max(
            next_use(j, upcoming) for j in out)


@settings(max_examples=300, deadline=None)
@given(holding=st.lists(st.sets(JOBS, max_size=3), min_size=1, max_size=3),
       upcoming=SEQUENCES, capacity=st.integers(1, 3))
def test_place_runs_where_the_model_is_and_stays_within_capacity(
        holding: list[set[str]], upcoming: list[str], capacity: int) -> None:
    holding = [set(sorted(h)[:capacity]) for h in holding]  # as a pool holds them
    where = place(holding, upcoming, capacity)
    job = upcoming[0]
    holders = [i for i, h in enumerate(holding) if job in h]
    if holders:
        assert where.trainer == holders[0] and not where.load
    else:
        assert where.load
    after = (holding[where.trainer] - set(where.evict)) | {job}
    assert len(after) <= capacity and job not in where.evict
    assert set(where.evict) <= holding[where.trainer]
    assert where == place([set(reversed(sorted(h))) for h in holding], upcoming, capacity)


def test_the_model_needed_latest_goes_and_a_free_place_comes_first() -> None:
    assert kept({"a", "b"}, ["c", "a", "c", "b"], 2) == {"c", "a"}
    assert kept({"a", "b"}, ["c", "b"], 2) == {"c", "b"}  # a has no task left
    assert kept({"a", "b"}, ["c"], 2) == {"a", "c"}  # none left: by id
    # Trainer 1 has room: nothing moves out.
    where = place([{"a", "b"}, {"c"}], ["d", "a", "b", "c"], 2)
    assert (where.trainer, where.evict, where.load) == (1, (), True)
    # Both full: move out the model needed latest (b, on trainer 0).
    where = place([{"a", "b"}, {"c", "e"}], ["d", "a", "c", "e", "b"], 2)
    assert (where.trainer, where.evict) == (0, ("b",))
    assert place([{"a"}, {"b"}], ["b", "a"], 1).evict == ()


def test_no_task_or_no_room_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        kept({"a"}, ["a"], 0)
    with pytest.raises(ValueError, match="next task"):
        kept({"a"}, [], 1)
    with pytest.raises(ValueError, match="trainer"):
        place([], ["a"], 1)


@settings(max_examples=300, deadline=None)
@given(holding=st.lists(st.sets(JOBS, max_size=2), min_size=1, max_size=3),
       upcoming=SEQUENCES, owners=st.lists(st.sampled_from([None, "t1", "t2"]), min_size=3,
                                           max_size=3),
       tenant=st.sampled_from(["t1", "t2"]))
def test_a_trainer_serves_one_tenant_until_it_is_reset(
        holding: list[set[str]], upcoming: list[str], owners: list[str | None],
        tenant: str) -> None:
    owner = owners[:len(holding)]
    holding = [h if o is not None else set() for h, o in zip(holding, owner, strict=True)]
    where = place(holding, upcoming, 2, owner, tenant)
    if owner[where.trainer] not in (None, tenant):
        # another tenant's process is given only fresh, and only when no other is left
        assert where.reset and where.load and where.evict == ()
        assert all(o not in (None, tenant) for o in owner)
    else:
        assert not where.reset


def test_tenants_do_not_share_a_trainer() -> None:
    # trainer 0 holds t1's job a; t2's job b goes to the free trainer 1
    assert place([{"a"}, set()], ["b", "a"], 2, ["t1", None], "t2").trainer == 1
    # no free trainer: the one whose models are needed latest is reset for t2
    where = place([{"a"}, {"c"}], ["b", "a", "c"], 2, ["t1", "t1"], "t2")
    assert (where.trainer, where.reset, where.load) == (1, True, True)
    # a trainer of its own tenant with room is used as before, not reset
    where = place([{"a"}, {"c"}], ["d", "a"], 2, ["t1", "t2"], "t2")
    assert (where.trainer, where.reset) == (1, False)
    with pytest.raises(ValueError, match="owners"):
        place([{"a"}], ["a"], 2, ["t1", "t2"], "t1")
