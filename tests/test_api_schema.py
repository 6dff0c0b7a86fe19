"""The OpenAPI document is the contract: the hub serves the committed file, and a fuzzer
(schemathesis) finds no 5xx and no response that breaks the document."""

from __future__ import annotations

import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jupyterhub_backendai.api import get_handlers, spec

from . import api_world
from .api_world import PREFIX, superadmin

api_hub = api_world.api_hub  # the module's hub fixture

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]


def test_committed_document_is_generated_from_the_route_table():
    with open(spec.PATH, encoding="utf-8") as f:
        assert yaml.safe_load(f) == spec.build_document(), (
            "openapi.yaml is stale: run python -m jupyterhub_backendai.api.spec --write")


def test_every_served_route_is_documented_and_back():
    served = set()
    for pattern, handler, *_ in get_handlers():
        if pattern.endswith("(?:/.*)?") or handler.__module__.startswith(
                ("jupyterhub_backendai.api.compat", "jupyterhub_backendai.storageproxy.")):
            # Backend.AI's own routes (docs/backendai-compat.md) and the in-hub storage
            # proxy's tus/Range transfer routes, authorized by their own tokens
            # (docs/storage.md): not the admin API.
            continue
        path = pattern.removeprefix(PREFIX.removeprefix("/hub"))
        served.add(path)
    documented = set()
    for path in spec.build_document()["paths"]:
        parts = ["([^/]+)" if p.startswith("{") else p for p in path.split("/")]
        documented.add("/".join(parts))
    assert served == documented


def test_served_document_equals_the_file(api_hub):
    r = requests.get(api_hub.base + PREFIX + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    assert r.json() == spec.load_document()


def test_fuzz_every_operation(api_hub):
    """Positive and negative examples for every operation, as a superadmin."""
    sa = superadmin(api_hub)
    schema = schemathesis.openapi.from_dict(spec.load_document())
    headers = {"Authorization": f"token {sa.token}"}
    base_url = api_hub.base + PREFIX
    session = requests.Session()
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) == sum(len(v) for v in spec.build_document()["paths"].values())
    strategy = st.one_of(
        *[op.as_strategy(generation_mode=mode) for op in operations
          for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    )
    failures: list[str] = []
    statuses: dict[int, int] = {}

    @settings(max_examples=8 * len(operations), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        try:
            r = case.call_and_validate(base_url=base_url, session=session, headers=headers,
                                       checks=CHECKS)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        except Exception as e:  # collect them all, report together
            failures.append(f"{case.method} {case.path} {case.path_parameters} {case.query}: {str(e)[:600]}")

    run()
    assert not failures, "\n\n".join(failures[:10])
    # The fuzzer got past validation too: some calls succeeded, some were refused as bad input.
    # (How many succeed depends on what the random generator happens to draw: a test that
    # asked for a 2xx per operation failed in CI with 43 of 53. Each operation's allowed
    # calls are asserted one by one in test_api_isolation.py.)
    print(sorted(statuses.items()))
    assert sum(v for k, v in statuses.items() if 200 <= k < 300) > 0
    assert statuses.get(400, 0) > 0
