"""Multi-tenant sharing of a cluster: tenants' traces, quotas and cells (docs/tenancy.md)."""
