"""Every endpoint of ``clag-fast serve`` fuzzed from its own /openapi.json (schemathesis):
no answer is a 5xx, every error is the service's JSON error body."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from service_helpers import ServiceProcess
from store_helpers import topic_vectors


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(tmp_path_factory.mktemp("fuzz") / "store") as s:
        v = topic_vectors(60, 3, seed=2)[0]
        r = httpx.post(s.url + "/v1/memories", json={"items": [
            {"text": f"memory {i}", "vector": v[i].tolist(), "namespace": "default" if i % 2 else "other",
             "metadata": {"i": i}} for i in range(60)]})
        assert r.status_code == 200, r.text
        yield s


def _operations(url):
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


def test_no_endpoint_answers_5xx(service):
    """Each operation in turn, with a bounded number of generated requests (valid and not)."""
    operations = _operations(service.url)
    assert len(operations) >= 15
    seen = {}

    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=10, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case):
            response = case.call(base_url=service.url, timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} {case.body!r:.300}: {response.status_code} {response.text[:500]}")
            if response.status_code >= 400:
                body = response.json()
                assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, response.text[:300]

        fuzz()
    assert any(200 <= s < 300 for s in seen) and any(400 <= s < 500 for s in seen), seen
    assert httpx.get(service.url + "/healthz").status_code == 200


def test_the_schema_lists_every_endpoint(service):
    paths = httpx.get(service.url + "/openapi.json").json()["paths"]
    for p in ("/v1/memories", "/v1/memories/{memory_id}", "/v1/search", "/v1/search/batch", "/v1/clusters",
              "/v1/organize", "/v1/forget", "/v1/stats", "/healthz"):
        assert p in paths
