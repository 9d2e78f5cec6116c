"""A real job run by a root executor, against a real nats-server: it runs
as the job user (``nobody``), with none of the executor's credentials in its
environment, cannot read a root-only file (a stand-in for a credential
file), and writes its report file, which the executor follows as usual.

The job is a shell script (``/bin/sh``), so that it needs no Python
interpreter ``nobody`` may run: a virtual environment under ``/root`` is
closed to it. Its folders are made in a fresh folder under the system's
temporary folder, which ``nobody`` can pass through (pytest's own is root's
private folder). Skipped where the executor cannot switch users (not root)
or there is no ``nobody``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nkeys
import pytest

from executor.isolation import unreachable
from shared import events as ev
from shared import subjects
from shared.ids import JobId
from shared.job import JobSpec
from tests.test_live_executor import (
    Client,
    Procs,
    client,
    eventually,
    nats_server,
    nats_url,
    procs,
    start_cmd,
)
from tests.test_real_executor import CLUSTER, A, registrar

__all__ = ["client", "nats_server", "nats_url", "procs"]  # fixtures


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


NOBODY = _nobody()
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root executor can switch users"),
    pytest.mark.skipif(NOBODY is None, reason="this host has no user nobody"),
]

# Prints who it is and what it inherited, tries the credential, reports.
JOB = r'''
echo "ID $(id -u):$(id -g):$(id -G)"
env | sed 's/^/ENV /'
if cat "$SECRET_FILE" >/dev/null 2>&1; then echo "SECRET READ"; else echo "SECRET DENIED"; fi
if ls "$OTHER_JOB" >/dev/null 2>&1; then echo "OTHER READ"; else echo "OTHER DENIED"; fi
echo checkpoint > "$HOPS_CHECKPOINT_DIR/state"
now=$(date +%s)
echo "{\"kind\": \"started\", \"at\": $now, \"samples_done\": 0, \"world_size\": 1}" \
  >> "$HOPS_REPORT_FILE"
echo "{\"kind\": \"progress\", \"at\": $now, \"samples_done\": 100, \"iterations\": 1}" \
  >> "$HOPS_REPORT_FILE"
echo "{\"kind\": \"finished\", \"at\": $now, \"samples_done\": 100}" >> "$HOPS_REPORT_FILE"
'''
# The executor's own secrets; HOPS_NATS_NKEY (a real seed, which the test's
# server without authentication ignores) is added by the test.
SECRETS = {"HOPS_TOKEN": "system-token", "HOPS_TENANTS": "/etc/hops/tenants.yaml",
           "DB_PASSWORD": "hunter2"}


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder ``nobody`` can pass through (not list), removed at the end."""
    assert NOBODY is not None
    path = Path(tempfile.mkdtemp(prefix="hops-jobuser-"))
    path.chmod(0o711)
    wall = unreachable(path, NOBODY.pw_uid, NOBODY.pw_gid)
    if wall is not None:
        shutil.rmtree(path)
        pytest.skip(f"nobody cannot pass through {wall} on the way to the temporary folder")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_real_job_runs_as_nobody_without_the_systems_credentials(
        procs: Procs, client: Client, open_dir: Path) -> None:
    assert NOBODY is not None
    cluster = open_dir / "cluster.yaml"
    cluster.write_text(CLUSTER)
    secret = open_dir / "executor-a.nk"
    secret.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    secret.chmod(0o600)  # root's, as the credentials hops up writes
    secrets = {**SECRETS, "HOPS_NATS_NKEY": str(secret)}
    runs = open_dir / "runs"
    registered = await registrar(client)
    procs.start("executor", "executor", "--cluster", str(cluster), "--server-id", A,
                "--backend", "real", "--run-dir", str(runs), "--job-user", "nobody",
                "--stop-grace-s", "1", **secrets)
    await eventually(lambda: bool(registered), 20, "registration")
    assert "jobs run as nobody" in procs.log("executor")

    # No monitor relays it here: the executor's own report subject.
    events = await client.collect(subjects.reports(A, "who"), ev.decode_report)
    other = runs / "other"
    other.mkdir(mode=0o700)  # another job's folder, root's here
    spec = JobSpec(JobId("who"), "shell", 32, 1000, 100, requirements=(1,),
                   command=("/bin/sh", "-c", JOB), workdir=str(open_dir),
                   env={"SECRET_FILE": str(secret), "OTHER_JOB": str(other)})
    ack = await client.command(A, start_cmd("k-who", spec, A, {A: 1}, (0,)))
    assert ack.ok, ack
    await eventually(lambda: bool(events), 20, "job_finished")
    (finished,) = events
    assert isinstance(finished, ev.JobFinished) and finished.exit_code == 0, finished

    job = runs / "who"
    out = (job / "logs" / f"{A}-rank0.log").read_text()
    assert f"ID {NOBODY.pw_uid}:{NOBODY.pw_gid}:{NOBODY.pw_gid}\n" in out  # no other group
    assert "SECRET DENIED" in out and "OTHER DENIED" in out
    env = dict(line[4:].partition("=")[::2] for line in out.splitlines()
               if line.startswith("ENV "))
    assert env["HOME"] == str(job) and env["USER"] == "nobody"
    assert env["HOPS_JOB_ID"] == "who" and env["HOPS_REPORT_FILE"].startswith(str(job))
    leaked = {k for k in env if k.startswith(("HOPS_NATS", "HOPS_TOKEN", "HOPS_TENANTS"))
              or k in secrets or k == "HOPS_HEARTBEAT_S"}
    assert leaked == set(), leaked
    # (the seed's path is in the job's own env, SECRET_FILE: the job reads it below)
    assert not any(v in json.dumps(env) for v in SECRETS.values())

    for folder in (job, job / "logs", job / "checkpoint", job / "reports"):
        st = folder.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o700), folder
    assert (job / "checkpoint" / "state").stat().st_uid == NOBODY.pw_uid
    assert stat.S_IMODE(runs.stat().st_mode) == 0o711  # jobs list no one's folder
    state = runs / f"executor-{A}.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600  # every job's command and env
