"""The tenants file's cells (HiveD §4 "Cell specification"): loading,
checks against the registered nodes, and admission's refusal of a job no
cell of its tenant can hold (microsoft/pai#4029)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app as hops_app
from cli.up.stack import StackConfig
from cli.up.up import UpError, secure
from scheduling.cells import Cells
from scheduling.live.cells import cells_refusal, tenant_cells
from scheduling.live.clock import Inflight
from scheduling.live.snapshot import build_snapshot, without_layer_state
from scheduling.registry import (
    TenantAdmission,
    make_policy,
    parse_policy,
    policy_traits,
    tenant_admission,
)
from services.runtime.settings import SettingsError
from services.scheduler.settings import scheduler_settings
from shared.cluster import GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.tenants import TenantsError, dump_tenants, load_tenants, read_tenants, with_tokens
from shared.wire import UNSCHEDULABLE

HIVED = policy_traits("hived")  # its views: the HiveD layer's cells

CELLS = """
cells:
  cell_types:
    K80-PAIR: {child_cell_type: K80, child_cell_number: 2}
    K80-NODE: {child_cell_type: K80-PAIR, child_cell_number: 2, is_node_level: true}
  physical_cells:
    - {cell_type: K80-NODE, server: n0}
    - {cell_type: K80-NODE, server: n1}
  virtual_clusters:
    alice:
      virtual_cells: [{cell_type: K80-NODE}]
    bob:
      virtual_cells: [{cell_type: K80-PAIR}]
    scav: {low_priority: true}
"""
FILE = """
tenants:
  alice: {tokens: [a-secret]}
  bob: {tokens: [b-secret]}
  scav: {tokens: [s-secret]}
