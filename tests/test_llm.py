"""LLMClient against a misbehaving fake server, plus the parser and the schema validator."""

from __future__ import annotations

import json
import threading
import time

import pytest
from llm_fixtures import completion, dead_url, fake_server  # noqa: F401

from clag_fast.slm.client import (
    LLMClient,
    LLMHTTPError,
    LLMInvalidOutput,
    LLMTimeout,
    LLMUnreachable,
    SchemaError,
    parse_json_object,
    validate,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "cluster": {"type": "integer", "enum": [3, 7]},
    },
    "required": ["summary", "tags", "cluster"],
}
GOOD = {"summary": "Baking at home.", "tags": ["food", "baking", "bread"], "cluster": 7}
MSGS = [{"role": "user", "content": "hi"}]


def client(url: str, **kw) -> LLMClient:
    kw.setdefault("timeout", 2.0)
    kw.setdefault("backoff", 0.01)
    return LLMClient(url, **kw)


# ----------------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(GOOD),
        "```json\n" + json.dumps(GOOD) + "\n```",
        "<think>the user wants {json}</think>" + json.dumps(GOOD),
        "Sure! Here is the answer:\n" + json.dumps(GOOD) + "\nHope it helps {",
        '{"summary": "Baking\nat home.", "tags": ["food", "baking", "bread"], "cluster": 7}',
        'noise {not json} then ' + json.dumps(GOOD),
    ],
)
def test_parse_tolerates_wrappers(text):
    out = parse_json_object(text)
    assert out["cluster"] == 7 and out["tags"] == ["food", "baking", "bread"]


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"summary": "cut here', "truncated"),
        ("no json at all", "no JSON object"),
        ("[1, 2, 3]", "no JSON object"),
        ("<think>unfinished thought {\"a\": 1}", "no JSON object"),
        ("", "no JSON object"),
    ],
)
def test_parse_rejects(text, why):
    with pytest.raises(LLMInvalidOutput, match=why):
        parse_json_object(text)


def test_validate_accepts_good_and_names_bad_paths():
    validate(GOOD, SCHEMA)
    with pytest.raises(SchemaError, match=r"\$\.cluster: 99 is not one of"):
        validate({**GOOD, "cluster": 99}, SCHEMA)
    with pytest.raises(SchemaError, match=r"missing required key 'tags'"):
        validate({"summary": "x", "cluster": 3}, SCHEMA)
    with pytest.raises(SchemaError, match=r"\$\.tags: 4 items, more than 3"):
        validate({**GOOD, "tags": list("abcd")}, SCHEMA)
    with pytest.raises(SchemaError, match=r"\$\.tags\[1\]: expected string"):
        validate({**GOOD, "tags": ["a", 2]}, SCHEMA)
    with pytest.raises(SchemaError, match=r"expected integer"):
        validate({**GOOD, "cluster": True}, SCHEMA)  # bool is not a JSON integer
    with pytest.raises(SchemaError, match="fewer than 1"):
        validate([], {"type": "array", "minItems": 1})
    with pytest.raises(SchemaError, match="unexpected keys"):
        validate({"a": 1, "b": 2}, {"type": "object", "properties": {"a": {}}, "additionalProperties": False})



def test_validate_prefix_items_checks_each_position():
    tup = {"type": "array", "prefixItems": [{"enum": [1, 2]}, {"enum": [3]}], "items": False}
    validate([2, 3], tup)
    validate([1], tup)  # prefixItems alone does not require every position
    with pytest.raises(SchemaError, match=r"\$\[1\]: 2 is not one of \[3\]"):
        validate([1, 2], tup)
    with pytest.raises(SchemaError, match="more than the 2 allowed"):
        validate([1, 3, 3], tup)
    # Without items: false, later entries follow "items" when it is a schema.
    with pytest.raises(SchemaError, match=r"\$\[2\]: expected string"):
        validate([1, 3, 4], {"type": "array", "prefixItems": tup["prefixItems"], "items": {"type": "string"}})


# ----------------------------------------------------------------------------- client basics


