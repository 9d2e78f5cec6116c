"""deploy/compose.slurm.yaml: compose.yaml with the Slurm bridge in place of
the emulated executors (docs/slurm.md, "Compose"). Static checks: the
override is a valid Compose file, its `cluster` service runs the command
``hops up --backend slurm`` runs from the bridge image (Dockerfile.slurm,
Slurm's client commands), with what the bridge needs from the host wired
in: the host's network, the Slurm user, slurm.conf's and munge's folders
and the shared run folder at their own paths, one seed per node."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.up.credentials import prepare
from cli.up.stack import StackConfig, by_name
from executor.slurm.settings import bridge_settings
from tests.test_compose import ROOT, args, compose, interpolate, schema_errors
from world.clusters import cluster_arg

SLURM = ROOT / "deploy" / "compose.slurm.yaml"
CI_CLUSTER = "deploy/slurm/cluster-ci.yaml"
# what an operator sets for the CI cluster (the override requires the user)
OPERATOR = {"HOPS_SLURM_UID": "998", "HOPS_SLURM_GID": "997", "HOPS_SLURM_USER": "hopsrest"}


def override() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SLURM.read_text())
    return doc


def bridge() -> dict[str, Any]:
    service: dict[str, Any] = override()["services"]["cluster"]
    return service


def required(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:?message}``: the variable, else an error naming it."""
    def one(m: re.Match[str]) -> str:
        if not env.get(m[1]):
            raise KeyError(m[1])
        return env[m[1]]
    return re.sub(r"\$\{(\w+):\?[^}]*\}", one, value)


def environment(env: dict[str, str]) -> dict[str, str]:
    return {k: required(interpolate(str(v), env), env) for k, v in bridge()["environment"].items()}


def test_the_override_is_valid_and_builds_the_bridge_image_from_the_service_image() -> None:
    assert schema_errors(override()) == []
    service = bridge()
    assert service["image"] == "hops-slurm:latest"
    assert service["build"] == {"context": ".", "dockerfile": "Dockerfile.slurm",
                                "args": {"HOPS_IMAGE": "hops:latest"}}
    dockerfile = (ROOT / "Dockerfile.slurm").read_text()
    assert re.search(r"^ARG HOPS_IMAGE=hops:latest\nFROM \$\{HOPS_IMAGE\}", dockerfile, re.M)
    assert re.search(r"apt-get install .*slurm-client", dockerfile)
    assert dockerfile.rstrip().splitlines()[-2] == "USER hops"  # never left as root


def test_the_bridge_runs_what_hops_up_backend_slurm_runs() -> None:
    command = args(bridge())
    inside = "/etc/hops/slurm-cluster.yaml"
    expected = by_name(StackConfig(executor="slurm", cluster=inside, auth=False))["cluster"]
    assert tuple(command) == expected.command
    # the host's cluster file, the CI cluster's unless HOPS_SLURM_CLUSTER
    # names another, is what the bridge reads (the image holds no deploy/)
    for env, host in (({}, f"./{CI_CLUSTER}"), ({"HOPS_SLURM_CLUSTER": "/etc/slurm/hops.json"},
                                                 "/etc/slurm/hops.json")):
        mounts = [interpolate(v, env).split(":") for v in bridge()["volumes"]]
        assert [host, inside, "ro"] in mounts, mounts
    assert not (ROOT / "Dockerfile").read_text().count("COPY deploy")


def test_the_ci_cluster_file_is_the_slurm_clusters_nodes() -> None:
    conf = (ROOT / "deploy" / "slurm" / "slurm.conf.in").read_text()
    nodes = re.findall(r"^NodeName=(\w+) .* CPUs=(\d+) .* Gres=gpu:fake:(\d+)", conf, re.M)
    assert [(s.id, str(s.cores), str(s.gpus), s.gpu_type)
            for s in cluster_arg(CI_CLUSTER).servers] == [
        (name, cpus, gpus, "TitanXP") for name, cpus, gpus in nodes]