""" + CELLS


def node(sid: str, gpus: int = 4, gpu: str = "K80", alive: bool = True) -> NodeRecord:
    return NodeRecord(server=Server(ServerId(sid), GpuType(gpu), gpus),
                      gpu_type=GpuTypeSpec(GpuType(gpu), 1e9, 1e8), alive=alive)


def job(tenant: str, *requirements: int) -> JobSpec:
    return JobSpec(id=JobId(f"{tenant}-job"), model="m", batch_size=32, params=1000,
                   total_samples=100, tenant=TenantId(tenant), requirements=requirements)


def test_a_file_without_cells_loads_as_before_and_has_no_cell_model() -> None:
    file = load_tenants("tenants:\n  alice: {tokens: [x]}\n")
    assert file.cells is None
    assert tenant_cells(file, [node("n0")]) is None
    assert "cells" not in dump_tenants(file)


def test_cells_load_without_nodes_and_against_the_registered_ones() -> None:
    file = load_tenants(FILE)
    before = tenant_cells(file)  # no node registered yet: the cells say what n0, n1 are
    after = tenant_cells(file, [node("n0"), node("n1", alive=False), node("extra", 8, "V100")])
    assert before is not None and after is not None
    assert before.reservations == after.reservations == {
        "alice": {"K80": (0, 0, 1)}, "bob": {"K80": (0, 1, 0)}, "scav": {}}
    assert after.low_priority == {"alice": False, "bob": False, "scav": True}


def test_hops_up_keeps_the_cells_when_it_writes_the_effective_file() -> None:
    file = with_tokens(load_tenants(FILE), {"bob": "b-generated"}, {"admin": "adm"})
    again = load_tenants(dump_tenants(file))
    assert again.cells == load_tenants(FILE).cells
    assert tenant_cells(again) == tenant_cells(load_tenants(FILE))


@pytest.mark.parametrize(("nodes", "message"), [
    ([node("n0", gpus=8)],
     "tenants.yaml: cells: physical_cells[0].server: server n0 has 8 GPUs, its cell has 4 "
     "leaf cells"),
    ([node("n1", gpu="V100")],
     "tenants.yaml: cells: physical_cells[1].server: server n1 has V100 GPUs, a K80-NODE cell "
     "has K80"),
])
def test_a_registered_node_that_differs_from_its_cell_is_an_error_naming_file_and_field(
        nodes: list[NodeRecord], message: str) -> None:
    with pytest.raises(TenantsError) as e:
        tenant_cells(load_tenants(FILE), nodes, "tenants.yaml")
    assert str(e.value) == message


@pytest.mark.parametrize(("old", "new", "message"), [
    ("child_cell_type: K80-PAIR", "child_cell_type: K80-PIAR",
     "tenants.yaml: cells: cell_types.K80-NODE.child_cell_type: unknown cell type 'K80-PIAR'"),
    ("server: n1", "server: n0",
     "tenants.yaml: cells: physical_cells[1].server: server n0 is already used by "
     "physical_cells[0]"),
    ("[{cell_type: K80-PAIR}]", "[{cell_type: K80-NODE, cell_number: 2}]",
     "tenants.yaml: cells: virtual_clusters.bob: tenant bob: chain K80 level 3: 3 needed, "
     "2 available"),
])
def test_each_cells_error_names_the_file_and_the_field(old: str, new: str, message: str) -> None:
    file = load_tenants(FILE.replace(old, new))
    with pytest.raises(TenantsError) as e:
        tenant_cells(file, [node("n0"), node("n1")], "tenants.yaml")
    assert str(e.value) == message


def test_without_nodes_a_misspelt_cell_type_is_still_an_error_naming_the_field() -> None:
    # no node says which names are GPU types: K80-PIAR reads as the node
    # cells' GPU type, and the K80-PAIR cell type then ends in an unknown one
    file = load_tenants(FILE.replace("child_cell_type: K80-PAIR", "child_cell_type: K80-PIAR"))
    with pytest.raises(TenantsError, match=r"^tenants.yaml: cells: cell_types\.K80-PAIR\."
                       r"child_cell_type: unknown cell type 'K80'$"):
        tenant_cells(file, [], "tenants.yaml")


@pytest.mark.parametrize(("text", "message"), [
    (FILE.replace("    scav: {low_priority: true}\n", ""),
     "cells.virtual_clusters: tenant scav has no virtual cluster (give it virtual_cells, "
     "or low_priority: true)"),
    (FILE + "    mallory: {low_priority: true}\n",
     "cells.virtual_clusters.mallory: 'mallory' is not a tenant (tenants: alice, bob, scav)"),
    (FILE.split("  virtual_clusters:")[0],
     "cells.virtual_clusters: the cells need a virtual cluster per tenant (a mapping from "
     "tenant to its virtual_cells)"),
])
def test_virtual_clusters_and_tenants_match_one_to_one(text: str, message: str) -> None:
    with pytest.raises(TenantsError) as e:
        load_tenants(text)
    assert str(e.value) == message


def test_reading_the_file_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(FILE + "    mallory: {}\n")
    with pytest.raises(TenantsError, match=r"tenants.yaml: cells.virtual_clusters.mallory"):
        read_tenants(path)


def test_admission_refuses_a_job_no_cell_of_its_tenant_holds_when_it_cannot_run_opportunistically(
) -> None:
    model = tenant_cells(load_tenants(FILE))
    assert model is not None
    cells = Cells(model)
    # alice reserves a node (4 GPUs), bob a pair (2 GPUs)
    off = tenant_admission(parse_policy("hived:opportunistic=false"))
    on = tenant_admission(parse_policy("hived"))
    assert cells_refusal(cells, job("alice", 4), 4, off) is None
    assert cells_refusal(cells, job("bob", 2, 4), 4, off) is None
    refusal = cells_refusal(cells, job("bob", 4, 8), 4, off)
    assert refusal is not None and refusal.code == UNSCHEDULABLE
    assert refusal.message == (
        "job bob-job can never run here: it needs at least 4 GPUs of one type, more than any "
        "cell of tenant bob holds (1 K80-PAIR (2 K80)), and the policy has opportunistic jobs "
        "off; ask for fewer GPUs or for larger cells")
    # opportunistically it may still run on idle cells of others
    assert cells_refusal(cells, job("bob", 4), 4, on) is None
    low = cells_refusal(cells, job("scav", 1), 4, off)
    assert low is not None and "scav is low-priority" in low.message
    assert cells_refusal(cells, job("scav", 1), 4, on) is None
    unknown = cells_refusal(cells, job("carol", 1), 4, on)
    assert unknown is not None and "tenant carol has no virtual cluster" in unknown.message


def test_quota_admission_refuses_a_job_beyond_its_tenants_quota_unless_it_may_borrow() -> None:
    """Kueue's nominal quota counts GPUs, not cells: bob's quota is his
    pair's 2 GPUs, so under ``quota`` a 3-GPU job can never run and gets a
    422 naming the quota; ``quota-borrow`` may borrow idle quota."""
    model = tenant_cells(load_tenants(FILE))
    assert model is not None
    cells = Cells(model)
    quota = tenant_admission(parse_policy("quota"))
    assert cells_refusal(cells, job("bob", 2), 4, quota) is None
    refusal = cells_refusal(cells, job("bob", 3, 4), 4, quota)
    assert refusal is not None and refusal.code == UNSCHEDULABLE and refusal.message == (
        "job bob-job can never run here: it needs at least 3 GPUs of one type, more than "
        "tenant bob's quota (2 K80), and the policy does not borrow; ask for fewer GPUs or for "
        "a larger quota")
    assert cells_refusal(cells, job("bob", 3), 4, tenant_admission(
        parse_policy("quota-borrow"))) is None
    low = cells_refusal(cells, job("scav", 1), 4, quota)
    assert low is not None and "the policy does not borrow" in low.message


def test_which_policies_need_cells_and_what_they_admit() -> None:
    assert all(policy_traits(p).needs_cells for p in ("hived", "quota", "quota-borrow"))
    assert not policy_traits("hops").needs_cells
    assert tenant_admission(parse_policy("hived:opportunistic=false")) == TenantAdmission(
        beyond=False)
    assert tenant_admission(parse_policy("quota")) == TenantAdmission(beyond=False, quota=True)
    assert tenant_admission(parse_policy("hops")) == TenantAdmission()


CLUSTER = """\
name: two
gpu_types:
  - {name: K80, link_bandwidth: 1.0e9, net_bandwidth: 1.0e8}
