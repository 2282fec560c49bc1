"""Label measures (eval/labels), labels in the store with a misbehaving or real SLM, the
cluster map and the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from llm_fixtures import completion, dead_url, fake_server, managed_server, real_llm  # noqa: F401

from clag_fast.cli import main
from clag_fast.config import SLMConfig, StoreConfig
from clag_fast.labels.measures import ClusterLabel, groundedness, is_copy, is_generic, measure, self_misses
from clag_fast.slm.client import LLMClient
from clag_fast.slm.organizer import ClusterBrief, Organizer
from clag_fast.store import MemoryStore
from clag_fast.labels import keyphrases as kp
from clag_fast.store.cluster_phrases import cluster_phrases

DIM = 16
GROUPS = {
    "hotel": ["We booked the Kyoto hotel near Kamogawa for April 19.",
              "The Kyoto hotel has a kitchen and a view of the Kamogawa.",
              "Kamogawa Residence: Kyoto hotel with kitchen, check-in April 19.",
              "Is the Kyoto hotel kitchen big enough for two?"],
    "rail": ["Is the JR Pass worth it for our trip?",
             "The JR Pass covers the Shinkansen from Tokyo to Kyoto.",
             "Without the JR Pass the Shinkansen costs about 14,000 yen each way.",
             "No JR Pass then, we take single Shinkansen tickets."],
    "food": ["Maya wants ramen in Osaka on our trip.",
             "Osaka ramen shops near Dotonbori open late.",
             "Ramen with a vegetarian broth, if Osaka has one.",
             "The best Osaka ramen is in Dotonbori, they say."],
}


def bag_embed(texts: list[str]) -> np.ndarray:
    """A stand-in embedder we own: content words hashed into DIM buckets, unit length."""
    out = np.zeros((len(texts), DIM), np.float32)
    for i, t in enumerate(texts):
        for w in kp.content_words(t):
            out[i, sum(map(ord, w)) % DIM] += 1.0
    n = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(n == 0, 1, n)


def synthetic_store(path, slm, slm_config: SLMConfig | None = None, copies: int = 3, embedder=False) -> MemoryStore:
    """A store of the three GROUPS, each on its own axis (vectors passed in; no embedder
    unless one is given)."""
    rng = np.random.default_rng(1)
    texts, vecs = [], []
    for g, members in enumerate(GROUPS.values()):
        for k in range(copies):
            for t in members:
                texts.append(f"{t} #{k}")
                v = np.eye(DIM, dtype=np.float32)[g] + 0.05 * rng.standard_normal(DIM).astype(np.float32)
                vecs.append(v / np.linalg.norm(v))
    cfg = StoreConfig(dim=DIM, min_memories_to_cluster=10, organize_every=0,
                      slm=slm_config or SLMConfig(profile_min_size=2, background=False))
    s = MemoryStore.open(path, config=cfg, embedder=embedder, slm=slm)
    s.add_many(texts, embeddings=np.stack(vecs))
    return s


class AxisEmbedder:
    """An embedder given to a store: a text lands on the axis of the GROUPS group whose
    members share most of its words (the last axis when none does), so label phrases can be
    ranked in the space of ``synthetic_store``'s vectors."""

    dim = DIM
    name = "axes"

    def encode(self, texts: list[str]) -> np.ndarray:
        words = [set(re.findall(r"\w+", " ".join(m).lower())) for m in GROUPS.values()]
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            shared = [len(set(re.findall(r"\w+", t.lower())) & w) for w in words]
            out[i, int(np.argmax(shared)) if max(shared) > 0 else DIM - 1] = 1.0
        return out


# ----------------------------------------------------------------------------- the measures


def test_copy_is_an_eight_word_run_of_a_member():
    members = ["Agent: Hotel Kasumi Shinjuku, conf. HK-220931, check-in April 3, two nights."]
    assert is_copy("Hotel Kasumi Shinjuku, conf. HK-220931, check-in April 3", members)
    assert not is_copy("Hotel Kasumi Shinjuku · HK-220931 · April 3", members)
    assert not is_copy("Hotel Kasumi Shinjuku conf", members)  # shorter than the run


