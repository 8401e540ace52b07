"""Fusion in Python (pure): the SQL RRF order on hand-computed examples, the normalised-score method, the
batched scorer against fuse() + question_scores, and cross-validated tuning on synthetic gold sets."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from evaluation.fusion import CHANNELS, Candidate, Fusion, candidates_from_hits, fuse, fused_scores
from evaluation.fusion_tuning import Grid, QuestionCandidates, _Batch, describe, tune
from evaluation.metrics import question_scores
from tasks.tune import TuneOutcome


def cand(cid: int, **ranks: int) -> Candidate:
    return Candidate(cid, dict(ranks))


# rrf_k = 1: chunk 5 = 1/2 + 1/3, chunk 3 = 1/3 + 1/2 (tie -> 3 first), 9 = 1/2 (sparse only),
# 1 = 1/4 (dense only), 7 = 1/4 (lexical only; tie with 1 -> 1 first)
HAND = [cand(5, dense=1, lexical=2), cand(3, dense=2, lexical=1), cand(7, lexical=3), cand(1, dense=3),
        cand(9, sparse=1)]


def test_rrf_matches_hand_computed_order_with_ties_and_missing_channels() -> None:
    f = Fusion("rrf", {"dense": 1, "lexical": 1, "sparse": 1}, rrf_k=1)
    assert fuse(HAND, f, 10) == [3, 5, 9, 1, 7]
    assert fuse(HAND, f, 2) == [3, 5]
    assert fuse(HAND, f, 0) == []
    s = fused_scores(HAND, f)
    assert s[3] == s[5] == pytest.approx(1 / 2 + 1 / 3) and s[1] == s[7] == 0.25 and s[9] == 0.5
    # dense weight 2: 5 = 2/2 + 1/3, 3 = 2/3 + 1/2, then 1 = 2/4 ties 9 = 1/2 -> 1 first, 7 = 1/4
    assert fuse(HAND, replace(f, weights={"dense": 2, "lexical": 1, "sparse": 1}), 10) == [5, 3, 1, 9, 7]
    # the SQL default rrf_k = 60 and a missing weight = 1
    assert fuse(HAND, Fusion(weights={"dense": 1, "lexical": 1}), 10) == [3, 5, 9, 1, 7]


def test_weight_zero_ignores_the_channel() -> None:
    f = Fusion("rrf", {"dense": 1, "lexical": 1, "sparse": 0}, rrf_k=1)
    assert fuse(HAND, f, 10) == [3, 5, 1, 7]  # 9 is only in sparse: not a result at all, as in SQL
    lexical_only = Fusion("rrf", {"dense": 0, "lexical": 1, "sparse": 0}, rrf_k=1)
    assert fuse(HAND, lexical_only, 10) == [3, 5, 7]
    no_dense = [Candidate(c.chunk_id, {k: v for k, v in c.ranks.items() if k != "dense"}) for c in HAND]
    no_dense = [c for c in no_dense if c.ranks]
    g = Fusion("rrf", {"dense": 0, "lexical": 1, "sparse": 1}, rrf_k=7)
    assert fuse(HAND, g, 10) == fuse(no_dense, g, 10)


def random_candidates(rng: random.Random, n: int = 40, channels: tuple[str, ...] = CHANNELS,
                      pool: int = 25) -> list[Candidate]:
    ids = rng.sample(range(1, 10_000), n)
    ranks: dict[int, dict[str, int]] = {i: {} for i in ids}
    scores: dict[int, dict[str, float]] = {i: {} for i in ids}
    for ch in channels:
        for r, i in enumerate(rng.sample(ids, pool), start=1):
            ranks[i][ch] = r
            scores[i][ch] = round(1.0 - r / 50 + rng.choice([0.0, 0.01]), 2)  # repeats: ties in the score
    return [Candidate(i, ranks[i], scores[i]) for i in ids if ranks[i]]


def test_scaling_all_weights_keeps_the_order() -> None:
    rng = random.Random(7)
    for _ in range(30):
        cands = random_candidates(rng)
        for method in ("rrf", "score"):
            f = Fusion(method, {"dense": 1.0, "lexical": 0.5, "sparse": 2.0}, rrf_k=rng.choice([1, 10, 60]))
            order = fuse(cands, f, 100)
            for factor in (0.25, 2.0, 4.0):
                scaled = {c: w * factor for c, w in f.weights.items()}
                assert fuse(cands, replace(f, weights=scaled), 100) == order
    f = Fusion("rrf", {"dense": 2, "lexical": 1, "sparse": 1}, rrf_k=1)
    assert fuse(HAND, replace(f, weights={"dense": 6, "lexical": 3, "sparse": 3}), 10) == fuse(HAND, f, 10)


def test_score_method_hand_example() -> None:
    cands = [Candidate(1, {"dense": 1, "lexical": 3}, {"dense": 0.75, "lexical": 2.0}),
             Candidate(2, {"dense": 3}, {"dense": 0.25}),
             Candidate(3, {"lexical": 1}, {"lexical": 4.0}),
             Candidate(4, {"dense": 2, "lexical": 2}, {"dense": 0.5, "lexical": 3.0})]
    # dense: 0.75 -> 1, 0.25 -> 0, 0.5 -> 0.5; lexical: 2 -> 0, 4 -> 1, 3 -> 0.5
    f = Fusion("score", {"dense": 1, "lexical": 1, "sparse": 1})
    assert fused_scores(cands, f) == {1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0}
    assert fuse(cands, f, 10) == [1, 3, 4, 2]  # three-way tie by chunk id; 2 scores 0 but is a result
    assert fuse(cands, replace(f, weights={"dense": 2, "lexical": 1, "sparse": 1}), 10) == [1, 4, 3, 2]
    # a channel with a single candidate normalises it to 1.0: chunk 2 = 0 + 1
    with_sparse = [*cands[:1], Candidate(2, {"dense": 3, "sparse": 1}, {"dense": 0.25, "sparse": -3.0}),
                   *cands[2:]]
    assert fused_scores(with_sparse, f)[2] == 1.0 and fuse(with_sparse, f, 10) == [1, 2, 3, 4]
    assert fuse(with_sparse, replace(f, weights={"dense": 1, "lexical": 1, "sparse": 0}), 10) == [1, 3, 4, 2]
    with pytest.raises(ValueError, match="score"):
        fuse([cand(1, dense=1)], f, 10)


def test_fusion_round_trip_and_validation() -> None:
    f = Fusion("score", {"dense": 0.5, "lexical": 1, "sparse": 0}, rrf_k=20)
    assert Fusion.from_dict(f.as_dict()) == f
    assert Fusion.from_dict({"weights": {"dense": 2}}).weights == {"dense": 2.0, "lexical": 1.0, "sparse": 1.0}
    assert Fusion() == Fusion("rrf", {"dense": 1, "lexical": 1, "sparse": 1}, 60)
    row = {"id": 3, "method": "rrf", "weights": {"lexical": 2.0}, "rrf_k": 20.0, "goldset": "g", "folds": 5}
    assert Fusion.from_dict(row) == Fusion("rrf", {"dense": 1, "lexical": 2, "sparse": 1}, 20)  # a fusions row
    for bad in ({"method": "max"}, {"weights": {"bm25": 1}}, {"weights": {"dense": -1}}, {"rrf_k": 0},
                {"rrf_k": float("nan")}):
        with pytest.raises(ValueError):
            Fusion.from_dict(bad)
    with pytest.raises(ValueError):
        fuse([cand(1, dense=1), cand(1, lexical=1)], Fusion(), 10)


def test_candidates_from_hits() -> None:
    hit = SimpleNamespace(chunk_id=4, dense_rank=2, dense_score=0.8, lexical_rank=None, lexical_score=None,
                          sparse_rank=1, sparse_score=3.5)
    assert candidates_from_hits([hit]) == [Candidate(4, {"dense": 2, "sparse": 1}, {"dense": 0.8, "sparse": 3.5})]


def random_questions(seed: int, n: int, channels: tuple[str, ...] = CHANNELS) -> list[QuestionCandidates]:
    rng = random.Random(seed)
    out = []
    for q in range(n):
        cands = random_candidates(rng, channels=channels)
        ids = [c.chunk_id for c in cands]
        units = [set(rng.sample(ids, rng.choice([1, 2]))) for _ in range(rng.choice([0, 1, 2, 3]))]
        units += [{10_001}] if q % 5 == 0 else []  # a gold unit no candidate covers
        out.append(QuestionCandidates(f"q{q}", cands, units))
    return out


def test_batched_scores_equal_fuse_and_question_scores() -> None:
    qs = random_questions(3, 40)
    batch = _Batch(qs)
    fusions = [*Grid().fusions(CHANNELS, Fusion())[::17], Fusion(), Fusion("score"),
               Fusion("rrf", {"dense": 0, "lexical": 0, "sparse": 1}, 5)]
    for f in fusions:
        got = batch.scores(f)
        for qi, q in enumerate(qs):
            s = question_scores(fuse(q.candidates, f, 10), q.relevant)
            assert got[qi].tolist() == [s["recall@10"], s["mrr@10"]], (f, q.question_id)


def informative_set(n: int = 80, seed: int = 1) -> list[QuestionCandidates]:
    """Lexical ranks the one relevant chunk in its top 3; dense ranks it at random (pure noise)."""
    rng = random.Random(seed)
    out = []
    for q in range(n):
        ids = rng.sample(range(1, 10_000), 30)
        lex = [ids[0], *rng.sample(ids[1:], 29)]
        lex.insert(rng.randrange(3), lex.pop(0))
        dense = rng.sample(ids, 30)
        cands = [Candidate(i, {"dense": dense.index(i) + 1, "lexical": lex.index(i) + 1},
                           {"dense": rng.random(), "lexical": 10.0 - lex.index(i)}) for i in ids]
        out.append(QuestionCandidates(f"q{q:03d}", cands, [{ids[0]}]))
    return out


def test_tune_drops_a_noise_channel_and_beats_the_default_held_out() -> None:
    qs = informative_set()
    res = tune(qs, default=Fusion(), channels=CHANNELS, folds=5, seed=0)
    assert res.best.weights["sparse"] == 0.0  # no candidate has it: fixed at 0, not searched
    assert res.best.weights["dense"] <= 0.25 * res.best.weights["lexical"]
    assert res.best.weights["lexical"] > 0 and res.changed
    assert res.held_out["objective"] >= res.default_scores["objective"]
    assert res.held_out_gain > res.gain_se > 0 and not res.kept_default  # a clear held-out gain: adopted
    assert res.held_in["objective"] >= res.held_out["objective"] - 1e-12
    assert res.held_out["recall@10"] == 1.0  # lexical alone always has the relevant chunk in its top 3
    assert len(res.per_fold) == 5 and sum(p["test"] for p in res.per_fold) == len(qs)
    assert res.grid_size == 1 + 7 * 7 - 1  # default + 7 weight vectors x (6 rrf_k + score), default deduped
    text = describe(res)
    assert "held-out" in text and res.best.label() in text and "objective" in text


def test_the_default_stays_when_tuning_gains_nothing_held_out() -> None:
    """Ranks at random in both channels: a fold always finds some point that wins on its training questions,
    but the folds' choices gain nothing on the questions they did not see, so the default is kept."""
    qs = random_questions(2, 40, channels=("dense", "lexical"))
    res = tune(qs, default=Fusion(), channels=CHANNELS, folds=5, seed=0, never_below=False)
    assert any(p["fusion"] != res.best.as_dict() for p in res.per_fold)  # the folds did choose other points
    assert res.held_out_gain <= res.gain_se and res.kept_default and not res.changed and not res.default_below
    assert "within one standard error, the default is kept" in describe(res)
    assert json.loads(json.dumps(TuneOutcome(res, None).as_dict()))["kept_default"] is True  # the CLI's report
    assert res.best == Fusion("rrf", {"dense": 1, "lexical": 1, "sparse": 0}, 60)  # sparse: no candidate has it


