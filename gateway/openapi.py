"""The gateway's OpenAPI schema: FastAPI's, plus the wire contract's JobSpec
and SubmitJob (the submit body refers to them), the page and error shapes,
the bearer scheme's 401/403 answers, and without FastAPI's 422 answers
(the gateway answers a bad parameter 400).
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gateway import auth, pages, views
from gateway.conditions import Condition
from shared.events import SubmitJob
from shared.explain import JobForecast, Receipt
from shared.job import JobSpec
from shared.records import JobRecord


def submit_body_schema() -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"oneOf": [_ref("JobSpec"), _ref("SubmitJob")]},
                }
            },
        }
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_response(description: str, schema: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema)}}}


def openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the JobSpec and SubmitJob schemas of the wire
    contract, which the submit body refers to."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        _, components = msgspec.json.schema_components(
            [JobSpec, SubmitJob, JobRecord, Condition, JobForecast, Receipt],
            ref_template="#/components/schemas/{name}"
        )
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(components)
        schemas.update(explain_schemas())
        schemas["JobPage"] = pages.page_schema("#/components/schemas/JobRecord")
        schemas["Error"] = views.ERROR_SCHEMA
        _drop_validation_422(schema)
        auth.document_refusals(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def _drop_validation_422(schema: dict[str, Any]) -> None:
    """Remove the 422 answers FastAPI documents for every route with
    parameters: :func:`_bad_parameter` answers 400 instead."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("422", {})
            if "HTTPValidationError" in str(answer.get("content", "")):
                del operation["responses"]["422"]
    schemas = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)


def _nullable(name: str) -> dict[str, Any]:
    return {"anyOf": [_ref(name), {"type": "null"}]}


def explain_schemas() -> dict[str, Any]:
    """``GET /jobs/{id}``'s body (``JobDetail``) and ``GET
    /jobs/{id}/timeline``'s (``Timeline``), with the reason's shape
    (``WhyView``): :mod:`gateway.explain_view`."""
    why = {"title": "WhyView", "type": "object",
           "required": ["code", "message", "layer", "since", "details"],
           "properties": {
               "code": {"type": "string", "description": "one of shared.explain.REASON_CODES"},
               "message": {"type": "string", "description": "the reason in words, naming "
                           "the jobs it names (another tenant's: \"another tenant's job\")"},
               "layer": {"type": "string"}, "since": {"type": "number"},
               "details": {"type": "object", "description": "the code's details that are "
                           "set: jobs, ratios, types, gpu_type, short, free, rank, window, "
                           "next_plan_at"}}}
    detail = {"title": "JobDetail", "allOf": [_ref("JobRecord"), {"type": "object", "properties": {
        "job_id": {"type": "string"}, "waited_s": {"type": "number"},
        "ran_s": {"type": "number"}, "why": _nullable("WhyView"),
        "receipt": _nullable("Receipt"), "forecast": _nullable("JobForecast"),
        "throughput": {"type": "object", "properties": {
            "estimated": {"type": "number"}, "measured": {"type": "number"}}},
        "explained_at": {"type": ["number", "null"]},
        "conditions": {"type": "array", "items": _ref("Condition")}}}]}
    entry = {"type": "object", "required": ["at", "kind"], "properties": {
        "at": {"type": "number"}, "kind": {"type": "string"}, "note": {"type": "string"},
        "why": _nullable("WhyView"), "receipt": _nullable("Receipt"),
        "forecast": _nullable("JobForecast")}}
    timeline = {"title": "Timeline", "type": "object", "properties": {
        "job_id": {"type": "string"}, "tenant": {"type": "string"},
        "entries": {"type": "array", "items": entry}, "count": {"type": "integer"},
        "truncated": {"type": "boolean", "description": "more entries than `limit`"}}}
    return {"WhyView": why, "JobDetail": detail, "Timeline": timeline}

