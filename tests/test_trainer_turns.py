"""A GPU's compute turns (hops.trainer.turns) and the pool's staged tasks
(executor.trainers, TrainerPool.stage), with real trainer processes: a
task sent while another computes is readied (its parameters in place)
and starts only as that one ends, from its trainer, with no message
through the pool; a refused or killed task still passes its turn, in
order; the gradients are the one-process ones, bitwise."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from executor.trainers import TrainerPool, TrainerRefused
from hops.trainer.turns import RECHECK_S, Gate, Turns
from tests.test_trainer_pool import TINY, _local, _params
from tests.trainer_task import same_gradients

Params = dict[str, torch.Tensor]
SLOW = {"seed": 3, "sleep_s": 0.3}  # long enough that the next task is readied meanwhile


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[TrainerPool]:
    with TrainerPool(2, capacity=1, folder=str(tmp_path)) as made:
        yield made


def test_a_waiter_wakes_when_its_turn_is_passed_and_not_before(tmp_path: Path) -> None:
    turns = Turns(2, tmp_path)
    waiter = Gate(turns.path, turns.pipes[1][0])
    passer = Gate(turns.path, peers=(turns.pipes[1][1],))
    woke: list[float] = []
    thread = threading.Thread(target=lambda: (waiter.wait(2), woke.append(time.monotonic())))
    thread.start()
    passer.release(0)  # turn 1 comes: not the waiter's
    time.sleep(0.2)
    assert thread.is_alive() and waiter.done() == 1
    passed = time.monotonic()
    passer.release(1)
    thread.join(RECHECK_S / 2)  # woken by its pipe, not by its recheck
    assert not thread.is_alive() and woke[0] - passed < RECHECK_S / 2
    passer.release(0)  # a late pass never takes the counter back
    assert passer.done() == 2 and turns.take() == 0 and turns.take() == 1
    waiter.close()
    passer.close()
    turns.close()
    assert not Path(turns.path).exists()


def test_a_staged_task_is_readied_while_the_other_computes_then_starts_after(
        pool: TrainerPool) -> None:
    pa, pb = _params(SLOW), _params({"seed": 4})
    _loaded(pool, pa, pb)
    first = pool.stage("a", 1, 0, 1, 4, pa, ["b"])
    second = pool.stage("b", 1, 0, 2, 4, pb)  # sent at once, to the other trainer
    ra, rb = pool.finish(first), pool.finish(second)
    assert ra.trainer != rb.trainer and rb.params_sent and not rb.loaded
    assert rb.received < ra.compute_end <= rb.compute_start  # readied early, started after
    # its parameters were in place while the other computed
    assert rb.received <= rb.ready < ra.compute_end
    assert same_gradients(ra.gradients, _local(SLOW, pa, 1, 0, 1))
    assert same_gradients(rb.gradients, _local({"seed": 4}, pb, 1, 0, 2))


def _loaded(pool: TrainerPool, pa: Params, pb: Params) -> None:
    """Jobs a (slow) and b, each loaded on a trainer of its own by a round-0 task."""
    pool.add_job("a", TINY, SLOW)
    pool.add_job("b", TINY, {"seed": 4})
    pool.run("a", 0, 0, 1, 4, pa, ["b"])
    pool.run("b", 0, 0, 1, 4, pb, ["a"])


def test_a_refused_task_passes_its_turn_in_order(pool: TrainerPool) -> None:
    pa, pb = _params(SLOW), _params({"seed": 4})
    _loaded(pool, pa, pb)
    first = pool.stage("a", 1, 0, 1, 4, pa, ["b", "a"])
    bad = pool.stage("b", 1, 0, 9, 4, pb, ["a"])  # bad_span, refused before its turn
    third = pool.stage("a", 1, 1, 2, 4, pa)
    with pytest.raises(TrainerRefused) as refused:
        pool.finish(bad)
    assert refused.value.code == "bad_span"
    ra, rc = pool.finish(first), pool.finish(third)
    assert ra.compute_end <= rc.compute_start
    assert same_gradients(ra.gradients + rc.gradients, _local(SLOW, pa, 1, 0, 2))


def test_a_task_killed_before_a_staged_one_runs_again_first(
        pool: TrainerPool, tmp_path: Path) -> None:
    marker = tmp_path / "died"
    config = {**SLOW, "die_once": str(marker), "die_at": 4}  # round 1, micro-batch 0
    pk, pb = _params(config), _params({"seed": 4})
    pool.add_job("k", TINY, config)
    pool.add_job("b", TINY, {"seed": 4})
    pool.run("k", 0, 0, 1, 4, pk, ["b"])
    pool.run("b", 0, 0, 1, 4, pb, ["k"])
    doomed = pool.stage("k", 1, 0, 1, 4, pk, ["b"])
    staged = pool.stage("b", 1, 0, 2, 4, pb)
    rb = pool.finish(staged)  # its turn comes once the killed task ran again
    rk = pool.finish(doomed)
    assert marker.exists() and rk.attempts == 2 and rb.attempts == 1
    assert rk.compute_end <= rb.compute_start
    assert same_gradients(rk.gradients, _local(config, pk, 1, 0, 1))
    assert same_gradients(rb.gradients, _local({"seed": 4}, pb, 1, 0, 2))