def test_tune_is_deterministic_and_independent_of_input_order() -> None:
    qs = random_questions(5, 30, channels=("dense", "lexical"))
    a = tune(qs, default=Fusion(), channels=CHANNELS, folds=3, seed=4)
    assert tune(qs, default=Fusion(), channels=CHANNELS, folds=3, seed=4) == a
    shuffled = qs[:]
    random.Random(0).shuffle(shuffled)
    assert tune(shuffled, default=Fusion(), channels=CHANNELS, folds=3, seed=4) == a
    other = tune(qs, default=Fusion(), channels=CHANNELS, folds=3, seed=5)
    assert [p["test"] for p in other.per_fold] == [10, 10, 10]


def test_tune_with_a_single_channel_returns_that_channel_and_keeps_the_default() -> None:
    qs = random_questions(2, 20, channels=("lexical",))
    res = tune(qs, default=Fusion(), channels=CHANNELS, folds=4)
    assert res.best.active() == ("lexical",)
    assert not res.changed  # every point ties (one channel: one order) -> the default's method and rrf_k
    assert res.best == Fusion("rrf", {"dense": 0, "lexical": 1, "sparse": 0}, 60)
    assert res.held_out == pytest.approx(res.default_scores)
    assert "same as default" in describe(res)


def test_tune_searches_only_the_given_channels() -> None:
    qs = informative_set(20)
    default = Fusion(weights={"dense": 1, "lexical": 1, "sparse": 0})
    res = tune(qs, default=default, channels=("dense",), folds=2)
    assert res.grid_size == 1 + 7  # the default + dense alone (6 rrf_k + score)
    assert res.best == default and not res.changed  # dense alone (noise) never beats the default
    res = tune(qs, default=Fusion("rrf", {"dense": 1, "lexical": 0, "sparse": 0}), channels=("lexical",), folds=2)
    assert res.best.active() == ("lexical",) and res.changed
    with pytest.raises(ValueError):
        tune(qs, default=Fusion(), channels=("sparse",), folds=2)
    with pytest.raises(ValueError):
        tune(qs[:1], default=Fusion(), channels=CHANNELS, folds=2)


