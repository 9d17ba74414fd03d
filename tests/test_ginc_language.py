"""GINC generation: structure, determinism, sampling statistics, and Bayes-optimal labels vs brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dp_icl_plugin.errors import ConfigurationError
from dp_icl_plugin.ginc.language import GincConfig, GincLanguage, symbol_names
from dp_icl_plugin.ginc.prompts import bayes_optimal_labels, pta_split, sample_icl_prompts

LANGUAGE = GincLanguage(GincConfig(n_symbols=150, seed=0))
TINY = GincConfig(n_symbols=8, n_hmms=3, n_pretrain_hmms=2, n_entities=2, n_properties=3, seed=5)


def test_symbol_names_follow_the_paper():
    names = symbol_names(150)
    assert names[:3] == ["/", "a", "b"] and names[26] == "z" and names[27:30] == ["ab", "ac", "ad"]
    assert len(names) == len(set(names)) == 150
    assert symbol_names(50)[-1] == names[49]
    with pytest.raises(ConfigurationError):
        symbol_names(1 + 26 + 26 * 25 + 1)


def test_structure_of_the_hmms():
    lang, c = LANGUAGE, LANGUAGE.config
    assert lang.emission_table.shape == (c.n_entities, c.n_properties)
    assert (lang.emission_table[:, 0] == 0).all() and (lang.emission_table[:, 1:] > 0).all()
    # 90 independent uniform draws from 149 symbols collide: about 67.5 distinct (sd ≈ 3.5)
    assert 55 <= len(np.unique(lang.emission_table[:, 1:])) <= 80
    assert np.allclose(lang.entity_transition.sum(axis=1), 1) and (np.diag(lang.entity_transition) >= 0.9).all()
    assert np.allclose(lang.property_transitions.sum(axis=2), 1)
    assert lang.property_transitions.shape == (c.n_hmms, c.n_properties, c.n_properties)
    assert not np.allclose(lang.property_transitions[0], lang.property_transitions[1])
    # temperature 0.1 over uniform logits: a few permutations share each row, none takes all of it
    assert 0.3 < np.median(lang.property_transitions.max(axis=2)) < 0.99
    # temperature 10: near-uniform starts
    starts = lang.start_distributions
    assert np.allclose(starts.sum(axis=1), 1) and starts.max() / starts.min() < 3
    full = lang.transition(3)
    assert full.shape == (100, 100) and np.allclose(full.sum(axis=1), 1)
    assert np.isclose(full[2 * 10 + 4, 7 * 10 + 1], lang.entity_transition[2, 7] * lang.property_transitions[3, 4, 1])


def test_the_language_is_a_function_of_its_config():
    again = GincLanguage(GincConfig(n_symbols=150, seed=0))
    other = GincLanguage(GincConfig(n_symbols=150, seed=1))
    assert np.array_equal(again.emission_table, LANGUAGE.emission_table)
    assert np.array_equal(again.property_transitions, LANGUAGE.property_transitions)
    assert not np.array_equal(other.emission_table, LANGUAGE.emission_table)
    assert GincConfig.from_dict(LANGUAGE.config.to_dict()) == LANGUAGE.config
    with pytest.raises(ConfigurationError, match="unknown"):
        GincConfig.from_dict({"n_symbols": 50, "colour": "red"})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_symbols": 1},
        {"n_pretrain_hmms": 11},
        {"n_properties": 1},
        {"entity_stay": 1.5},
        {"transition_temperature": 0.0},
        {"seed": -1},
        {"n_symbols": 10_000},
    ],
)
def test_bad_configs_are_refused(kwargs):
    with pytest.raises(ConfigurationError):
        GincConfig(**kwargs)


def test_documents_shapes_determinism_and_concepts():
    docs, concepts = LANGUAGE.sample_documents(40, 500, np.random.default_rng(7))
    again, _ = LANGUAGE.sample_documents(40, 500, np.random.default_rng(7))
    assert docs.shape == (40, 500) and docs.dtype == np.int64
    assert np.array_equal(docs, again)
    assert set(concepts) <= set(range(5)) and len(set(concepts)) > 1
    assert docs.min() >= 0 and docs.max() < 150
    # every token is an emission of some state, and "/" appears about once per cycle of properties
    assert set(np.unique(docs)) <= set(LANGUAGE.emission.tolist())
    assert 0.03 < (docs == 0).mean() < 0.3


def test_sampled_transitions_match_the_matrices():
    """Empirical property and entity transitions of one concept, from 400k steps, within 0.01."""
    rng = np.random.default_rng(3)
    n, length, concept = 2000, 200, 2
    starts = rng.integers(0, LANGUAGE.n_states, size=n)
    paths = LANGUAGE.sample_states(np.full(n, concept), starts, length, rng)
    entity, prop = np.divmod(paths, 10)
    counts = np.zeros((10, 10))
    np.add.at(counts, (prop[:, :-1].ravel(), prop[:, 1:].ravel()), 1)
    empirical = counts / counts.sum(axis=1, keepdims=True)
    assert np.abs(empirical - LANGUAGE.property_transitions[concept]).max() < 0.01
    counts = np.zeros((10, 10))
    np.add.at(counts, (entity[:, :-1].ravel(), entity[:, 1:].ravel()), 1)
    assert np.abs(counts / counts.sum(axis=1, keepdims=True) - LANGUAGE.entity_transition).max() < 0.01


def _brute_force_next_token(lang: GincLanguage, concept: int, start_property: int, prefix: list[int]) -> np.ndarray:
    """p(o_{t+1} | o_1..o_t) by summing over every hidden path of length t + 1."""
    transition, emission = lang.transition(concept), lang.emission
    start = lang.start_belief(start_property)
    joint = np.zeros(lang.config.n_symbols)
    for path in itertools.product(range(lang.n_states), repeat=len(prefix) + 1):
        p = start[path[0]]
        for a, b in itertools.pairwise(path):
            p *= transition[a, b]
        if p and all(emission[s] == o for s, o in zip(path, prefix, strict=False)):
            joint[emission[path[-1]]] += p
    return joint / joint.sum()


def test_forward_filtering_equals_brute_force_on_a_tiny_hmm():
    lang = GincLanguage(TINY)
    rng = np.random.default_rng(0)
    checked = 0
    for concept in range(TINY.n_pretrain_hmms):
        for k in (2, 3, 4):
            prompts = sample_icl_prompts(lang, n_prompts=6, n_shots=0, k=k, rng=rng)
            prompts_concepts = np.full(len(prompts), concept)
            queries = np.stack(
                [
                    lang.emission[lang.sample_states(np.array([concept]), np.array([e * 3 + s]), k, rng)[0]][: k - 1]
                    for e, s in zip(rng.integers(0, 2, 6), prompts.start_properties, strict=True)
                ]
            )
            for start, query in zip(prompts.start_properties, queries, strict=True):
                exact = lang.next_token_distribution(concept, query[None], lang.start_belief(int(start)))[0]
                brute = _brute_force_next_token(lang, concept, int(start), [int(t) for t in query])
                assert np.allclose(exact, brute, atol=1e-12)
                checked += 1
            labels = bayes_optimal_labels(lang, prompts_concepts, prompts.start_properties, queries)
            for start, query, label in zip(prompts.start_properties, queries, labels, strict=True):
                assert label == np.argmax(_brute_force_next_token(lang, concept, int(start), list(query)))
    assert checked == 36


def test_an_impossible_prefix_is_reported():
    lang = GincLanguage(TINY)
    never = sorted(set(range(TINY.n_symbols)) - set(lang.emission.tolist()))
    assert never, "the tiny language should leave some symbols unused"
    with pytest.raises(ConfigurationError, match="impossible"):
        lang.next_token_distribution(0, np.array([[never[0]]]), lang.start_belief(1))


def test_icl_prompts_layout():
    rng = np.random.default_rng(11)
    p = sample_icl_prompts(LANGUAGE, n_prompts=50, n_shots=3, k=5, rng=rng)
    ids = p.token_ids
    assert ids.shape == (50, 3 * 6 + 4) and len(p) == 50
    assert (ids[:, [5, 11, 17]] == 0).all()  # a delimiter after each example
    assert np.array_equal(ids[:, -4:], p.queries)
    # each example starts at the prompt's start property, from some entity
    first_tokens = p.examples[:, :, 0]
    for row, start in zip(first_tokens, p.start_properties, strict=True):
        assert set(row.tolist()) <= set(LANGUAGE.emission_table[:, start].tolist())
    assert set(p.concepts.tolist()) <= set(range(5)) and (p.start_properties >= 1).all()
    assert np.array_equal(p.labels, bayes_optimal_labels(LANGUAGE, p.concepts, p.start_properties, p.queries))
    again = sample_icl_prompts(LANGUAGE, n_prompts=50, n_shots=3, k=5, rng=np.random.default_rng(11))
    assert np.array_equal(again.token_ids, ids) and np.array_equal(again.labels, p.labels)
    zero = sample_icl_prompts(LANGUAGE, n_prompts=5, n_shots=0, k=10, rng=rng)
    assert zero.token_ids.shape == (5, 9)


@pytest.mark.parametrize("kwargs", [{"n_prompts": 0}, {"n_shots": -1}, {"k": 1}, {"n_shots": 1.5}])
def test_icl_prompt_arguments_are_checked(kwargs):
    args = {"n_prompts": 3, "n_shots": 1, "k": 3} | kwargs
    with pytest.raises(ConfigurationError):
        sample_icl_prompts(LANGUAGE, rng=np.random.default_rng(0), **args)


def test_pta_split_is_deduplicated_and_labelled():
    split = pta_split(LANGUAGE, k=10, n_train=1600, n_test=400, rng=np.random.default_rng(0))
    assert sorted(split) == [0, 1, 2, 3, 4]
    for concept, (train, test) in split.items():
        assert len(train) == 1600 and len(test) == 400
        texts = [e.tokens for e in train + test]
        assert len(set(texts)) == 2000 and all(len(t) == 9 for t in texts)
        assert all(e.concept == concept for e in train + test)
        sample = train[:50]
        labels = bayes_optimal_labels(
            LANGUAGE,
            np.full(50, concept),
            np.array([e.start_property for e in sample]),
            np.array([e.tokens for e in sample]),
        )
        assert labels.tolist() == [e.label for e in sample]


def test_pta_split_refuses_what_the_language_cannot_give():
    with pytest.raises(ConfigurationError, match="distinct queries"):
        pta_split(GincLanguage(TINY), k=2, n_train=50, n_test=10, rng=np.random.default_rng(0), max_draws=2000)