def test_constructor_rejects_bad_arguments():
    for bad in ("", "localhost:8080", "ftp://x", None):
        with pytest.raises(ValueError, match="base_url"):
            LLMClient(bad)
    with pytest.raises(ValueError, match="timeout"):
        LLMClient("http://127.0.0.1:1", timeout=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        LLMClient("http://127.0.0.1:1", max_concurrency=0)
    with pytest.raises(ValueError, match="schema_mode"):
        LLMClient("http://127.0.0.1:1", schema_mode="grammar")


def test_base_url_normalised():
    assert LLMClient("http://127.0.0.1:8080").base_url == "http://127.0.0.1:8080/v1"
    assert LLMClient("http://127.0.0.1:8080/v1/").base_url == "http://127.0.0.1:8080/v1"


def test_chat_json_openai_server_and_stats(fake_server):
    fake_server.reply_json(GOOD, prompt_tokens=40, completion_tokens=12)
    llm = client(fake_server.url)
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.schema_mode == "json_schema"
    reqs = fake_server.chat_requests()
    assert len(reqs) == 2
    rf = reqs[0]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"]["required"] == SCHEMA["required"]
    assert reqs[0]["model"] == "fake-model"  # asked /v1/models once
    snap = llm.stats.snapshot()
    assert snap["calls"] == 2 and snap["errors"] == 0
    assert snap["prompt_tokens"] == 80 and snap["completion_tokens"] == 24
    assert snap["latency_s"] > 0


def test_schema_mode_detects_llama_cpp_python_and_remembers(fake_server):
    fake_server.llama_cpp_python = True
    fake_server.reply_json(GOOD)
    llm = client(fake_server.url, max_retries=2)
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.schema_mode == "json_object"
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    types = [r["response_format"]["type"] for r in fake_server.chat_requests()]
    # One probe with the OpenAI form (no retry of that 500), then json_object for good.
    assert types == ["json_schema", "json_object", "json_object"]
    assert fake_server.chat_requests()[1]["response_format"]["schema"]["properties"]["cluster"]["enum"] == [3, 7]
    assert llm.stats.snapshot()["errors"] == 0


def test_a_schema_the_remembered_mode_refuses_goes_down_the_list_for_that_call(fake_server):
    # An OpenAI-strict server: json_schema works, but not with prefixItems (routing's schema).
    tuple_schema = {"type": "object", "properties": {"choices": {
        "type": "array", "prefixItems": [{"type": "integer", "enum": [1, 2]}], "minItems": 1, "maxItems": 1}},
        "required": ["choices"]}

    def behaviour(body):
        rf = body.get("response_format") or {}
        if rf.get("type") == "json_schema" and "prefixItems" in json.dumps(rf):
            return (400, {"error": "prefixItems is not supported"})
        if rf.get("type") == "json_schema" and "choices" not in json.dumps(rf):
            return (200, completion(json.dumps(GOOD)))
        return (200, completion('{"choices": [2]}'))

    fake_server.behaviour = behaviour
    llm = client(fake_server.url)
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.schema_mode == "json_schema"
    assert llm.chat_json(MSGS, tuple_schema) == {"choices": [2]}
    assert llm.schema_mode == "json_schema"  # the remembered mode is kept for other schemas
    types = [(r.get("response_format") or {}).get("type") for r in fake_server.chat_requests()]
    assert types == ["json_schema", "json_schema", "json_object"]
    assert llm.stats.snapshot()["errors"] == 0


def test_schema_mode_falls_back_to_prompt_only(fake_server):
    def behaviour(body):
        if "response_format" in body:
            return (400, {"error": "response_format not supported"})
        return (200, completion("```json\n" + json.dumps(GOOD) + "\n```"))

    fake_server.behaviour = behaviour
    llm = client(fake_server.url)
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.schema_mode == "none"


def test_wire_schema_drops_grammar_slow_keywords(fake_server):
    fake_server.reply_json({"name": "abc"})
    llm = client(fake_server.url)
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
              "required": ["name"]}
    assert llm.chat_json(MSGS, schema) == {"name": "abc"}
    sent = fake_server.chat_requests()[0]["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["name"] == {"type": "string"}
    fake_server.reply_json({"name": "abcdefgh"})  # still checked locally
    with pytest.raises(LLMInvalidOutput, match="longer than 5"):
        llm.chat_json(MSGS, schema)


# ----------------------------------------------------------------------------- faults


def test_server_down_is_unreachable_with_bounded_retries():
    llm = client(dead_url(), max_retries=2, backoff=0.01)
    with pytest.raises(LLMUnreachable):
        llm.chat_json(MSGS, SCHEMA)
    snap = llm.stats.snapshot()
    # bounded by count: one call, the first attempt and exactly max_retries more
    assert snap["calls"] == 1 and snap["errors"] == 1 and snap["retries"] == 2, snap
    # Cool-down: the next call fails fast without touching the network.
    before = llm.stats.snapshot()["requests"]
    with pytest.raises(LLMUnreachable, match="not retrying yet"):
        llm.chat_json(MSGS, SCHEMA)
    assert llm.stats.snapshot()["requests"] == before


def test_slow_server_times_out(fake_server):
    # The server answers only after the client has given up (the test releases it), so the
    # client cannot have waited for the answer: two attempts, each abandoned at its timeout.
    release = threading.Event()

    def held(body):
        release.wait(timeout=60)
        return 200, completion(json.dumps(GOOD))

    fake_server.behaviour = held
    llm = client(fake_server.url, timeout=0.3, max_retries=1, schema_mode="json_object")
    try:
        with pytest.raises(LLMTimeout, match="no answer within 0.3 s"):
            llm.chat_json(MSGS, SCHEMA)
        assert len(fake_server.chat_requests()) == 2  # the first attempt and one retry
    finally:
        release.set()
    assert llm.stats.snapshot()["retries"] == 1


def test_http_500_retried_then_raised(fake_server):
    fake_server.behaviour = lambda body: (500, {"error": "model crashed"})
    llm = client(fake_server.url, max_retries=2, schema_mode="json_object")
    with pytest.raises(LLMHTTPError) as ei:
        llm.chat_json(MSGS, SCHEMA)
    assert ei.value.status == 500 and "model crashed" in ei.value.body
    assert len(fake_server.chat_requests()) == 3


def test_http_500_everywhere_is_not_remembered_as_a_mode(fake_server):
    fake_server.behaviour = lambda body: (500, {"error": "down"})
    llm = client(fake_server.url, max_retries=0)
    with pytest.raises(LLMHTTPError):
        llm.chat_json(MSGS, SCHEMA)
    assert llm.schema_mode is None
    fake_server.reply_json(GOOD)
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.schema_mode == "json_schema"


def test_http_400_not_retried(fake_server):
    fake_server.behaviour = lambda body: (400, {"error": "bad request"})
    llm = client(fake_server.url, max_retries=3, schema_mode="json_schema")
    with pytest.raises(LLMHTTPError):
        llm.chat_json(MSGS, SCHEMA)
    assert len(fake_server.chat_requests()) == 1


def test_recovers_after_transient_500(fake_server):
    calls = []

    def behaviour(body):
        calls.append(1)
        return (500, {"error": "busy"}) if len(calls) == 1 else (200, completion(json.dumps(GOOD)))

    fake_server.behaviour = behaviour
    llm = client(fake_server.url, max_retries=2, schema_mode="json_object")
    assert llm.chat_json(MSGS, SCHEMA) == GOOD
    assert llm.stats.snapshot()["retries"] == 1


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"summary": "Baking", "tags": ["food"', "truncated"),
        ("I cannot answer that.", "no JSON object"),
        (json.dumps({**GOOD, "cluster": 99}), "not one of"),
        (json.dumps({"summary": "x"}), "missing required key"),
    ],
)
def test_invalid_output(fake_server, content, match):
    fake_server.reply_text(content)
    llm = client(fake_server.url, schema_mode="json_object")
    with pytest.raises(LLMInvalidOutput, match=match) as ei:
        llm.chat_json(MSGS, SCHEMA)
    assert ei.value.text == content
    assert llm.stats.snapshot()["errors"] == 1
    assert len(fake_server.chat_requests()) == 1  # invalid output is not retried


