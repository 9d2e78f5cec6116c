"""Bad input that used to get through admission, refused with the field named.

The pure rules (:mod:`scheduling.live.admission`), which the scheduler's
admission and ``hops submit``'s file check share: ``total_samples`` above
:data:`~scheduling.live.admission.MAX_TOTAL_SAMPLES`; a requirement list that
is no set written in order (repeated or unsorted entries), or longer than
:data:`~scheduling.live.admission.MAX_REQUIREMENTS`; a ``command`` for a
cluster whose nodes are all emulated; an empty jobs file. ``JobSpec`` itself
stays lenient: the simulator builds specs with lists in any order. A
resubmission of the very spec a tenant's job was accepted with is that
acceptance, not a conflict; another spec under the id, or another tenant's, is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli.jobfile import check_jobs
from scheduling.live import admission as adm
from shared.cluster import GpuTypeSpec, Server
from shared.ids import GpuType, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.specs import SpecError
from shared.wire import INVALID

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)


def node(sid: str, models: tuple[str, ...] = ()) -> NodeRecord:
    return NodeRecord(server=Server(ServerId(sid), A.name, 8), gpu_type=A, models=models)


def gpu(**kw: Any) -> JobSpec:
    fields: dict[str, Any] = {"id": "g1", "model": "m", "batch_size": 8, "params": 10,
                              "total_samples": 100, "requirements": (1, 2)} | kw
    return JobSpec(**fields)


@pytest.mark.parametrize(("kw", "field", "words"), [
    ({"total_samples": 10**30}, "total_samples", "at most 1000000000000000 (1e15)"),
    ({"requirements": (1,) * 20_000}, "requirements", "lists 20000 entries; a requirement set"),
    ({"requirements": tuple(range(1, 66))}, "requirements", "at most 64 distinct GPU counts"),
    ({"requirements": (1, 2, 2, 4, 4)}, "requirements", "repeats [2, 4]; a requirement set"),
    ({"requirements": (4, 1, 2)}, "requirements", "[4, 1, 2] is not in increasing order; "
                                                  "write the set sorted, as [1, 2, 4]"),
])
def test_bad_input_is_refused_naming_the_field(kw: dict[str, Any], field: str,
                                                words: str) -> None:
    problem = adm.spec_problem(gpu(**kw))
    assert problem is not None and problem[0] == field and words in problem[1], problem
    assert adm.check_spec(gpu(**kw)) == problem[1]


def test_the_bounds_themselves_are_accepted() -> None:
    assert adm.spec_problem(gpu(total_samples=adm.MAX_TOTAL_SAMPLES)) is None
    assert adm.spec_problem(gpu(requirements=tuple(range(1, adm.MAX_REQUIREMENTS + 1)))) is None
    # bounds become a set of the operator's R_num steps: nothing to check
    assert adm.spec_problem(gpu(requirements=(), min_gpus=1, max_gpus=64)) is None


def test_the_job_spec_still_takes_any_list_for_the_simulator() -> None:
    # the simulator's workloads build specs in-process, never through admission
    assert gpu(requirements=(8, 2, 4, 2)).requirement_set() == (2, 4, 8)


def test_a_command_is_refused_where_every_node_is_emulated() -> None:
    command = ("python", "train.py")
    emulated = [node("e0", ("m", "n")), node("e1", ("m",))]
    refusal = adm.fit_refusal(gpu(command=command), emulated, 8)
    assert refusal is not None and refusal.code == INVALID
    assert refusal.message.startswith("command: job g1 gives a command, but every node")
    assert "hops up --executor real" in refusal.message
    assert adm.fit_refusal(gpu(), emulated, 8) is None
    # a real node runs commands (it names no models); nothing registered: nothing judged
    assert adm.fit_refusal(gpu(command=command), [*emulated, node("r0")], 8) is None
    assert adm.fit_refusal(gpu(command=command), [], 8) is None


@pytest.mark.parametrize("text", ["jobs: []\n", "[]\n"])
def test_an_empty_jobs_file_is_an_error(tmp_path: Path, text: str) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(text)
    with pytest.raises(SpecError, match=r"jobs\.yaml: the file holds no jobs"):
        check_jobs(jobs)


def test_a_jobs_file_lists_every_bad_requirement_list_and_bound(tmp_path: Path) -> None:
    job = "model: m, batch_size: 8, params: 10"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"""\
- {{id: ok, {job}, total_samples: 100, requirements: [1, 2]}}
- {{id: big, {job}, total_samples: 1000000000000000000000000000000, requirements: [1]}}
- {{id: twice, {job}, total_samples: 100, requirements: [1, 1]}}
- {{id: unsorted, {job}, total_samples: 100, requirements: [2, 1]}}
""")
    checked = check_jobs(jobs)
    assert [s.id for s in checked.valid] == ["ok"]
    assert [(b.index, b.job_id, b.field) for b in checked.invalid] == [
        (1, "big", "total_samples"), (2, "twice", "requirements"), (3, "unsorted", "requirements")]


def test_an_identical_resubmission_is_the_acceptance_another_spec_a_conflict() -> None:
    asked = gpu(tenant="t1")
    stored = adm.accepted_spec(adm.keyed_spec(asked), 1234.5)
    assert stored.id == "t1/g1" and stored != asked
    assert adm.resubmission(asked, stored)
    assert not adm.resubmission(gpu(tenant="t1", batch_size=16), stored)
    assert not adm.resubmission(gpu(tenant="t2"), adm.accepted_spec(adm.keyed_spec(
        gpu(tenant="t1")), 1.0))  # another tenant's job under the same id
    assert not adm.resubmission(asked, None)