def test_groundedness_counts_label_words_found_in_members():
    members = ["We booked the Kyoto hotel.", "The hotel kitchen is small."]
    assert groundedness("Kyoto hotel · kitchen", [], members) == 1.0
    assert groundedness("Morning Shoplifters", ["kyoto", "hotel"], members) == 0.5
    assert groundedness("", [], members) == 1.0  # claims nothing


def test_measure_on_hand_built_clusters():
    clusters = [
        ClusterLabel(1, "Kyoto hotel · kitchen", ["Kamogawa"], GROUPS["hotel"]),
        ClusterLabel(2, "Tropical Islands", [], GROUPS["rail"]),       # invented
        ClusterLabel(3, "The best Osaka ramen is in Dotonbori, they say", [], GROUPS["food"]),  # a copy
        ClusterLabel(4, kp.NEUTRAL_LABEL, [], ["ok", "ok!"]),          # neutral: no claim
        ClusterLabel(5, "Kyoto hotel", [], ["one member"]),            # one member: not scored
    ]
    centres = bag_embed([" ".join(c.members) for c in clusters])
    q = measure(clusters, centres, bag_embed)
    assert q["clusters"] == 4 and q["neutral"] == 1
    assert q["copies"] == 1 and q["copy_rate"] == 0.25
    assert q["grounded"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    # "Tropical Islands" shares no word with the rail cluster: it cannot point at its centre.
    assert q["self_at_1"] == pytest.approx(2 / 3)
    assert "self_at_1" not in measure(clusters, centres, None)
    with pytest.raises(ValueError, match="5 clusters but 2 centres"):
        measure(clusters, centres[:2], None)


# Labels written by the keyphrase selection before it knew topic phrases, on the demo's trip
# conversation; read one by one, the first list names no topic.
TALK_LABELS = ["bring · tonight", "Perfect · card", "Ready", "morning", "pass", "Safe", "No worries", "Ready to",
               "Can't wait to hear", "You rock", "Thanks so much", "Wednesday April 14", "2 years", "April", ""]
TOPIC_LABELS = ["vegetarian kaiseki", "JPY · journeys", "forecast · weather", "Kamogawa Residence", "HK-220931",
                "allergy · epinephrine · doctor's", "Ghibli Museum tickets · April 11", "passport renewal", "東京",
                "Cash · JPY", "Riverside · Hotel"]


def test_a_generic_label_is_one_whose_words_are_all_common_or_not_nouns():
    assert [t for t in TALK_LABELS if not is_generic(t)] == []
    assert [t for t in TOPIC_LABELS if is_generic(t)] == []
    assert not any(is_generic(n) for n in kp.NEUTRAL_LABELS)  # no claim: counted as neutral
    # The cut is a number of words: "hotel" (the 1,190th) is common among the first 2,000.
    assert not is_generic("hotel") and is_generic("hotel", common=2000)
    with pytest.raises(ValueError, match="5000"):
        is_generic("hotel", common=6000)


def test_measure_counts_generic_labels_of_clusters_with_two_members_or_more():
    members = GROUPS["hotel"] + GROUPS["rail"] + GROUPS["food"]
    clusters = [ClusterLabel(i, t, [], members) for i, t in enumerate(TALK_LABELS[:4] + TOPIC_LABELS[:4])]
    clusters += [ClusterLabel(8, kp.NEUTRAL_SMALL_TALK, [], members), ClusterLabel(9, "morning", [], ["one"])]
    q = measure(clusters, np.eye(len(clusters), DIM, dtype=np.float32), None)
    assert q["clusters"] == 9 and q["neutral"] == 1
    assert q["generic"] == 4 and q["generic_rate"] == pytest.approx(4 / 9)


def test_self_misses_name_the_labels_nearer_another_centre():
    summaries = ["Kyoto hotel · kitchen", "Kyoto hotel", "ramen · Osaka", kp.NEUTRAL_LABEL, ""]
    members = [GROUPS["hotel"], GROUPS["rail"], GROUPS["food"], ["ok", "ok!"], ["one member"]]
    centres = bag_embed([" ".join(m) for m in members])
    got = self_misses(summaries, centres, bag_embed)
    # The rail cluster's label names the hotel cluster; neutral and empty labels claim nothing.
    assert [(i, j) for i, j, _ in got] == [(1, 0)] and got[0][2] < 0
    clusters = [ClusterLabel(k, s, [], m) for k, (s, m) in enumerate(zip(summaries, members))]
    q = measure(clusters[:3], centres[:3], bag_embed)
    assert q["self_at_1"] == pytest.approx(1 - len(self_misses(summaries[:3], centres[:3], bag_embed)) / 3)
    with pytest.raises(ValueError, match="5 summaries but 2 centres"):
        self_misses(summaries, centres[:2], bag_embed)


# ----------------------------------------------------------------------------- labels in a store


def test_vector_labels_in_a_store_are_distinct_keyphrases(tmp_path):
    with synthetic_store(tmp_path / "s", slm=False, slm_config=SLMConfig(mode="off")) as s:
        s.organize()
        labels = [c.summary for c in s.clusters()]
        assert len(labels) == 3, labels
        heads = {lab.split(" · ")[0] for lab in labels}
        assert {"Kyoto hotel", "JR Pass"} <= heads and heads & {"ramen", "Osaka", "Osaka ramen"}
        q = s.label_quality()
        assert q["copies"] == 0 and q["grounded"] == 1.0 and q["neutral"] == 0


@pytest.mark.parametrize("reply", [
    "We booked the Kyoto hotel near Kamogawa for April 19.",              # free text, no JSON
    json.dumps({"groups": [["Morning Shoplifters"]] * 3}),                 # not offered
    json.dumps({"shared_topic": "Tropical Islands", "keywords": ["a"]}),   # the old form
])
def test_an_slm_answering_outside_the_schema_leaves_the_vector_label(tmp_path, fake_server, reply):  # noqa: F811
    with synthetic_store(tmp_path / "v", slm=False, slm_config=SLMConfig(mode="off")) as s:
        s.organize()
        vector_labels = sorted((c.summary, tuple(c.tags)) for c in s.clusters())
    fake_server.reply_text(reply)
    llm = LLMClient(fake_server.url, max_retries=0, schema_mode="json_object")
    with synthetic_store(tmp_path / "s", slm=llm) as s:
        s.organize()
        assert sorted((c.summary, tuple(c.tags)) for c in s.clusters()) == vector_labels
        asked = [r for r in fake_server.chat_requests() if "shared by a group" in r["messages"][0]["content"]]
        assert asked, "the SLM was asked"
        assert s.stats()["labels"]["slm"] == 0


@pytest.mark.parametrize("how", ["down", "slow"])
def test_an_slm_that_is_down_or_slow_leaves_the_vector_label(tmp_path, fake_server, how):  # noqa: F811
    with synthetic_store(tmp_path / "v", slm=False, slm_config=SLMConfig(mode="off")) as s:
        s.organize()
        vector_labels = sorted(c.summary for c in s.clusters())
    if how == "down":
        llm = LLMClient(dead_url(), max_retries=0, schema_mode="json_object")
    else:
        fake_server.behaviour = lambda body: (200, completion(json.dumps({"groups": [["JR Pass"]]})), 2.0)
        llm = LLMClient(fake_server.url, timeout=0.2, max_retries=0, schema_mode="json_object")
    with synthetic_store(tmp_path / "s", slm=llm) as s:
        s.organize()
        assert sorted(c.summary for c in s.clusters()) == vector_labels


def pick_last_first(body):
    """A fake SLM's profile answer: for each group, its last offered phrase then its first."""
    groups = body["response_format"]["schema"]["properties"].get("groups", {}).get("prefixItems", [])
    return 200, completion(json.dumps({"groups": [[g["items"]["enum"][-1], g["items"]["enum"][0]]
                                                  for g in groups]}))


def profile_requests(server) -> list[dict]:
    return [r for r in server.chat_requests() if "shared by a group" in r["messages"][0]["content"]]


def test_an_slm_pick_becomes_the_label(tmp_path, fake_server):  # noqa: F811
    fake_server.behaviour = pick_last_first
    llm = LLMClient(fake_server.url, max_retries=0, schema_mode="json_object")
    with synthetic_store(tmp_path / "s", slm=llm) as s:
        s.organize()
        asked = profile_requests(fake_server)
        assert len(asked) == 1  # three clusters, one call (SLMConfig.profile_batch)
        enums = [g["items"]["enum"] for g in asked[0]["response_format"]["schema"]["properties"]["groups"]["prefixItems"]]
        assert len(enums) == 3 and all(len(e) >= 2 and len(set(e)) == len(e) for e in enums)
        assert {c.summary for c in s.clusters()} == {f"{e[-1]} · {e[0]}" for e in enums}
        assert s.stats()["labels"]["slm"] == 3 and s.stats()["slm_usage"]["profile_calls"] == 1


def test_the_slm_is_not_asked_for_a_cluster_only_the_wide_look_named(tmp_path, fake_server, monkeypatch):  # noqa: F811
    # As if the wide look had found the label of one cluster (a chat cluster no topic phrase
    # names) and the first look those of the other two: the SLM chooses for the two only.
    wide: list[int] = []

    def by_distinctness(found, ids, centres, embed, top=8):
        if not wide:
            wide.append(min(found))
        for c, ph in found.items():
            ph.wide = c == wide[0]
        return {c: 0.1 for c in found}

    monkeypatch.setattr(kp, "by_distinctness", by_distinctness)
    fake_server.behaviour = pick_last_first
    llm = LLMClient(fake_server.url, max_retries=0, schema_mode="json_object")
    # An embedder for the store's space: the looks that embed phrases run only with one.
    with synthetic_store(tmp_path / "s", slm=llm, embedder=AxisEmbedder()) as s:
        s.organize()
        asked = profile_requests(fake_server)
        assert len(asked) == 1
        assert len(asked[0]["response_format"]["schema"]["properties"]["groups"]["prefixItems"]) == 2
        assert s.stats()["labels"]["slm"] == 2
        state = s._state
        with state.lock.read():
            ph = cluster_phrases(state, [wide[0]], kp.PhraseCache())[wide[0]]
        assert {c.id: c.summary for c in s.clusters()}[wide[0]] == kp.phrases_label(ph)[0]


# ----------------------------------------------------------------------------- the map and the CLI


def test_clusters_plot_and_quality(tmp_path, capsys):
    data = tmp_path / "trip.json"
    data.write_text(json.dumps([f"{t} (note {k})" for k in range(3) for ts in GROUPS.values() for t in ts]))
    store = str(tmp_path / "s")
    assert main(["ingest", str(data), "--store", store, "--slm", "off", "--organize"]) == 0
    capsys.readouterr()
    png = tmp_path / "map.png"
    assert main(["clusters", "--store", store, "--plot", str(png), "--quality"]) == 0
    out = capsys.readouterr().out
    n = int(out.split(" clusters", 1)[0])
    assert n >= 2 and f"cluster map ({n} clusters) written to {png}" in out
    line = next(x for x in out.splitlines() if x.startswith("labels: "))
    assert "copies 0 (0.00), grounded 1.00, self@1 " in line  # the real embedder measures self@1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert main(["clusters", "--store", store, "--plot", str(tmp_path / "map.jpg")]) == 2
    assert "does not end in .png" in capsys.readouterr().err


def test_labels_are_placed_without_overlap_nearest_first():
    from clag_fast.cluster_map import place_labels

    rng = np.random.default_rng(0)
    anchors = rng.uniform(0, 300, (60, 2))  # crowded: 60 labels in 300 x 300 pixels of 1000 x 800
    boxes = np.column_stack([rng.uniform(30, 160, 60), np.full(60, 12.0)])
    spots = place_labels(anchors, boxes, (0, 0, 1000, 800), clear=np.full(60, 6.0))
    got = [(i, s) for i, s in enumerate(spots) if s is not None]
    assert len(got) == 60
    rects = [(x - boxes[i, 0] / 2, y - boxes[i, 1] / 2, x + boxes[i, 0] / 2, y + boxes[i, 1] / 2) for i, (x, y) in got]
    for a0, b0, a1, b1 in rects:
        assert 0 <= a0 and 0 <= b0 and a1 <= 1000 and b1 <= 800
    for j, r in enumerate(rects):
        for q in rects[j + 1:]:
            assert not (r[0] < q[2] and q[0] < r[2] and r[1] < q[3] and q[1] < r[3]), (r, q)
    # The first label sits on its anchor; later ones move away, but not beyond the crowd's reach.
    assert spots[0] == tuple(anchors[0])
    assert max(np.hypot(*(np.array(s) - anchors[i])) for i, s in got) < 700
    # A box bigger than the bounds fits nowhere.
    assert place_labels(np.array([[5.0, 5.0]]), np.array([[50.0, 5.0]]), (0, 0, 10, 10)) == [None]


def test_the_cluster_map_of_crowded_clusters_has_no_overlapping_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from clag_fast.cluster_map import draw_cluster_map

    rng = np.random.default_rng(1)
    base = rng.standard_normal(DIM).astype(np.float32)
    texts, vecs = [], []
    words = ["Kamogawa Residence", "JR Pass", "vegetarian kaiseki", "Ghibli Museum", "Suica card", "ryokan dinner",
             "passport renewal", "takkyubin luggage", "Fushimi Inari", "Osaka Castle", "eSIM plan", "Nishiki Market"]
    for g, w in enumerate(words * 2):
        axis = base + 0.6 * rng.standard_normal(DIM).astype(np.float32)  # every centre near the others
        for k in range(4):
            v = axis + 0.05 * rng.standard_normal(DIM).astype(np.float32)
            texts.append(f"{w} note {g} {k}")
            vecs.append(v / np.linalg.norm(v))
    cfg = StoreConfig(dim=DIM, min_memories_to_cluster=20, organize_every=0, target_cluster_size=4, slm="off")
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=False) as s:
        s.add_many(texts, embeddings=np.stack(vecs))
        s.organize()
        fig = draw_cluster_map(s)
        n_clusters = len(s.clusters())
    import matplotlib.pyplot as plt

    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == n_clusters >= 12
    for j, a in enumerate(boxes):
        for b in boxes[j + 1:]:
            assert not a.overlaps(b), (a, b)
    title = ax.get_title(loc="left")
    assert "principal components" in title and "area" in title and "colour" in title
    assert ax.get_legend() is not None
    plt.close(fig)


