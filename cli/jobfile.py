"""Checking a whole jobs file before ``hops submit`` sends any of it.

Every entry is checked on its own, as the scheduler would check it: the
spec's schema and values (:class:`shared.job.JobSpec`: a CPU job, ``kind:
cpu``, names ``cores`` and no requirements), what the live system
adds (:func:`scheduling.live.admission.spec_problem`), and ids that
appear twice in the file. Each invalid entry becomes one
:class:`InvalidJob` naming its index, id, field and problem, so that an
operator fixes the file in one pass rather than one error per attempt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from scheduling.live.admission import spec_problem
from shared.job import JobSpec
from shared.specs import SpecError, read_document

_FIELDS = frozenset(JobSpec.__struct_fields__)
# msgspec's messages: "... - at `$.batch_size`", "Object missing required
# field `params`", "Object contains unknown field `foo`".
_AT = re.compile(r"^(?P<problem>.*) - at `\$\.(?P<field>[^`]+)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`$")
# A spec's own checks start with the field: "batch_size must be > 0, got 0",
# "lr: entry 1: ...".
_LEADING = re.compile(r"^(?P<field>[a-z_]+)(?::\s*(?P<rest>.*))?")
# A CPU job's own checks (``kind: cpu``) name the field they are about
# inside the sentence: "a cpu job needs cores > 0".
_CPU_JOB = (("cores >", "cores"), ("requirements", "requirements"),
            ("learning rate", "lr"))


@dataclass(frozen=True)
class InvalidJob:
    """One entry of a jobs file that cannot be submitted."""

    index: int
    job_id: str  # "" when the entry has none
    field: str  # the entry itself when it is not a mapping
    problem: str

    def line(self, source: str) -> str:
        name = f"id {self.job_id!r}" if self.job_id else "no id"
        return f"{source}: jobs[{self.index}] ({name}), field {self.field}: {self.problem}"


@dataclass(frozen=True)
class CheckedJobs:
    """A jobs file, checked: the valid specs in file order and the invalid entries."""

    source: str
    valid: tuple[JobSpec, ...]
    invalid: tuple[InvalidJob, ...]


def check_jobs(path: str | Path) -> CheckedJobs:
    """Every entry of a jobs file, checked; :class:`SpecError` when the file
    itself cannot be read, holds no list of jobs, or an empty one."""
    p = Path(path)
    doc, lenient = read_document(p)
    entries = _entries(doc, p.name)
    valid: list[JobSpec] = []
    invalid: list[InvalidJob] = []
    first: dict[str, int] = {}
    for i, entry in enumerate(entries):
        job_id = _id_of(entry)
        checked = _check(entry, lenient)
        if isinstance(checked, JobSpec) and job_id in first:
            checked = ("id", f"job id {job_id!r} appears again (first at jobs[{first[job_id]}])")
        if isinstance(checked, JobSpec):
            first[job_id] = i
            valid.append(checked)
        else:
            invalid.append(InvalidJob(i, job_id, *checked))
    return CheckedJobs(p.name, tuple(valid), tuple(invalid))


def _entries(doc: Any, source: str) -> list[Any]:
    """The list of job entries: a file holds ``{"jobs": [...]}`` or a bare list."""
    if isinstance(doc, dict) and set(doc) == {"jobs"}:
        doc = doc["jobs"]
    if not isinstance(doc, list):
        raise SpecError(f"{source}: expected a list of jobs, or a mapping with only `jobs`")
    if not doc:
        # an empty list is a mistake (a wrong file, a failed template), not a
        # request to do nothing: exit 0 with no output hid it
        raise SpecError(f"{source}: the file holds no jobs; nothing to submit")
    return doc


def _id_of(entry: Any) -> str:
    raw = entry.get("id") if isinstance(entry, dict) else None
    return raw if isinstance(raw, str) else ("" if raw is None else str(raw))


def _check(entry: Any, lenient: bool) -> JobSpec | tuple[str, str]:
    """One entry's spec, or (field, problem) of the first thing wrong with it."""
    if not isinstance(entry, dict):
        return "(entry)", f"expected a mapping of job fields, got {type(entry).__name__}"
    try:
        spec = msgspec.convert(entry, JobSpec, strict=not lenient)
    except msgspec.ValidationError as e:
        return _field_and_problem(str(e))
    return spec_problem(spec) or spec


def _field_and_problem(message: str) -> tuple[str, str]:
    """The field a validation message is about, and the message."""
    if m := _AT.match(message):
        return m["field"], m["problem"]
    if m := _MISSING.match(message):
        return m["field"], "this required field is missing"
    if m := _UNKNOWN.match(message):
        return m["field"], "not a field of a job spec"
    if (m := _LEADING.match(message)) and m["field"] in _FIELDS:
        return m["field"], m["rest"] or message
    if message.startswith("a cpu job"):
        field = next((f for words, f in _CPU_JOB if words in message), "kind")
        return field, message
    return "(spec)", message