def test_tune_explicit_grid_and_missing_scores() -> None:
    qs = [QuestionCandidates(q.question_id, [Candidate(c.chunk_id, c.ranks) for c in q.candidates], q.relevant)
          for q in informative_set(20)]
    res = tune(qs, default=Fusion(), channels=CHANNELS, folds=2)  # no scores: the score method is left out
    assert all(p["fusion"]["method"] == "rrf" for p in res.per_fold)
    grid = [Fusion("rrf", {"dense": 0, "lexical": 1, "sparse": 0}, 60)]
    res = tune(qs, default=Fusion(), channels=CHANNELS, folds=2, grid=grid)
    assert res.grid_size == 3 and res.best == grid[0]  # the default, the grid, and dense alone (the bar)
    assert np.isclose(res.held_out["recall@10"], 1.0)


def test_never_below_the_best_channel_of_each_gold_set() -> None:
    """Set a favours lexical, set b dense. A lexical-heavy fusion has the best objective overall but loses
    set b to dense alone; the constraint prefers the point that falls least below a set's best channel."""
    def question(qid: str, first: dict[str, int], second: dict[str, int]) -> QuestionCandidates:
        return QuestionCandidates(qid, [Candidate(5, first), Candidate(2, second)], [{5}])

    a1 = [question(f"a:1{i}", {"lexical": 1, "dense": 2}, {"dense": 1, "lexical": 2}) for i in range(10)]
    a2 = [question(f"a:2{i}", {"lexical": 1, "dense": 3}, {"dense": 1, "lexical": 2}) for i in range(10)]
    b = [question(f"b:{i}", {"dense": 1, "lexical": 2}, {"lexical": 1, "dense": 3}) for i in range(6)]
    heavy = Fusion("rrf", {"dense": 0.25, "lexical": 1, "sparse": 0}, 5)
    balanced = Fusion("rrf", {"dense": 0.75, "lexical": 1, "sparse": 0}, 60)
    qs = a1 + a2 + b
    loose = tune(qs, default=heavy, channels=CHANNELS, folds=2, grid=[balanced], never_below=False)
    tight = tune(qs, default=heavy, channels=CHANNELS, folds=2, grid=[balanced])
    assert loose.best == heavy and fuse(b[0].candidates, heavy, 10)[0] == 2  # loses set b
    assert tight.best == balanced
    # adopted although it gains nothing held out: the default falls below set b's best channel
    assert tight.held_out_gain <= tight.gain_se and not tight.kept_default
    assert json.loads(json.dumps(TuneOutcome(tight, None).as_dict()))["kept_default"] is False
    assert tight.default_below == "b: mrr@10 0.5000 < dense 1.0000" and tight.default_below in describe(tight)
    assert loose.default_below == ""  # not judged without the constraint
    assert all(fuse(q.candidates, balanced, 10)[0] == 5 for q in a1 + b)