@pytest.mark.slow
def test_the_demo_writes_the_cluster_map_and_reports_label_quality(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--slm", "off"]) == 0
    out = capsys.readouterr().out
    png = tmp_path / "clag_fast_demo_clusters.png"
    assert f"clusters) written to {png}" in out and png.read_bytes()[:4] == b"\x89PNG"
    line = next(x for x in out.splitlines() if x.startswith("labels: "))
    assert "copies 0 (0.00), grounded 1.00, self@1 " in line
    # No cluster line shows a member sentence: labels are keyphrases (at most six words).
    table = out.split("summary | tags", 1)[1].split("\n?", 1)[0]
    for row in table.strip().splitlines()[:-1]:
        summary = row.split(None, 3)[3].rsplit(" | ", 1)[0]
        assert len(summary.replace(" · ", " ").split()) <= 6 or summary.startswith("misc:"), row


# ----------------------------------------------------------------------------- the real SLM


@pytest.mark.slm
@pytest.mark.slow
def test_real_smollm2_chooses_its_label_among_the_candidates(real_llm):  # noqa: F811
    org = Organizer(real_llm)
    briefs = []
    for i, members in enumerate(GROUPS.values()):
        phrases = kp.rank([kp.extract(t) for t in members])
        briefs.append(ClusterBrief(i, examples=members, size=len(members), candidates=phrases.phrases(8)))
    out = org.write_profiles(briefs)
    assert org.errors == 0, org.stats()
    assert set(out) == {0, 1, 2}
    for b in briefs:
        picked = out[b.id].summary.split(" · ")
        assert set(picked) <= set(b.candidates) and len(set(picked)) == len(picked)
        assert groundedness(out[b.id].summary, out[b.id].tags, b.examples) == 1.0
        assert not is_copy(out[b.id].summary, b.examples)