servers:
  - {id: n0, gpu_type: K80, gpus: 4}
  - {id: n1, gpu_type: K80, gpus: GPUS}
"""


def test_compose_credentials_carry_the_cells_and_check_them_against_the_cluster(
        tmp_path: Path) -> None:
    tenants, cluster = tmp_path / "tenants.yaml", tmp_path / "cluster.yaml"
    tenants.write_text(FILE)
    cluster.write_text(CLUSTER.replace("GPUS", "4"))
    out = CliRunner().invoke(hops_app, ["credentials", "--out", str(tmp_path / "secrets"),
                                        "--compose", "--tenants", str(tenants),
                                        "--cluster", str(cluster)])
    assert out.exit_code == 0, out.output
    effective = read_tenants(tmp_path / "secrets" / "tenants.yaml")
    assert effective.cells == load_tenants(FILE).cells  # what the scheduler will read
    cluster.write_text(CLUSTER.replace("GPUS", "8"))
    out = CliRunner().invoke(hops_app, ["credentials", "--out", str(tmp_path / "again"),
                                        "--compose", "--tenants", str(tenants),
                                        "--cluster", str(cluster)])
    assert out.exit_code == 2
    assert f"{tenants}: cells: physical_cells[1].server: server n1 has 8 GPUs, its cell has 4 " \
        "leaf cells" in out.output


def test_hops_up_checks_the_cells_against_its_cluster(tmp_path: Path) -> None:
    tenants, cluster = tmp_path / "tenants.yaml", tmp_path / "cluster.yaml"
    tenants.write_text(FILE)
    cluster.write_text(CLUSTER.replace("GPUS", "2"))
    config = StackConfig(cluster=str(cluster), data_dir=tmp_path / "data", tenants=tenants)
    with pytest.raises(UpError, match=r"cells: physical_cells\[1\].server: server n1 has 2 GPUs"):
        secure(config)
    cluster.write_text(CLUSTER.replace("GPUS", "4"))
    creds = secure(config)
    assert creds is not None
    assert read_tenants(creds.tenants_file).cells is not None


def test_the_scheduler_settings_need_cells_for_a_cell_policy_and_check_them(
        tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(FILE)
    settings = scheduler_settings({"HOPS_TENANTS": str(path)})
    assert settings.cells == tenant_cells(load_tenants(FILE))
    assert settings.tenants_source == str(path)
    path.write_text(FILE.replace("server: n1", "server: n0"))
    with pytest.raises(TenantsError, match=r"tenants.yaml: cells: physical_cells\[1\]"):
        scheduler_settings({"HOPS_TENANTS": str(path)})
    with pytest.raises(SettingsError, match="policy hived needs the tenants' cells"):
        scheduler_settings({"HOPS_POLICY": "hived"})


def test_a_dead_node_reaches_the_layer_and_becomes_a_doomed_cell_in_the_views() -> None:
    """The live snapshot lists alive nodes only; the HiveD layer marks a
    cell server it does not list bad (§4 "Handling faulty hardware"), and
    with one healthy node for two reserved ones a tenant gets a doomed cell,
    which its view (GET /tenants) shows; the state the leader keeps in
    hops_state carries it to the next snapshot."""
    file = load_tenants(FILE.replace("[{cell_type: K80-PAIR}]", "[{cell_type: K80-NODE}]"))
    model = tenant_cells(file)
    assert model is not None
    policy = make_policy("hived", cells=model)
    nodes = [node("n0"), node("n1", alive=False)]
    built = build_snapshot(0.0, {}, nodes, {}, {}, {}, Inflight(60.0), True)
    assert [s.id for s in built.snapshot.cluster.servers] == ["n0"]
    plan = policy.plan(built.snapshot)
    (record,) = [r for r in plan.reasons.layers if r.name == "hived"]
    views = {v.tenant: v for v in HIVED.tenant_views(model, {"hived": record.state})}
    doomed = [c for v in views.values() for ch in v.chains for c in ch.bound if c.doomed]
    assert [(c.servers[0].server, c.bad_gpus) for c in doomed] == [("n1", 4)]
    # the views see it before any plan: from a fresh state, with n1 not alive
    early = [c for v in HIVED.tenant_views(model, {}, {ServerId("n0")}) for ch in v.chains
             for c in ch.bound if c.doomed]
    assert [(c.servers[0].server, c.bad_gpus) for c in early] == [("n1", 4)]
    assert not [c for v in HIVED.tenant_views(model, {}) for ch in v.chains for c in ch.bound]
    # the next snapshot carries the state back, and the published plan does not
    again = build_snapshot(1.0, {}, nodes, {}, {}, {}, Inflight(60.0), True,
                           layer_state={"hived": record.state})
    assert again.snapshot.layer_state == {"hived": record.state}
    assert all(not r.state for r in without_layer_state(plan).reasons.layers)


def test_the_docs_live_example_is_a_valid_tenants_file() -> None:
    text = (Path(__file__).parents[1] / "docs" / "tenancy.md").read_text()
    blocks = [b.split("```")[0] for b in text.split("```yaml\n")[1:]]
    (example,) = [b for b in blocks if b.startswith("tenants:")]
    model = tenant_cells(load_tenants(example), [node("a0", gpu="A"), node("a1", gpu="A")])
    assert model is not None and model.low_priority["scavenger"]
