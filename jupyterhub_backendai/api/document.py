"""The admin API's OpenAPI document (``openapi.yaml``), made from the declared routes.

Write or check it::

    python -m jupyterhub_backendai.api.document --write

A test fails when the committed file differs from what this makes (tests/test_api_schema.py).
The vocabulary the handlers declare their routes with is :mod:`.spec`; this module reads
the routes (:func:`..api.api_routes`), so the handlers never import it.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from . import api_routes, models
from .spec import (
    BINARY,
    ERRORS,
    FIELD_DESCRIPTIONS,
    INT32,
    MAX_LIMIT,
    PATH,
    PATTERN_WORDS,
    PREFIX,
    Op,
    Route,
    _int,
    _page_schema,
    _param,
    _path_params,
    _ref,
)


def _with_words(schema, field: str | None = None):
    """A copy of ``schema`` with ``x-message`` on every pattern and a description on
    every named property (shared pieces such as NAME are copied, never changed)."""
    if isinstance(schema, list):
        return [_with_words(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _with_words(sub, name) for name, sub in value.items()}
        else:
            out[key] = _with_words(value)
    if "pattern" in out and "x-message" not in out and out["pattern"] in PATTERN_WORDS:
        out["x-message"] = PATTERN_WORDS[out["pattern"]]
    if field is not None and "description" not in out and "$ref" not in out \
            and field in FIELD_DESCRIPTIONS:
        out["description"] = FIELD_DESCRIPTIONS[field]
    return out


def _operation(path: str, method: str, op: Op) -> dict:
    params = _path_params(path)
    if op.filters is not None:
        params += [_param("offset", _int(0, INT32)), _param("limit", _int(1, MAX_LIMIT))]
        params += [_param(k, v) for k, v in op.filters.items()]
    params += [_param(k, v, required=req) for k, (v, req) in (op.params or {}).items()]
    out: dict = {"operationId": op.op_id, "summary": op.summary,
                 "tags": [op.tag or path.split("/")[1]]}
    if op.public:
        out["security"] = []
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": _ref(op.body.__name__)}}}
    if op.raw_body:
        out["requestBody"] = {"required": True, "content": {
            "application/octet-stream": {"schema": BINARY}}}
    responses: dict = {}
    if op.raw_response:
        responses[str(op.status)] = {"description": "The file's bytes", "content": {
            "application/octet-stream": {"schema": BINARY}}}
    elif isinstance(op.response, dict):
        responses[str(op.status)] = {"description": op.summary, "content": {
            "application/json": {"schema": op.response}}}
    elif op.response is None:
        responses[str(op.status)] = {"description": "Done"}
    else:
        name = op.response.__name__
        schema = _page_schema(name) if op.filters is not None else _ref(name)
        responses[str(op.status)] = {"description": "OK",
                                     "content": {"application/json": {"schema": schema}}}
    if not op.public:
        for code in ERRORS:
            responses[str(code)] = {"$ref": f"#/components/responses/E{code}"}
    out["responses"] = responses
    return out


def build_document(routes: list[Route] | None = None) -> dict:
    """The OpenAPI document of ``routes`` (default: every declared route)."""
    paths: dict[str, dict] = {}
    for r in api_routes() if routes is None else routes:
        for method, op in r.ops.items():
            paths.setdefault(r.path, {})[method] = _operation(r.path, method, op)
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyterhub-backendai admin API",
            "version": "1.0.0",
            "description": "Tenancy (domains, projects, users, keypairs, resource policies), "
                           "resource groups, agents, sessions and virtual folders of a "
                           "jupyterhub-backendai hub. "
                           "See docs/api.md.",
        },
        "servers": [{"url": PREFIX, "description": "on a hub whose base_url is /"}],
        "security": [{"jupyterhubToken": []}, {"backendaiSignature": []}, {"hubCookie": []}],
        "paths": paths,
        "components": {
            "schemas": _with_words(models.component_schemas()),
            "responses": {
                f"E{code}": {"description": text, "content": {
                    "application/problem+json": {"schema": _ref("Problem")}}}
                for code, text in ERRORS.items()
            },
            "securitySchemes": {
                "jupyterhubToken": {"type": "apiKey", "in": "header", "name": "Authorization",
                                    "description": "Authorization: token <JupyterHub API token> "
                                    "(needs the custom:backendai:read / :write scopes)"},
                "backendaiSignature": {"type": "apiKey", "in": "header", "name": "Authorization",
                                       "description": "Authorization: BackendAI "
                                       "signMethod=HMAC-SHA256, credential=<access key>:<signature>"},
                "hubCookie": {"type": "apiKey", "in": "cookie", "name": "jupyterhub-session-id",
                              "description": "The browser's hub login (XSRF rules apply)"},
            },
        },
    }
    # Plain data only: no shared objects (YAML aliases), enums as their strings.
    return json.loads(json.dumps(doc))


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write or check the admin API's openapi.yaml.")
    ap.add_argument("--write", action="store_true", help=f"write {PATH}")
    args = ap.parse_args(argv)
    text = dump(build_document())
    if args.write:
        with open(PATH, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
