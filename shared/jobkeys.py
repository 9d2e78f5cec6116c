"""Job keys: how a job addressed by (tenant, id) is named inside the system.

A job is addressed by its tenant and the id its owner gave it, as a
Kubernetes object by namespace and name: two tenants may use the same id.
Inside the live system one string names it, its *key*:

- the ``default`` tenant's job ``j1`` has the key ``j1``;
- tenant ``alice``'s job ``j1`` has the key ``alice/j1``.

Neither a job id nor a tenant name may contain ``/`` (admission and the
tenants file refuse it), so a key names one job and splits back into its
tenant and id. The key is the ``hops_jobs`` and ``hops_alloc`` key, the
job id token of every subject (``/`` is valid in both), ``JobSpec.id``
after admission and the job id of every event, plan and executor command.

Why the ``default`` tenant's key is the bare id: records, stream messages
and executors' directories written before keys were qualified all belong to
``default`` on a system without a tenants file, and stay valid as they are;
and a single-tenant system shows the ids its users wrote. A record of
another tenant written before then keeps its bare key (nothing accepted is
lost, nothing is renamed under a running job); its tenant still addresses
it by the bare id (:func:`candidates`).

The gateway and the CLI translate: a tenant sees and names its jobs by the
bare id (:func:`local_id`), an admin names another tenant's job as
``tenant/id`` or with ``--tenant``/``?tenant=`` (docs/live.md).
"""

from __future__ import annotations

from shared.ids import JobId
from shared.tenants import DEFAULT_TENANT

SEPARATOR = "/"
# The separator of a key as written in a file name: '/' would make a
# directory (and ``alice/j1`` would sit inside the directory of the default
# tenant's job ``alice``); '.' is in neither a job id nor a tenant name.
PATH_SEPARATOR = "."


def job_key(tenant: str, job_id: str) -> JobId:
    """The key of ``tenant``'s job ``job_id`` (see the module docstring)."""
    if tenant == DEFAULT_TENANT:
        return JobId(job_id)
    return JobId(f"{tenant}{SEPARATOR}{job_id}")


def split_key(key: str) -> tuple[str | None, str]:
    """The tenant a key names (None: a bare key, the default tenant's or a
    record written before keys were qualified) and the job's own id."""
    tenant, sep, job_id = key.partition(SEPARATOR)
    return (tenant, job_id) if sep else (None, key)


def local_id(key: str) -> str:
    """The id a job's owner gave it: ``j1`` for ``alice/j1`` and for ``j1``."""
    return split_key(key)[1]


def candidates(tenant: str, job_id: str) -> tuple[JobId, ...]:
    """The keys ``tenant``'s job ``job_id`` may be stored under, in order:
    its key, then (another tenant than ``default``) the bare id of a record
    written before keys were qualified. A record found under the second
    counts only when its tenant is ``tenant``."""
    key = job_key(tenant, job_id)
    return (key,) if key == job_id else (key, JobId(job_id))


def parse_ref(ref: str, tenant: str | None = None) -> tuple[str | None, str]:
    """A job named on a command line: ``tenant/id`` or a bare ``id`` (then
    ``tenant``, None for the caller's own); ValueError for ``tenant/id``
    together with another ``tenant``."""
    named, job_id = split_key(ref)
    if named is not None and tenant is not None and named != tenant:
        raise ValueError(f"{ref!r} names tenant {named}, but --tenant says {tenant}")
    return (named if named is not None else tenant), job_id


def path_name(key: str) -> str:
    """``key`` as one file or directory name: ``alice.j1`` for ``alice/j1``."""
    return key.replace(SEPARATOR, PATH_SEPARATOR)