def test_the_bridge_gets_slurm_munge_the_user_and_the_run_folder_from_the_host() -> None:
    service = bridge()
    assert service["network_mode"] == "host"
    assert "ports" not in service
    assert required(interpolate(service["user"], OPERATOR), OPERATOR) == "998:997"
    for missing in ("HOPS_SLURM_UID", "HOPS_SLURM_USER"):
        env = {k: v for k, v in OPERATOR.items() if k != missing}
        try:
            required(interpolate(service["user"], env), env)
            environment(env)
        except KeyError as e:
            assert e.args == (missing,)
        else:
            raise AssertionError(f"the override runs without {missing}")
    env = environment(OPERATOR)
    # the host's network: compose's NATS is its published loopback port
    assert env["HOPS_NATS_URL"] == "nats://127.0.0.1:4222"
    published = compose()["services"]["nats"]["ports"]
    assert "127.0.0.1:4222:4222" in published
    settings = bridge_settings(env, Path("/unused"))
    assert settings.slurm.user == "hopsrest" and settings.slurm.partition == "hops"
    mounts = {m.split(":")[0]: m.split(":")[1:] for m in
              (interpolate(v, OPERATOR) for v in service["volumes"])}
    conf = Path(settings.slurm.slurm_conf)
    assert conf == Path("/tmp/hops-slurm/etc/slurm.conf")  # cluster.sh's
    assert mounts[str(conf.parent)] == [str(conf.parent), "ro"]
    socket = re.search(r"^AuthInfo=socket=@DIR@/(.+)/", (
        ROOT / "deploy" / "slurm" / "slurm.conf.in").read_text(), re.M)
    assert socket is not None and mounts[f"/tmp/hops-slurm/{socket[1]}"][0] == (
        f"/tmp/hops-slurm/{socket[1]}")
    assert mounts[str(settings.run_dir)] == [str(settings.run_dir)]  # the nodes' path too
    assert mounts["/etc/passwd"] == ["/etc/passwd", "ro"]


def test_real_jobs_under_the_bridge_are_one_variable_away() -> None:
    assert environment(OPERATOR)["HOPS_EXECUTOR_BACKEND"] == "emulated"
    real = {**OPERATOR, "HOPS_EXECUTOR_BACKEND": "real"}
    assert environment(real)["HOPS_EXECUTOR_BACKEND"] == "real"


def test_hops_credentials_writes_a_seed_for_every_node_the_bridge_serves(tmp_path: Path) -> None:
    doc = override()
    servers = [s.id for s in cluster_arg(CI_CLUSTER).servers]
    assert bridge()["secrets"] == [f"executor-{s}.nk" for s in servers]
    creds = prepare(tmp_path / "secrets", servers, None, mode=0o644)
    for secret, where in doc["secrets"].items():
        assert where["file"] == f"./secrets/{secret}" and (creds.dir / secret).is_file()
    # the bridge reads each node's seed from compose's secrets folder
    assert compose()["services"]["cluster"]["environment"]["HOPS_NATS_CREDENTIALS_DIR"] == (
        "/run/secrets")


@pytest.mark.parametrize(("service", "argv"), [
    (bridge, [b"python", b"-m", b"executor.slurm", b"--cluster", b"x"]),
    (lambda: compose()["services"]["cluster"],
     [b"python", b"-m", b"executor", b"--server-id", b"rtx3090-tiger-0", b"--order", b"0"]),
], ids=["slurm-bridge", "emulated-cluster"])
def test_a_process_health_check_does_not_count_itself(
        service: Callable[[], dict[str, Any]], argv: list[bytes], tmp_path: Path) -> None:
    """The services with no health endpoint are healthy while their process
    runs, read from /proc: the check's own cmdline (holding the text it looks
    for) must not count."""
    test = service()["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    check = test[3]

    def verdict(cmdlines: str) -> int:
        """The check's exit status where ``cmdlines`` are the processes:
        its own cmdline, and the service's unless empty."""
        code = check.replace("glob.glob('/proc/[0-9]*/cmdline')", cmdlines)
        assert code != check
        return subprocess.run([sys.executable, "-c", code], check=False).returncode

    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"\0".join([*argv, b""]))
    assert verdict("['/proc/self/cmdline']") == 1  # alone: the service's process is gone
    assert verdict(f"['/proc/self/cmdline', {str(cmdline)!r}]") == 0
