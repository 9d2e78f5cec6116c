"""A placer started again adopts what its predecessor started: an executor
answers a start of a job that already runs there exactly as asked with
``already_started`` (:meth:`executor.ledger.NodeLedger.same_start`), and
the placer counts the start as done only when every server of the job runs
that one earlier start (:func:`services.placer.commands.adoption_problem`)."""

from __future__ import annotations

from executor.ledger import NodeLedger
from services.placer.commands import adopted, adoption_problem
from shared import events as ev
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.records import Placement
from tests.test_executor_resources import SERVER, S, T, cfg, spec, start


def ok(key: str, started_by: str = "") -> ev.CommandAck:
    code = ev.ALREADY_STARTED if started_by else ""
    return ev.CommandAck(key=key, ok=True, code=code, started_by=started_by)


def test_a_start_of_a_job_running_exactly_so_is_the_same_start() -> None:
    ledger = NodeLedger(SERVER)
    first = start("start:t1.r1.p5:j1@s", "j1", (0, 1), cfg(2, cores=4, other=1))
    ledger.book(first)
    again = start("start:t1.r3.p9:j1@s", "j1", (0, 1), cfg(2, cores=4, other=1))
    booking = ledger.same_start(again)
    assert booking is not None and booking.key == first.key
    # anything else is another start, refused as before
    # other indices, as many: the same start, on the GPUs it runs on
    numbered = ledger.same_start(start("k", "j1", (2, 3), cfg(2, cores=4, other=1)))
    assert numbered is not None and numbered.gpu_indices == (0, 1)
    others = [start("k", "j1", (0,), cfg(1, cores=4, other=1)),       # fewer GPUs
              start("k", "j1", (0, 1), cfg(2, cores=5, other=1)),     # other cores
              start("k", "j1", (0, 1), cfg(2, cores=4)),              # other servers
              start("k", "j1", (0, 1), cfg(2, cores=4, other=1), mode="profile"),
              start("k", "j2", (0, 1), cfg(2, cores=4, other=1))]     # another job
    for cmd in others:
        assert ledger.same_start(cmd) is None, cmd
    refused = ledger.refuse_start(others[0])
    assert refused is not None and refused.error == "job j1 already runs on s"
    ledger.ending(JobId("j1"))  # it said it finished: no start of it is the same
    assert ledger.same_start(again) is None


def test_a_profiling_run_and_a_gpu_less_part_match_too() -> None:
    ledger = NodeLedger(SERVER)
    profile = Configuration.of({S: 1})
    ledger.book(start("p1", "j1", (3,), profile, mode="profile"))
    assert ledger.same_start(start("p2", "j1", (3,), profile, mode="profile")) is not None
    cpu = Configuration.cpu(S, 2)
    ledger.book(start("c1", "j2", (), cpu))
    assert ledger.same_start(start("c2", "j2", (), cpu)) is not None


def test_a_command_for_another_server_is_never_the_same_start() -> None:
    ledger = NodeLedger(SERVER)
    ledger.book(start("k1", "j1", (0,), cfg(1, other=1)))
    elsewhere = ev.StartJob(key="k2", job_id=JobId("j1"), server_id=T, spec=spec("j1"),
                            configuration=cfg(1, other=1), gpu_indices=(0,))
    assert ledger.same_start(elsewhere) is None


def test_the_placer_adopts_a_job_all_its_servers_run_from_one_earlier_start() -> None:
    a, b = ServerId("a"), ServerId("b")
    fresh = [ok("start:p9:j@a"), ok("start:p9:j@b")]
    assert adoption_problem([a, b], fresh) is None
    adopted = [ok("start:p9:j@a", "start:p5:j@a"), ok("start:p9:j@b", "start:p5:j@b")]
    assert adoption_problem([a, b], adopted) is None
    assert adoption_problem([a], adopted[:1]) is None


def test_a_job_running_from_an_earlier_start_on_some_servers_only_is_not_adopted() -> None:
    a, b = ServerId("a"), ServerId("b")
    partly = [ok("start:p9:j@a", "start:p5:j@a"), ok("start:p9:j@b")]
    assert adoption_problem([a, b], partly) == (
        "it already ran on a from an earlier start and started now on b")
    mixed = [ok("start:p9:j@a", "start:p5:j@a"), ok("start:p9:j@b", "start:p7:j@b")]
    assert adoption_problem([a, b], mixed) == (
        "its servers run it from different starts (start:p5:j, start:p7:j)")


def test_an_adopted_placement_names_the_gpus_the_job_runs_on() -> None:
    a, b = ServerId("a"), ServerId("b")
    placement = Placement(job_id=JobId("j"), configuration=Configuration.of({a: 2, b: 1}),
                          gpu_indices={a: (0, 1), b: (0,)})
    fresh = [ok("start:p9:j@a"), ok("start:p9:j@b")]
    assert adopted(placement, [a, b], fresh) == placement
    running = [ev.CommandAck(key="start:p9:j@a", ok=True, code=ev.ALREADY_STARTED,
                             started_by="start:p5:j@a", gpu_indices=(4, 5)),
               ev.CommandAck(key="start:p9:j@b", ok=True, code=ev.ALREADY_STARTED,
                             started_by="start:p5:j@b", gpu_indices=(0,))]
    assert adopted(placement, [a, b], running).gpu_indices == {a: (4, 5), b: (0,)}


def test_the_ack_says_which_start_runs_the_job_on_the_wire() -> None:
    ack = ok("start:p9:j@a", "start:p5:j@a")
    back = ev.decode_ack(ev.encode(ack))
    assert (back.ok, back.code, back.started_by) == (True, "already_started", "start:p5:j@a")
    assert ev.decode_ack(ev.encode(ev.CommandAck(key="k", ok=True))).started_by == ""
