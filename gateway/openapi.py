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
from shared.events import SubmitJob
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
            [JobSpec, SubmitJob, JobRecord], ref_template="#/components/schemas/{name}"
        )
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(components)
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
