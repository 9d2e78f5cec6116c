"""The tenants file: parsing, validation, token digests and authentication."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.tenants import (
    DEFAULT_TENANTS,
    Principal,
    TenantsError,
    authenticate,
    dump_tenants,
    load_tenants,
    may_run_commands,
    token_digest,
    with_tokens,
)

FILE = f"""
tenants:
  alice:
    tokens: ["alice-secret", "{token_digest("alice-second")}"]
    run_commands: true
  bob: {{}}
admins:
  ops: {{tokens: ["ops-secret"]}}
"""


def test_tokens_act_for_their_tenant_or_admin_and_nothing_else() -> None:
    file = load_tenants(FILE)
    assert authenticate(file, "alice-secret") == Principal("alice", tenant="alice")
    assert authenticate(file, "alice-second") == Principal("alice", tenant="alice")
    assert authenticate(file, "ops-secret") == Principal("ops", admin=True)
    assert authenticate(file, "nobody") is None
    assert authenticate(file, "") is None
    assert authenticate(file, token_digest("alice-secret")) is None  # a digest is not a token
    assert may_run_commands(file, "alice") and not may_run_commands(file, "bob")
    assert not may_run_commands(file, "carol")


def test_without_a_file_one_default_tenant_runs_commands() -> None:
    assert list(DEFAULT_TENANTS.tenants) == ["default"]
    assert may_run_commands(DEFAULT_TENANTS, "default")
    assert authenticate(DEFAULT_TENANTS, "anything") is None


@pytest.mark.parametrize(("text", "field"), [
    ("tenants: {alice: {tokens: [x], colour: red}}", "colour"),
    ("tenants: {a.b: {}}", "tenants.a.b"),
    ("tenants: {alice: {tokens: ['']}}", "tenants.alice.tokens[0]"),
    ("tenants: {alice: {tokens: ['sha256:zz']}}", "tenants.alice.tokens[0]"),
    ("tenants: {alice: {tokens: [t]}, bob: {tokens: [t]}}", "tenants.bob.tokens[0]"),
    ("tenants: {alice: {tokens: [t]}}\nadmins: {ops: {tokens: [t]}}", "admins.ops"),
    ("clusters: []", "clusters"),
    ("tenants: [", "not YAML"),
])
def test_a_bad_file_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(TenantsError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_tenants(text)


def test_generated_tokens_are_added_and_written_as_digests() -> None:
    file = with_tokens(load_tenants(FILE), {"bob": "bob-new"}, {"admin": "root-new"})
    text = dump_tenants(file)
    assert "bob-new" not in text and "root-new" not in text and "alice-secret" not in text
    again = load_tenants(text)
    assert authenticate(again, "bob-new") == Principal("bob", tenant="bob")
    assert authenticate(again, "root-new") == Principal("admin", admin=True)
    assert authenticate(again, "alice-secret") == Principal("alice", tenant="alice")
    assert may_run_commands(again, "alice")


@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6),
                       st.text("xyz0123", min_size=1, max_size=8), max_size=6, ))
def test_every_token_authenticates_only_its_own_tenant(tokens: dict[str, str]) -> None:
    unique = {t: tok for t, tok in tokens.items() if list(tokens.values()).count(tok) == 1}
    names = ", ".join(f"{t}: {{}}" for t in unique)
    file = load_tenants(dump_tenants(with_tokens(
        load_tenants(f"tenants: {{{names}}}"), unique, {})))
    for tenant, token in unique.items():
        assert authenticate(file, token) == Principal(tenant, tenant=tenant)
