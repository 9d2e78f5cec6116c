"""The process table of the live system (cli/up/stack.py), and compose.yaml: a
valid Compose file (checked against the official Compose Specification
schema, vendored in tests/data/compose-spec) whose every service runs
exactly the command ``hops up`` runs for that component."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cli.up.stack import (
    PYTHON,
    Component,
    StackConfig,
    by_name,
    components,
    describe_exit,
    environment,
    modules,
    processes,
    restart_delay,
    stop_order,
)
from scheduling.rounds import ROUND_S
from tests.composestack import read_env_file
from world.clusters import cluster_arg

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "tests" / "data" / "compose-spec" / "compose_spec.json"
INFRA = {"nats", "nats-2", "nats-3"}  # compose services that are not Hops components
NATS_CLUSTER_ENV = ROOT / "deploy" / "nats-cluster.env"
REAL_JOBS = ROOT / "deploy" / "compose.real-jobs.yaml"


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}``: the variable, else (unset or empty) the default."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m[1]) or m[2], value)


def args(service: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    """A service's command as the container gets it (a string is split)."""
    command = service["command"]
    if isinstance(command, str):
        return shlex.split(interpolate(command, env or {}))
    return [interpolate(a, env or {}) for a in command]


def schema_errors(doc: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


# --- the process table -----------------------------------------------------------------


def test_table_names_every_component_once_gateway_last() -> None:
    names = [c.name for c in components(StackConfig())]
    assert names == [
        "monitor", "estimator", "profiler", "scheduler", "placer", "cluster", "gateway"
    ]
    assert stop_order(StackConfig())[0] == "gateway"


def test_the_aggregator_runs_when_the_policys_traits_say_it_sequences_tasks() -> None:
    for policy in ("hare", "hare-eft:ties=order", "srtf", "gavel-fifo"):
        names = [c.name for c in components(StackConfig(policy=policy))]
        assert names[names.index("placer") + 1] == "aggregator", policy
        assert by_name(StackConfig(policy=policy))["aggregator"].command == (
            "python", "-m", "services.aggregator")
    for policy in ("hops", "sia", "gavel"):
        assert "aggregator" not in by_name(StackConfig(policy=policy)), policy


def test_aggregator_shards_each_know_their_shard() -> None:
    comps = [c for c in components(StackConfig(policy="hare", aggregators=3))
             if c.module == "services.aggregator"]
    assert [c.name for c in comps] == ["aggregator-1", "aggregator-2", "aggregator-3"]
    assert [c.env["HOPS_AGGREGATOR_SHARD"] for c in comps] == ["0/3", "1/3", "2/3"]
    assert all(c.env["HOPS_NATS_NKEY"].endswith("aggregator.nk") for c in comps)
    assert "HOPS_AGGREGATOR_SHARD" not in by_name(StackConfig(policy="hare"))["aggregator"].env
    with pytest.raises(ValueError, match="at least one aggregator"):
        StackConfig(policy="hare", aggregators=0)


def test_processes_run_each_replica_under_its_own_name() -> None:
    names = [c.name for c in processes(StackConfig())]
    assert names == ["monitor", "estimator", "profiler", "scheduler-1", "scheduler-2",
                     "placer", "cluster", "gateway"]
    assert list(stop_order(StackConfig())) == names[::-1]
    one = [c.name for c in processes(StackConfig(schedulers=1))]
    assert "scheduler" in one and "scheduler-1" not in one
    assert {c.command for c in processes(StackConfig()) if c.module == "services.scheduler"} == {
        by_name(StackConfig())["scheduler"].command}


def test_commands_are_python_dash_m_with_config_in_flags_only_for_the_cluster() -> None:
    config = StackConfig(cluster="gavel", time_scale=0.5, round_s=7, gateway_port=9000, auth=False)
    table = by_name(config)
    for comp in table.values():
        assert comp.command[:3] == (PYTHON, "-m", comp.module)
    assert table["cluster"].command == (
        "python", "-m", "executor", "--cluster", "gavel", "--all", "--backend", "emulated",
        "--time-scale", "0.5")
    assert table["gateway"].command == ("python", "-m", "gateway")
    assert table["scheduler"].env == {"HOPS_ROUND_S": "7"}
    assert table["gateway"].env["HOPS_GATEWAY_PORT"] == "9000"
    assert table["monitor"].env == {"HOPS_METRICS_HOST": "127.0.0.1", "HOPS_METRICS_PORT": "9464"}
    assert by_name(StackConfig())["cluster"].args[-1] == "60"  # not "60.0"


def test_argv_puts_the_interpreter_in_place_of_python() -> None:
    comp = Component("x", "services.x", args=("--a", "1"))
    assert comp.argv("/venv/bin/python3") == ("/venv/bin/python3", "-m", "services.x", "--a", "1")


def test_environment_layers_stack_settings_over_the_callers() -> None:
    config = StackConfig(nats_url="nats://127.0.0.1:5555", log_level="debug")
    base = {"PATH": "/bin", "HOPS_HEALTH_PORT": "8081", "HOPS_NATS_URL": "nats://elsewhere:1"}
    env = environment(config, by_name(config)["gateway"], base)
    assert env["PATH"] == "/bin"
    assert env["HOPS_NATS_URL"] == "nats://127.0.0.1:5555"
    assert env["HOPS_LOG_LEVEL"] == "debug"
    assert env["HOPS_NATS_REPLICAS"] == "1"
    cluster = StackConfig(nats_url="nats://a:1,nats://b:2,nats://c:3", nats_cluster=3)
    env3 = environment(cluster, by_name(cluster)["placer"], base)
    assert (env3["HOPS_NATS_URL"], env3["HOPS_NATS_REPLICAS"]) == (cluster.nats_url, "3")
    with pytest.raises(ValueError, match="--nats-cluster must be 1, 3 or 5"):
        StackConfig(nats_cluster=2)
    assert env["HOPS_HEALTH_PORT"] == ""  # one host: no service binds a shared port
    assert env["HOPS_GATEWAY_PORT"] == "8080"
    assert base["HOPS_HEALTH_PORT"] == "8081"  # the caller's mapping is untouched


def test_environment_puts_the_source_root_first_on_pythonpath() -> None:
    comp = by_name(StackConfig())["placer"]
    env = environment(StackConfig(), comp, {"PYTHONPATH": "/x"}, "/src")
    assert env["PYTHONPATH"] == "/src:/x"
    assert environment(StackConfig(), comp, {}, "/src")["PYTHONPATH"] == "/src"
    assert "PYTHONPATH" not in environment(StackConfig(), comp, {})


def test_restart_delay_backs_off_and_resets_after_a_stable_run() -> None:
    assert restart_delay(None, 0.5) == 1.0
    delays = [1.0]
    for _ in range(7):
        delays.append(restart_delay(delays[-1], uptime=2.0))
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert restart_delay(30.0, uptime=61.0) == 1.0


def test_config_paths_urls_and_validation(tmp_path: Path) -> None:
    config = StackConfig(data_dir=tmp_path, gateway_host="0.0.0.0", gateway_port=8123)
    assert config.gateway_url == "http://127.0.0.1:8123"
    assert StackConfig().metrics_url == "http://127.0.0.1:9464/metrics"
    assert StackConfig(metrics_host="10.1.2.3").metrics_url == "http://10.1.2.3:9464/metrics"
    assert config.logs_dir == tmp_path / "logs"
    assert by_name(config)["placer"].log_file(config) == tmp_path / "logs" / "placer.log"
    for bad in ({"time_scale": 0}, {"round_s": -1}, {"gateway_port": 0}, {"metrics_port": 70000},
                {"schedulers": 0}):
        with pytest.raises(ValueError):
            StackConfig(**bad)  # type: ignore[arg-type]


def test_describe_exit() -> None:
    log = Path("/x/placer.log")
    assert describe_exit("placer", 1, log) == "hops up: placer exited with 1; see /x/placer.log"
    assert "killed by signal 9" in describe_exit("placer", -9, log)


def test_modules_include_the_emulated_job() -> None:
    assert "executor.job" in modules()
    assert "services.scheduler" in modules()


# --- compose.yaml ------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    assert schema_errors(compose()) == []


def test_the_schema_check_rejects_a_broken_file() -> None:
    doc = compose()
    doc["services"]["gateway"]["comand"] = ["python"]  # a typo
    doc["services"]["nats"]["ports"] = "4222"  # not a list
    errors = schema_errors(doc)
    assert len(errors) >= 2, errors


def test_every_component_runs_in_compose_with_the_command_hops_up_runs() -> None:
    services = compose()["services"]
    table = by_name(StackConfig())
    assert set(services) - INFRA == set(table)
    for name, comp in table.items():
        assert services[name]["command"] == list(comp.command), name


def test_the_real_jobs_override_runs_the_aggregator_as_hops_up_does() -> None:
    """compose.yaml's jobs are emulated (no model to aggregate); the real-jobs
    override adds the aggregator, on the executor image (torch), configured
    as compose.yaml's services are and as `hops up` runs it."""
    assert "aggregator" not in compose()["services"]
    doc: dict[str, Any] = yaml.safe_load(REAL_JOBS.read_text())
    svc, base = doc["services"]["aggregator"], compose()["services"]["placer"]
    comp = by_name(StackConfig(policy="hare"))["aggregator"]
    assert svc["command"] == list(comp.command)
    assert (svc["image"], svc["build"]["dockerfile"]) == ("hops-executor:latest",
                                                          "Dockerfile.executor")
    for key in ("restart", "init", "depends_on", "healthcheck"):
        assert svc[key] == base[key], key
    shared = {k: v for k, v in base["environment"].items() if k != "HOPS_NATS_NKEY"}
    assert shared.items() <= svc["environment"].items()
    assert set(comp.env) <= set(svc["environment"])
    assert svc["environment"]["HOPS_NATS_NKEY"] == "/run/secrets/aggregator.nk"
    assert svc["secrets"] == ["aggregator.nk"]


def test_compose_sets_every_variable_the_stack_sets() -> None:
    services = compose()["services"]
    for name, comp in by_name(StackConfig()).items():
        env = services[name]["environment"]
        # one server unless deploy/nats-cluster.env says otherwise
        assert interpolate(env["HOPS_NATS_URL"], {}) == "nats://nats:4222", name
        assert interpolate(env["HOPS_NATS_REPLICAS"], {}) == "1", name
        missing = set(comp.env) - set(env)
        assert not missing, f"{name} lacks {missing}"


def test_services_restart_wait_for_nats_and_check_their_health() -> None:
    services = compose()["services"]
    for name in by_name(StackConfig()):
        svc = services[name]
        assert svc["restart"] == "unless-stopped", name
        assert svc["depends_on"]["nats"]["condition"] == "service_healthy", name
        test = svc["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        if name not in ("gateway", "cluster"):
            assert "127.0.0.1:8081/healthz" in test[3], name
            assert svc["environment"]["HOPS_HEALTH_PORT"] == "8081", name
    assert "8080/healthz" in services["gateway"]["healthcheck"]["test"][3]
    assert services["gateway"]["environment"]["HOPS_GATEWAY_HOST"] == "0.0.0.0"


def test_containers_listen_on_every_interface_the_host_publishes_on_loopback() -> None:
    """Inside the compose network the services reach each other, so each
    container binds 0.0.0.0; the host publishes its ports on 127.0.0.1 only."""
    services = compose()["services"]
    assert services["gateway"]["ports"] == ["127.0.0.1:8080:8080"]
    assert services["monitor"]["ports"] == ["127.0.0.1:9464:9464"]
    assert services["monitor"]["environment"]["HOPS_METRICS_HOST"] == "0.0.0.0"
    for name, svc in services.items():
        for mapping in svc.get("ports", []):
            assert mapping.startswith("127.0.0.1:"), (name, mapping)
        if name not in INFRA:
            assert svc["environment"]["HOPS_HEALTH_HOST"] == "0.0.0.0", name
    assert "0.0.0.0:8080:8080" in (ROOT / "compose.yaml").read_text()  # says how to open it


def test_replicas_and_scaling() -> None:
    services = compose()["services"]
    replicas = by_name(StackConfig())["scheduler"].replicas
    assert services["scheduler"]["deploy"]["replicas"] == replicas == 2
    estimator = services["estimator"]
    # `docker compose up --scale estimator=3` needs neither of these
    assert "container_name" not in estimator and "ports" not in estimator


def test_nats_runs_jetstream_on_a_named_volume() -> None:
    doc = compose()
    volumes = set()
    for name in ("nats", "nats-2", "nats-3"):
        nats = doc["services"][name]
        command = " ".join(args(nats))
        assert "-js" in command and "-sd /data" in command, name
        volume = nats["volumes"][0].split(":")[0]
        assert volume in doc["volumes"], name
        volumes.add(volume)
    assert len(volumes) == 3  # a volume per server
    # a plain `up` runs the one server, as it is: no name, no routes
    assert args(doc["services"]["nats"]) == [
        "-c", "/run/secrets/nats-auth.conf", "-js", "-sd", "/data", "-m", "8222"]


def test_the_nats_cluster_profile_makes_one_cluster_of_three_at_r3() -> None:
    """deploy/nats-cluster.env enables profile nats-cluster: three servers,
    each named and routed to the two others, every service given every
    server's URL and three replicas."""
    doc, env = compose(), read_env_file(NATS_CLUSTER_ENV)
    services = doc["services"]
    members = [name for name, svc in services.items() if svc["image"].startswith("nats:")]
    assert members == ["nats", "nats-2", "nats-3"]
    assert env["COMPOSE_PROFILES"] == "nats-cluster"
    assert [services[m].get("profiles") for m in members] == [
        None, ["nats-cluster"], ["nats-cluster"]]
    for member in members:
        flags = args(services[member], env)
        value = {f: flags[flags.index(f) + 1] for f in ("--name", "--cluster_name", "--routes")}
        assert value["--name"] == member and value["--cluster_name"] == "hops"
        assert set(value["--routes"].split(",")) == {
            f"nats://{m}:6222" for m in members if m != member}, member
        assert services[member]["healthcheck"]["test"][1] == "wget", member
    for name in by_name(StackConfig()):
        environ = services[name]["environment"]
        assert interpolate(environ["HOPS_NATS_URL"], env).split(",") == [
            f"nats://{m}:4222" for m in members], name
        assert interpolate(environ["HOPS_NATS_REPLICAS"], env) == "3", name


def test_dockerfile_copies_every_package_the_stack_runs() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    copied = set(re.findall(r"^COPY (\w+)/ ", text, re.M))
    tops = {m.split(".")[0] for m in modules()}
    assert tops <= copied, tops - copied
    assert "shared" in copied and "simulator" in copied and "world" in copied
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert not tops & set(ignored)


# --- credentials -------------------------------------------------------------------------


def test_every_process_gets_its_own_identity_and_auth_can_be_turned_off() -> None:
    config = StackConfig(data_dir=Path("/d"))
    table = by_name(config)
    for name in ("monitor", "estimator", "profiler", "scheduler", "placer", "gateway"):
        assert table[name].env["HOPS_NATS_NKEY"] == f"/d/credentials/{name}.nk", name
    assert table["cluster"].env["HOPS_NATS_CREDENTIALS_DIR"] == "/d/credentials"
    assert "HOPS_NATS_NKEY" not in table["cluster"].env  # each executor its own
    for name in ("scheduler", "gateway"):
        assert table[name].env["HOPS_TENANTS"] == "/d/credentials/tenants.yaml"
    off = by_name(StackConfig(auth=False))
    assert not any(k.startswith(("HOPS_NATS_", "HOPS_TENANTS")) for c in off.values()
                   for k in c.env)
    assert off["gateway"].env["HOPS_GATEWAY_INSECURE"] == "1"  # no tenants: it must be told
    assert "HOPS_GATEWAY_INSECURE" not in table["gateway"].env
    base = {"HOPS_NATS_NKEY": "/elsewhere/admin.nk", "HOPS_TENANTS": "/x"}
    assert "HOPS_NATS_NKEY" not in environment(StackConfig(auth=False), off["placer"], base)
    assert "HOPS_TENANTS" not in environment(config, table["placer"], base)


def test_tls_reaches_nats_clients_and_the_gateway() -> None:
    config = StackConfig(tls_cert=Path("/c.pem"), tls_key=Path("/k.pem"))
    table = by_name(config)
    assert config.gateway_url.startswith("https://")
    assert table["gateway"].env["HOPS_GATEWAY_CERT"] == "/c.pem"
    assert table["gateway"].env["HOPS_GATEWAY_KEY"] == "/k.pem"
    assert all(c.env["HOPS_NATS_CA"] == "/c.pem" for c in table.values())
    with pytest.raises(ValueError):
        StackConfig(tls_cert=Path("/c.pem"))


def test_compose_gives_each_service_only_its_own_secret() -> None:
    doc = compose()
    services = doc["services"]
    declared = doc["secrets"]
    for name, svc in services.items():
        for secret in svc.get("secrets", []):
            assert declared[secret]["file"] == f"./secrets/{secret}", (name, secret)
    for name in ("monitor", "estimator", "profiler", "scheduler", "placer", "gateway"):
        env = services[name]["environment"]
        assert env["HOPS_NATS_NKEY"] == f"/run/secrets/{name}.nk", name
        nkeys = [s for s in services[name]["secrets"] if s.endswith(".nk")]
        assert nkeys == ([f"{name}.nk", "audit.nk"] if name == "monitor" else [f"{name}.nk"])
    for name in ("scheduler", "gateway"):
        assert services[name]["environment"]["HOPS_TENANTS"] == "/run/secrets/tenants.yaml"
        assert "tenants.yaml" in services[name]["secrets"]
    cluster = services["cluster"]
    assert cluster["environment"]["HOPS_NATS_CREDENTIALS_DIR"] == "/run/secrets"
    servers = cluster_arg(cluster["command"][cluster["command"].index("--cluster") + 1]).servers
    assert cluster["secrets"] == [f"executor-{s.id}.nk" for s in servers]
    for name in ("nats", "nats-2", "nats-3"):
        assert args(services[name])[:2] == ["-c", "/run/secrets/nats-auth.conf"], name
        assert services[name]["secrets"] == ["nats-auth.conf"], name


def test_hops_credentials_writes_what_compose_mounts(tmp_path: Path) -> None:
    from cli.up.credentials import prepare

    servers = [s.id for s in cluster_arg("paper-physical").servers]
    creds = prepare(tmp_path / "secrets", servers, None, mode=0o644)
    for secret in compose()["secrets"]:
        path = creds.dir / secret
        assert path.is_file(), secret
        assert path.stat().st_mode & 0o777 == 0o644, secret
    assert creds.dir.stat().st_mode & 0o777 == 0o700


def test_the_policy_spec_reaches_the_scheduler_and_compose_has_a_default() -> None:
    assert by_name(StackConfig(policy="sia:lam=1.2"))["scheduler"].env["HOPS_POLICY"] == (
        "sia:lam=1.2"
    )
    assert "HOPS_POLICY" not in by_name(StackConfig())["scheduler"].env  # the scheduler's own
    assert compose()["services"]["scheduler"]["environment"]["HOPS_POLICY"] == (
        "${HOPS_POLICY:-hops}"
    )
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        StackConfig(policy="nope")


def test_the_round_is_the_papers_in_the_jobs_time_unless_given() -> None:
    """One default round (scheduling.rounds.ROUND_S, Hops §3.6): emulated
    executors run the jobs' time ``time_scale`` times faster, so ``hops up``
    divides the round by it; real executors run in real time."""
    assert StackConfig(time_scale=60, auth=False).round_wall_s == ROUND_S / 60
    assert StackConfig(time_scale=600, auth=False).round_wall_s == ROUND_S / 600
    assert StackConfig(executor="real", time_scale=60, auth=False).round_wall_s == ROUND_S
    assert StackConfig(time_scale=60, round_s=7, auth=False).round_wall_s == 7
    assert by_name(StackConfig(time_scale=60, auth=False))["scheduler"].env == {
        "HOPS_ROUND_S": "5"}
    compose = (ROOT / "compose.yaml").read_text()
    assert 'HOPS_ROUND_S: "5"' in compose and '"--time-scale", "60"' in compose
    assert 'HOPS_TASK_TIME_SCALE: "60"' in compose  # a task policy's times, the same scale


# --- images ------------------------------------------------------------------------------


def test_the_service_image_installs_no_extra_and_the_executor_image_adds_torch() -> None:
    service = (ROOT / "Dockerfile").read_text()
    assert "['project']['dependencies']" in service and "[plugin]" not in service
    executor = (ROOT / "Dockerfile.executor").read_text()
    assert re.search(r"^ARG HOPS_IMAGE=hops:latest\nFROM \$\{HOPS_IMAGE\}", executor, re.M)
    assert 'pip install -c constraints.txt ".[plugin]"' in executor
    assert re.search(r"^USER hops", executor, re.M)  # jobs never run as root


def test_the_real_jobs_override_runs_real_executors_from_the_executor_image(
    tmp_path: Path,
) -> None:
    from cli.up.credentials import prepare

    doc: dict[str, Any] = yaml.safe_load(REAL_JOBS.read_text())
    assert schema_errors(doc) == []
    cluster = doc["services"]["cluster"]
    assert cluster["build"]["dockerfile"] == "Dockerfile.executor"
    assert cluster["image"] == "hops-executor:latest"
    assert args(cluster)[:3] == ["python", "-m", "executor"]
    assert args(cluster)[-2:] == ["--backend", "real"]
    assert args(cluster)[args(cluster).index("--cluster") + 1] == "examples/cluster-local-cpu.yaml"
    servers = [s.id for s in cluster_arg("examples/cluster-local-cpu.yaml").servers]
    assert cluster["secrets"] == [f"executor-{s}.nk" for s in servers]
    creds = prepare(tmp_path / "secrets", servers, None, mode=0o644)
    for secret, where in doc["secrets"].items():
        assert where["file"] == f"./secrets/{secret}" and (creds.dir / secret).is_file()
    # the round `hops up --executor real` gives the scheduler
    real = by_name(StackConfig(executor="real", auth=False))["scheduler"].env["HOPS_ROUND_S"]
    assert doc["services"]["scheduler"]["environment"]["HOPS_ROUND_S"] == real
