"""The language model is spelled ``slm`` across the API; the ``llm`` spelling still works for one
release (a DeprecationWarning naming the new spelling), giving both is a TypeError, and the new
spelling never warns."""

from __future__ import annotations

import copy
import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
from adapter_helpers import HashEncoder

from clag_fast import MemoryStore, StoreConfig
from clag_fast.cli import main
from clag_fast.compat.mem0 import Memory
from clag_fast.distributed.shardmap import MAP_FILE, ShardMap
from clag_fast.eval.qa import run_qa_table
from clag_fast.eval.runner import run_eval
from clag_fast.server.settings import ServeConfig
from clag_fast.slm.organizer import Organizer

TINY = Path(__file__).parent / "data" / "tiny_locomo.json"
OFF = StoreConfig(dim=8, slm="off")


def _no_warning(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    assert [w for w in caught if issubclass(w.category, DeprecationWarning)] == []
    return out


def _store(path, **kw):
    return MemoryStore.open(path, config=OFF, embedder=False, **kw)


# -- MemoryStore.open ---------------------------------------------------------------------------
def test_open_llm_warns_naming_slm_and_means_the_same(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"'llm=' is deprecated .* use 'slm='") as rec:
        s = _store(tmp_path / "s", llm=False)
    assert rec[0].filename == __file__, "the warning points at the caller's line"
    with s:
        assert s.stats()["slm"].startswith("off"), "llm=False is slm=False: vector-only"


def test_open_slm_does_not_warn(tmp_path):
    s = _no_warning(_store, tmp_path / "s", slm=False)
    with s:
        assert s.stats()["slm"].startswith("off")


def test_open_with_both_spellings_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match=r"both slm= and its deprecated spelling llm="):
        _store(tmp_path / "s", slm=False, llm=False)
    with pytest.raises(TypeError, match="both"):  # even when slm= is its default value
        _store(tmp_path / "t", slm=None, llm=False)
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists(), "nothing was created"


# -- stats() ------------------------------------------------------------------------------------
@pytest.fixture()
def stats(tmp_path):
    with _store(tmp_path / "s", slm=False) as s:
        s.add_many(["a", "b", "c"], embeddings=np.eye(3, 8, dtype=np.float32))
        yield s.stats()


def test_stats_new_keys_do_not_warn(stats):
    usage = _no_warning(stats.__getitem__, "slm_usage")
    assert "organizer_errors" in usage
    assert _no_warning(stats.__getitem__, "slm_calls_per_memory") == 0.0
    assert _no_warning(stats.get, "slm_pending") == {"routes": 0, "jobs": 0}
    assert not any(k.startswith("llm") for k in stats), "the old names are not stored keys"


@pytest.mark.parametrize("old, new", [("llm", "slm_usage"), ("llm_calls_per_memory", "slm_calls_per_memory")])
def test_stats_old_keys_read_with_a_warning(stats, old, new):
    with pytest.warns(DeprecationWarning, match=rf"'{old}' is deprecated .* use '{new}'"):
        assert stats[old] == stats[new]
    with pytest.warns(DeprecationWarning):
        assert stats.get(old) == stats[new]
    with pytest.warns(DeprecationWarning):
        assert old in stats
    assert stats.get("no such key", 7) == 7
    with pytest.raises(KeyError):
        stats["no such key"]


def test_stats_is_still_a_plain_dict(stats):
    plain = dict(stats)
    assert stats == plain and type(plain) is dict
    assert json.loads(json.dumps(stats)) == json.loads(json.dumps(plain))
    assert "llm" not in json.dumps(stats)
    assert type(pickle.loads(pickle.dumps(stats))) is dict and copy.deepcopy(stats) == plain


def test_client_stats_read_old_keys_with_a_warning(tmp_path):
    from fastapi.testclient import TestClient

    from clag_fast.client import Client
    from clag_fast.server.app import create_app

    app = create_app(ServeConfig(store=tmp_path / "s", embedder=False, dim=8, slm="off"))
    with TestClient(app) as http:
        client = Client("http://testserver", http=http)
        st = _no_warning(client.stats)
        assert "slm_usage" in st and "llm" not in dict(st), "the service answers the new names"
        with pytest.warns(DeprecationWarning, match=r"Client.stats\(\): 'llm' is deprecated"):
            assert st["llm"] == st["slm_usage"]