@pytest.mark.parametrize(
    "raw",
    ['{"choices": []}', "not json at all", '{"choices": [{"message": {}}]}', "[1]"],
)
def test_malformed_server_body(fake_server, raw):
    fake_server.behaviour = lambda body: (200, raw)
    llm = client(fake_server.url, schema_mode="json_object")
    with pytest.raises(LLMInvalidOutput):
        llm.chat_json(MSGS, SCHEMA)


def test_bad_messages_rejected_before_any_request(fake_server):
    llm = client(fake_server.url)
    with pytest.raises(ValueError, match="non-empty list"):
        llm.chat_json([], SCHEMA)
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        llm.chat_json([{"role": "user"}], SCHEMA)
    with pytest.raises(ValueError, match="type 'object'"):
        llm.chat_json(MSGS, {"type": "array"})
    assert fake_server.chat_requests() == []


def test_concurrency_limit(fake_server):
    # The server holds every request until the test releases it: with a limit of 2, exactly
    # two requests can be in flight, however long they are held.
    active = []
    peak = []
    lock = threading.Lock()
    gate = threading.Semaphore(0)

    def behaviour(body):
        with lock:
            active.append(1)
            peak.append(len(active))
        gate.acquire(timeout=60)
        with lock:
            active.pop()
        return (200, completion(json.dumps(GOOD)))

    fake_server.behaviour = behaviour
    llm = client(fake_server.url, max_concurrency=2, schema_mode="json_object", timeout=120)
    threads = [threading.Thread(target=llm.chat_json, args=(MSGS, SCHEMA)) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(fake_server.chat_requests()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a broken limit to let a third request through (slower only hides nothing)
    assert len(fake_server.chat_requests()) == 2 and max(peak) == 2
    for _ in threads:
        gate.release()
    for t in threads:
        t.join()
    assert max(peak) == 2 and len(fake_server.chat_requests()) == 6
    assert llm.stats.snapshot()["calls"] == 6


def test_plain_chat(fake_server):
    fake_server.reply_text("hello there")
    llm = client(fake_server.url, model="m")
    assert llm.chat(MSGS) == "hello there"
    assert "response_format" not in fake_server.chat_requests()[0]
    assert fake_server.chat_requests()[0]["model"] == "m"
