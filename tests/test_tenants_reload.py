"""Reloading the tenants file: a file that passes is swapped in for
admission and the leader; one that does not is refused and changes nothing;
a cells change under a cells policy needs a restart (services.scheduler.
reload, gateway.reload, scheduling.live.tenancy.reload_refusal)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import structlog

from cli.tenants_view import render_reload
from gateway.reload import reload_body
from scheduling.live.tenancy import reload_refusal
from services.scheduler.reload import TenantsReload
from services.scheduler.settings import scheduler_settings
from shared.events import TenantsReloaded
from shared.tenants import TenantsFile, TenantSpec

ONE = "tenants: {alice: {tokens: [alice-secret]}}\n"
TWO = "tenants: {alice: {tokens: [alice-secret]}, bob: {tokens: [bob-secret]}}\n"


class FakeElector:
    def __init__(self) -> None:
        self.lease = SimpleNamespace(holder="r1")
        self.used: list[Any] = []

    def use(self, settings: Any) -> None:
        self.used.append(settings)


def reloader(tmp_path: Path, text: str) -> tuple[TenantsReload, Path, Any, FakeElector]:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    settings = scheduler_settings({"HOPS_TENANTS": str(path)})
    admission = SimpleNamespace(tenants=settings.tenants)
    elector = FakeElector()
    ctx = SimpleNamespace(log=structlog.get_logger())
    return (TenantsReload(ctx, settings, str(path), admission, elector),  # type: ignore[arg-type]
            path, admission, elector)


def test_a_changed_file_is_swapped_in_for_admission_and_the_leader(tmp_path: Path) -> None:
    reload, path, admission, elector = reloader(tmp_path, ONE)
    path.write_text(TWO)
    answer = reload.reload()
    assert answer.ok and answer.tenants == ("alice", "bob") and answer.replica == "r1"
    assert sorted(admission.tenants.tenants) == ["alice", "bob"]
    assert sorted(elector.used[-1].tenants.tenants) == ["alice", "bob"]


def test_a_file_that_does_not_validate_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    reload, path, admission, elector = reloader(tmp_path, ONE)
    path.write_text("tenants: {alice: {tokens: [x], colour: red}}\n")
    answer = reload.reload()
    assert not answer.ok and answer.code == "invalid" and "colour" in answer.error
    assert answer.tenants == ("alice",)
    assert sorted(admission.tenants.tenants) == ["alice"] and elector.used == []
    path.unlink()
    assert not reload.reload().ok and elector.used == []


def test_a_cells_change_needs_a_restart_only_under_a_cells_policy() -> None:
    old = TenantsFile(tenants={"a": TenantSpec()})
    new = TenantsFile(tenants={"a": TenantSpec()}, cells={"cell_types": {}})
    assert "restart" in (reload_refusal(old, new, needs_cells=True) or "")
    assert reload_refusal(old, new, needs_cells=False) is None
    assert reload_refusal(old, TenantsFile(tenants={"b": TenantSpec()}), True) is None


def answer(ok: bool, service: str = "scheduler") -> TenantsReloaded:
    return TenantsReloaded(ok=ok, service=service, replica="r", source="t.yaml",
                           tenants=("alice",), error="" if ok else "bad",
                           code="" if ok else "invalid")


def test_the_reload_answer_says_which_process_refused_or_that_none_answered() -> None:
    assert reload_body([answer(True, "gateway"), answer(True)])[0] == 200
    status, body = reload_body([answer(True, "gateway"), answer(False)])
    assert status == 422 and body["code"] == "invalid" and "scheduler r: bad" in body["error"]
    status, body = reload_body([answer(True, "gateway")])
    assert status == 503 and body["code"] == "unavailable"
    text = render_reload(body)
    assert "gateway r: reloaded t.yaml; tenants: alice" in text and "unavailable" in text
