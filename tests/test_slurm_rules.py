"""The rules the Slurm bridge judges its readings by (shared/slurm.py and
shared/slurm_nodes.py): a start's job read gone, an id Slurm gave again, an
end Hops did not ask for, a node's death and the refusals of a start before
sbatch. Worked examples, then the rules' invariants as properties. No Slurm
needed."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.slurm import (
    JOB_GONE,
    STOPPED_OUTSIDE,
    JobVerdict,
    StartOf,
    end_verdict,
    holds_node,
    is_this_start,
    job_name,
    job_verdict,
    start_verdict,
    stop_read_end,
)
from shared.slurm_nodes import (
    dead_since_after,
    node_counted_alive,
    node_health,
    node_refusal,
    undetermined_since_after,
)

START = StartOf(job_id="j1", server="n1", slurm_id=7, submitted_at=100.0)


class Job(msgspec.Struct, frozen=True):
    """A Slurm job as a reading shows it (the fields the rules read)."""

    name: str
    nodes: str = "n1"
    job_state: str = "RUNNING"
    state_reason: str = ""
    exit_code: int | None = None


def test_a_job_listed_under_the_starts_id_is_its_only_when_it_names_it() -> None:
    assert is_this_start(START, Job(job_name("j1", 5)))
    assert is_this_start(START, Job(job_name("j1", 5), nodes=""))  # pending: no node yet
    assert not is_this_start(START, Job(job_name("j2", 5)))  # the id given to another job
    assert not is_this_start(START, Job(job_name("j1", 5), nodes="n2"))  # another node's start
    assert not is_this_start(START, Job("wrap"))  # not Hops' at all


def test_a_missing_job_is_gone_only_for_a_reading_begun_after_the_submission() -> None:
    assert start_verdict(START, None, 99.0, stopping=False) is None  # may predate sbatch
    assert start_verdict(START, None, 100.0, stopping=False) is None
    gone = start_verdict(START, None, 100.5, stopping=False)
    assert gone == JobVerdict(kind="requeue", code=JOB_GONE,
                              reason="Slurm no longer knows job 7")


def test_an_id_slurm_gave_again_reads_as_the_starts_job_gone() -> None:
    # A slurmctld that lost its state gave id 7 to j2, which failed: j1 is
    # gone (requeued from its progress), never failed with j2's failure.
    reused = Job(job_name("j2", 9), job_state="FAILED", exit_code=3 << 8)
    verdict = start_verdict(START, reused, 101.0, stopping=False)
    assert verdict is not None and (verdict.kind, verdict.code) == ("requeue", JOB_GONE)
    assert stop_read_end(START, reused) is None  # the stop waits for the next reading


def test_the_starts_own_job_is_judged_by_its_state() -> None:
    own = Job(job_name("j1", 5), job_state="FAILED", exit_code=3 << 8)
    verdict = start_verdict(START, own, 50.0, stopping=False)  # a reading's age is no matter
    assert verdict is not None and (verdict.kind, verdict.exit_code) == ("failed", 3)
    stopped = start_verdict(START, own, 101.0, stopping=True)
    assert stopped is not None and stopped.kind == "stopped"
    running = start_verdict(START, Job(job_name("j1", 5)), 101.0, stopping=False)
    assert running is not None and holds_node(running)


def test_a_stop_takes_the_end_its_own_reading_shows() -> None:
    assert stop_read_end(START, None) is None  # forgotten: the next reading says
    assert stop_read_end(START, Job(job_name("j1", 5))) is None  # still running
    ended = stop_read_end(START, Job(job_name("j1", 5), job_state="CANCELLED", exit_code=15))
    assert ended is not None and (ended.kind, ended.code) == ("stopped", "slurm_stopped")


def test_an_end_hops_did_not_ask_for_is_reported_outside() -> None:
    done = job_verdict("COMPLETED", 0)
    assert end_verdict(done, "finished") == done
    assert end_verdict(done, "") == done  # the job wrote no progress line
    outside = end_verdict(done, "sample")
    assert (outside.kind, outside.code, outside.exit_code) == ("outside", STOPPED_OUTSIDE, 0)
    assert outside.reason == "the job ended (sample) without Hops asking it to"
    failed = job_verdict("FAILED", 3 << 8)
    assert end_verdict(failed, "sample") == failed


def test_a_node_is_dead_once_its_dead_readings_outlast_the_debounce() -> None:
    assert node_counted_alive(True, 0.0, None, 3.0)
    assert node_counted_alive(False, 0.0, None, 3.0)  # nothing read yet: nothing known
    assert not node_counted_alive(False, 10.0, None, 3.0)  # no longer in the partition
    assert node_counted_alive(True, 12.9, 10.0, 3.0)  # a resumed node's second of "idle*"
    assert not node_counted_alive(True, 13.0, 10.0, 3.0)


def test_a_restarted_slurmctlds_unknown_nodes_keep_their_last_verdict() -> None:
    """Right after slurmctld restarts it reads the nodes it has not heard
    from yet as UNKNOWN, for seconds (three on the CI's cluster, more on a
    busy host): that neither kills an alive node nor revives a dead one,
    and no start goes there meanwhile."""
    unknown, idle, down = node_health("unknown"), node_health("idle"), node_health("down")
    assert dead_since_after(None, unknown, 20.0) is None  # alive before: still alive
    assert node_counted_alive(True, 25.0, dead_since_after(None, unknown, 25.0), 3.0)
    assert dead_since_after(10.0, unknown, 20.0) == 10.0  # dead before: its death goes on
    assert dead_since_after(None, down, 20.0) == 20.0
    assert dead_since_after(10.0, down, 20.0) == 10.0
    assert dead_since_after(10.0, idle, 20.0) is None
    assert undetermined_since_after(None, unknown, 20.0) == 20.0
    assert undetermined_since_after(20.0, unknown, 23.0) == 20.0
    assert undetermined_since_after(20.0, idle, 23.0) is None
    # ... for ten debounces at most: a node slurmctld never hears from is dead
    assert node_counted_alive(True, 49.9, None, 3.0, undetermined_since=20.0)
    assert not node_counted_alive(True, 50.0, None, 3.0, undetermined_since=20.0)
    refused = node_refusal("n3", "hops", 5.0, unknown)
    assert refused is not None and refused[0] == "slurm_node_down"
    assert "undetermined" in refused[1], refused


@given(st.lists(st.sampled_from(["idle", "mixed", "down", "idle*", "unknown", "unknown*"]),
                min_size=1, max_size=30), st.integers(1, 5))
def test_unknown_readings_never_decide_a_nodes_fate(states: list[str], down_s: int) -> None:
    """Dropping every UNKNOWN reading from a node's history leaves whether
    Hops counts it alive unchanged at every other reading (one a second)."""
    def verdicts(kept: list[tuple[int, str]]) -> dict[int, bool]:
        since: float | None = None
        out = {}
        for at, state in kept:
            since = dead_since_after(since, node_health(state), float(at))
            out[at] = node_counted_alive(True, float(at), since, down_s)
        return out
    readings = list(enumerate(states, start=1))
    every = verdicts(readings)
    known = verdicts([(at, s) for at, s in readings if not s.startswith("unknown")])
    assert {at: v for at, v in every.items() if at in known} == known


def test_a_start_on_a_dead_drained_or_unlisted_node_is_refused_with_slurms_reason() -> None:
    assert node_refusal("n1", "hops", 0.0, None) is None  # nothing read yet: nothing known
    assert node_refusal("n7", "hops", 5.0, None) == (
        "slurm_no_node", "n7 is not a node of partition hops")
    assert node_refusal("n1", "hops", 5.0, node_health("mixed")) is None
    assert node_refusal("n1", "hops", 5.0, node_health("down*", reason="boom")) == (
        "slurm_node_down", "Slurm reads node n1 as down: boom")
    assert node_refusal("n1", "hops", 5.0, node_health("idle*")) == (
        "slurm_node_down", "Slurm reads node n1 as not_responding: no reason given")
    assert node_refusal("n1", "hops", 5.0, node_health("idle", ("DRAIN",), "maint")) == (
        "slurm_node_drained", "Slurm has drained node n1: maint")


_STATES = st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                           "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "WIBBLE", "COMPLETING"])
_IDS = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=6)


@st.composite
def not_the_starts(draw: st.DrawFn, job_id: str) -> Job:
    """A job a reading lists under a start's id that is not that start's
    (Hops job ``job_id`` on n1): another Hops job's start, this job's start
    on another node, or no Hops job at all; in any state."""
    other = draw(_IDS.filter(lambda i: i != job_id))
    name, nodes = draw(st.sampled_from([
        (job_name(other, 5), draw(st.sampled_from(["", "n1", "n2"]))),
        (job_name(job_id, 5), "n2"),
        (draw(st.text(max_size=8).filter(lambda t: not t.startswith("hops:"))), "n1")]))
    return Job(name, nodes=nodes, job_state=draw(_STATES),
               exit_code=draw(st.one_of(st.none(), st.integers(0, 1 << 16))))


@given(st.data(), _IDS, st.floats(0, 1e4), st.floats(0, 1e4), st.booleans())
def test_a_job_that_is_not_the_starts_never_ends_it_but_as_gone(
        data: st.DataObject, job_id: str, submitted: float, read_at: float,
        stopping: bool) -> None:
    """Whatever another job listed under a start's id does (fails, is
    cancelled, finishes), the start reads no end of its own from it: it is
    either not judged yet or gone, and gone only for a reading begun after
    its submission; a stop never takes it for its job's end."""
    start = StartOf(job_id=job_id, server="n1", slurm_id=7, submitted_at=submitted)
    job = data.draw(not_the_starts(job_id))
    verdict = start_verdict(start, job, read_at, stopping=stopping)
    assert stop_read_end(start, job) is None
    if read_at <= submitted:
        assert verdict is None
    else:
        assert verdict is not None and (verdict.kind, verdict.code) == ("requeue", JOB_GONE)


# Whole milliseconds (as integers, so that the sums below are exact).
@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**7),
       st.integers(1, 10**5))
def test_a_listed_node_is_called_dead_only_after_its_death_outlasts_the_debounce(
        dead_since: int, later: int, more: int, down_s: int) -> None:
    """A node the partition lists, read dead since ``dead_since``, is alive
    for every reading within ``down_s`` of that, and once called dead stays
    dead for every later reading of the same death."""
    first, second = dead_since + later, dead_since + later + more
    alive = node_counted_alive(True, first, dead_since, down_s)
    assert alive == (later < down_s)
    if not alive:
        assert not node_counted_alive(True, second, dead_since, down_s)
    assert node_counted_alive(True, first, None, down_s)  # read alive: alive