# -- the CLI ------------------------------------------------------------------------------------
def test_cli_llm_option_is_a_hidden_alias_that_warns(tmp_path, capsys):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(["The user is allergic to shellfish.", "The flight leaves on April 10."]))
    store = str(tmp_path / "store")
    assert main(["ingest", str(facts), "--store", store, "--llm", "off"]) == 0
    captured = capsys.readouterr()
    assert "added 2 memories" in captured.out
    assert "--llm is deprecated and will be removed in the next release; use --slm" in captured.err
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    helptext = capsys.readouterr().out
    assert "--slm" in helptext and "--llm" not in helptext, "the alias is hidden from --help"
    assert main(["search", "what is the user allergic to?", "--store", store, "--slm", "off", "--json"]) == 0
    captured = capsys.readouterr()
    assert "deprecated" not in captured.err
    assert json.loads(captured.out)[0]["text"] == "The user is allergic to shellfish."


# -- eval functions, adapters, settings ---------------------------------------------------------
def test_run_eval_llm_warns_and_reaches_the_same_argument():
    # The value goes where slm= goes: an unusable one is refused, naming the new spelling.
    with pytest.warns(DeprecationWarning, match=r"run_eval\(\): 'llm=' is deprecated"):
        with pytest.raises(ValueError, match="slm must be None, 'managed' or a server URL, got 42"):
            run_eval(TINY, out_dir=None, embedder="hash", progress=False, llm=42)


def test_eval_report_old_keys_read_with_a_warning():
    rep = _no_warning(run_eval, TINY, out_dir=None, embedder="hash", progress=False, slm=None, plots=False)
    org = rep["organisation"]["vector"]
    assert org["slm_calls_per_memory"] == 0 and "llm_calls_per_memory" not in json.dumps(rep)
    with pytest.warns(DeprecationWarning, match=r"'llm_errors' is deprecated .* use 'slm_errors'"):
        assert org["llm_errors"] == org["slm_errors"] == 0


def test_run_qa_table_with_both_spellings_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match=r"run_qa_table\(\) got both slm= and"):
        run_qa_table(TINY, out_dir=tmp_path / "qa", slm="managed", llm="managed")
    assert not (tmp_path / "qa").exists()


def test_mem0_memory_llm_warns_and_works(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"Memory\(\): 'llm=' is deprecated"):
        m = Memory(path=tmp_path / "m", embedder=HashEncoder(), llm=False)
    try:
        m.add("I am allergic to peanuts", user_id="u", infer=False)
        assert [r["memory"] for r in m.get_all(user_id="u")["results"]] == ["I am allergic to peanuts"]
    finally:
        m.close()
    _no_warning(Memory, path=tmp_path / "n", embedder=HashEncoder(), slm=False).close()


def test_serve_config_and_organizer_keep_the_old_attribute():
    with pytest.warns(DeprecationWarning, match=r"ServeConfig\(\): 'llm=' is deprecated"):
        c = ServeConfig(store="s", llm="managed")
    assert c.slm == "managed" and c == ServeConfig(store="s", slm="managed")
    with pytest.warns(DeprecationWarning, match=r"'\.llm' is deprecated .* use '\.slm'"):
        assert c.llm == "managed"
    with pytest.raises(TypeError, match="both"):
        ServeConfig(store="s", slm="off", llm="off")
    with pytest.warns(DeprecationWarning):
        org = Organizer(llm=None)
    assert org.slm is None and _no_warning(Organizer, slm=None).slm is None


def test_shard_layout_llm_warns_and_old_layout_files_load(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"create_or_load\(\): 'llm=' is deprecated"):
        layout = ShardMap.create_or_load(tmp_path / "a", 2, dim=8, llm="managed")
    assert layout.slm == "managed"
    doc = json.loads((tmp_path / "a" / MAP_FILE).read_text())
    assert doc["slm"] == "managed" and "llm" not in doc
    # A layout file that spells the setting "llm" still loads, unchanged.
    del doc["slm"]
    doc["llm"] = "http://127.0.0.1:8080"
    (tmp_path / "a" / MAP_FILE).write_text(json.dumps(doc))
    assert _no_warning(ShardMap.load, tmp_path / "a").slm == "http://127.0.0.1:8080"
