"""The credentials folder of ``hops up``: generated once, reused, private;
and the executor supervisor giving each executor its own seed."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from cli.up.credentials import (
    Credentials,
    enrol,
    prepare,
    reload_nats,
    users,
    write_cli_config,
)
from executor.supervisor import child_env
from shared.tenants import TenantsFile, TenantSpec, authenticate, load_tenants, token_digest


def test_prepare_generates_once_and_reuses(tmp_path: Path) -> None:
    creds = prepare(tmp_path / "c", ["rtx-0", "rtx-1"], None)
    names = sorted(p.name for p in creds.dir.iterdir())
    assert names == sorted([
        "admin.nk", "admin.token", "aggregator.nk", "audit.nk", "estimator.nk", "executor-rtx-0.nk",
        "executor-rtx-1.nk", "gateway.nk", "monitor.nk", "nats-auth.conf", "placer.nk",
        "profiler.nk", "scheduler.nk", "tenant-default.nk", "tenant-default.token",
        "tenants.yaml"])
    before = {p.name: p.read_bytes() for p in creds.dir.iterdir()}
    prepare(tmp_path / "c", ["rtx-0", "rtx-1"], None)
    assert {p.name: p.read_bytes() for p in creds.dir.iterdir()} == before
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in creds.dir.iterdir())
    assert creds.dir.stat().st_mode & 0o777 == 0o700
    assert sorted(users(creds.dir).values()) == sorted(n[:-3] for n in names
                                                       if n.endswith(".nk"))


def test_the_effective_tenants_file_holds_digests_of_the_generated_tokens(
    tmp_path: Path,
) -> None:
    given = TenantsFile(tenants={"alice": TenantSpec(tokens=("alice-own",)),
                                 "bob": TenantSpec(run_commands=True)})
    creds = prepare(tmp_path / "c", [], given)
    text = creds.tenants_file.read_text()
    bob = creds.token("tenant-bob").read_text().strip()
    admin = creds.token("admin").read_text().strip()
    assert bob not in text and admin not in text and "alice-own" not in text
    assert token_digest(bob) in text
    assert not creds.token("tenant-alice").exists()  # the file gave alice a token
    file = load_tenants(text)
    assert authenticate(file, bob).tenant == "bob"  # type: ignore[union-attr]
    assert authenticate(file, admin).admin  # type: ignore[union-attr]
    assert authenticate(file, "alice-own").tenant == "alice"  # type: ignore[union-attr]
    assert file.tenants["bob"].run_commands


def test_enrol_adds_an_executor_and_keeps_it(tmp_path: Path) -> None:
    creds = prepare(tmp_path / "c", ["rtx-0"], None)
    seed = enrol(creds.dir, "far-0")
    assert seed.read_bytes().startswith(b"SU")
    assert "executor-far-0" in creds.auth_conf.read_text()
    prepare(tmp_path / "c", ["rtx-0"], None)  # hops up again: the enrolled one stays
    assert "executor-far-0" in creds.auth_conf.read_text()
    assert enrol(creds.dir, "far-0").read_bytes() == seed.read_bytes()


def test_reload_without_a_running_server_says_so(tmp_path: Path) -> None:
    assert "next start" in reload_nats(tmp_path / "up.json")
    (tmp_path / "up.json").write_text(json.dumps({"nats": {"pid": 2**22 + 7}}))
    assert "next start" in reload_nats(tmp_path / "up.json")


def _default_hup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_reload_signals_every_server_of_a_cluster(tmp_path: Path) -> None:
    # stand-ins that SIGHUP ends, so that the signal shows in their exit status
    # (its default action restored: under nohup the runner ignores SIGHUP, and
    # an ignored signal stays ignored across exec)
    procs = [subprocess.Popen(["sleep", "30"], preexec_fn=_default_hup) for _ in range(3)]
    members = [{"pid": p.pid} for p in procs]
    state = {"nats": members[0], "nats_servers": members}
    (tmp_path / "up.json").write_text(json.dumps(state))
    try:
        said = reload_nats(tmp_path / "up.json")
        assert [p.wait(5) for p in procs] == [-signal.SIGHUP] * 3
    finally:
        for p in procs:
            p.kill()
    assert all(str(p.pid) in said for p in procs)


def test_cli_config_is_private(tmp_path: Path) -> None:
    path = write_cli_config(tmp_path / "cli.yaml", "http://127.0.0.1:8080", "tok")
    assert path.read_text() == "gateway: http://127.0.0.1:8080\ntoken: tok\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_each_executor_gets_its_own_seed_and_not_the_folder() -> None:
    env = child_env({"HOPS_NATS_CREDENTIALS_DIR": "/run/secrets", "HOPS_HEALTH_PORT": "8081",
                     "PATH": "/bin"}, "rtx-0")
    assert env == {"HOPS_NATS_NKEY": "/run/secrets/executor-rtx-0.nk", "PATH": "/bin"}
    assert child_env({"PATH": "/bin"}, "rtx-0") == {"PATH": "/bin"}  # no auth: anonymous


def test_credentials_paths() -> None:
    creds = Credentials(Path("/x"))
    assert creds.seed("executor-a") == Path("/x/executor-a.nk")
    assert creds.auth_conf == Path("/x/nats-auth.conf")


def test_the_credentials_and_enrol_commands(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    out = tmp_path / "secrets"
    done = runner.invoke(app, ["credentials", "--out", str(out), "--cluster", "gavel",
                               "--compose"])
    assert done.exit_code == 0, done.output
    assert (out / "nats-auth.conf").stat().st_mode & 0o777 == 0o644
    data = tmp_path / "data"
    done = runner.invoke(app, ["nodes", "enrol", "far-0", "--data-dir", str(data)])
    assert done.exit_code == 1 and "start `hops up` there first" in done.output
    prepare(data / "credentials", [], None)
    done = runner.invoke(app, ["nodes", "enrol", "far-0", "--data-dir", str(data)])
    assert done.exit_code == 0, done.output
    assert str(data / "credentials" / "executor-far-0.nk") in done.output
    assert "next start" in done.output
    done = runner.invoke(app, ["nodes", "enrol", "a.b", "--data-dir", str(data)])
    assert done.exit_code == 1


def test_hops_up_refuses_a_bad_tenants_file_and_skips_all_without_auth(tmp_path: Path) -> None:
    import pytest

    from cli.up.stack import StackConfig
    from cli.up.up import UpError, secure

    bad = tmp_path / "tenants.yaml"
    bad.write_text("tenants:\n  alice: {run_command: true}\n")  # a typo
    with pytest.raises(UpError, match="tenants"):
        secure(StackConfig(data_dir=tmp_path / "d", cluster="gavel", tenants=bad))
    assert secure(StackConfig(data_dir=tmp_path / "off", auth=False)) is None
    assert not (tmp_path / "off").exists()
    good = tmp_path / "good.yaml"
    good.write_text("tenants:\n  alice: {}\n  bob: {run_commands: true}\n")
    creds = secure(StackConfig(data_dir=tmp_path / "d", cluster="gavel", tenants=good))
    assert creds is not None
    assert creds.seed("tenant-bob").exists() and not creds.seed("tenant-default").exists()
