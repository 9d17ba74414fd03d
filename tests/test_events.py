"""Privacy events: validation on construction, canonical serialisation, flattening and composition."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_icl_plugin.accounting import events as ev
from dp_icl_plugin.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    MozoTokenEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RDPCurveEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    atoms,
    compose,
    event_from_dict,
    event_key,
)
from dp_icl_plugin.errors import ConfigurationError, DPICLError, UnsupportedEventError

BAD_POSITIVE = [0.0, -0.5, -math.inf, math.inf, math.nan, True, "1.0", None]
BAD_OPEN_PROBABILITY = [0.0, 1.0, -1e-9, 1.5, math.nan, math.inf, True, "0.1"]
BAD_RATE = [0.0, -0.1, 1.0000001, 2.0, math.nan, math.inf, True]
BAD_COUNT = [0, -1, 2.0, 1.5, True, "3", None]
BAD_ORDER = [1.0, 0.5, -2.0, math.inf, math.nan, True]

G = GaussianEvent(1.0, neighbouring="add_remove")
POISSON = PoissonSampledEvent(0.01, G, neighbouring="add_remove")
SWR = SampledWithoutReplacementEvent(0.01, MozoTokenEvent(beta=0.1, order=8))


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


def test_error_tree() -> None:
    assert issubclass(ConfigurationError, DPICLError)
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(UnsupportedEventError, ConfigurationError)


@pytest.mark.parametrize("bad", BAD_POSITIVE)
@pytest.mark.parametrize(
    "factory",
    [
        lambda x: GaussianEvent(x, neighbouring="add_remove"),
        lambda x: GaussianEvent(1.0, sensitivity=x, neighbouring="add_remove"),
        lambda x: PureDPEvent(x, neighbouring="add_remove"),
        lambda x: ApproxDPEvent(x, 1e-5, neighbouring="add_remove"),
        lambda x: ExponentialMechanismEvent(x, neighbouring="add_remove"),
        lambda x: MozoTokenEvent(beta=x, order=4),
    ],
    ids=["gaussian.noise", "gaussian.sensitivity", "pure.eps", "approx.eps", "expmech.eps", "mozo.beta"],
)
def test_positive_finite_parameters_rejected(factory, bad) -> None:
    with pytest.raises(ConfigurationError):
        factory(bad)


@pytest.mark.parametrize("bad", BAD_OPEN_PROBABILITY)
def test_approx_dp_delta_must_lie_in_open_unit_interval(bad) -> None:
    with pytest.raises(ConfigurationError):
        ApproxDPEvent(1.0, bad, neighbouring="add_remove")


@pytest.mark.parametrize("bad", BAD_RATE)
@pytest.mark.parametrize(
    "factory",
    [lambda q: PoissonSampledEvent(q, G, neighbouring="add_remove"), lambda q: SampledWithoutReplacementEvent(q, G)],
    ids=["poisson", "without_replacement"],
)
def test_sampling_rate_must_lie_in_half_open_unit_interval(factory, bad) -> None:
    with pytest.raises(ConfigurationError):
        factory(bad)


def test_sampling_rate_one_is_allowed() -> None:
    assert PoissonSampledEvent(1.0, G, neighbouring="add_remove").sampling_rate == 1.0
    assert SampledWithoutReplacementEvent(1.0, GaussianEvent(1.0, neighbouring="replace_one")).sampling_rate == 1.0


@pytest.mark.parametrize("bad", BAD_COUNT)
def test_self_composition_count_must_be_positive_int(bad) -> None:
    with pytest.raises(ConfigurationError):
        SelfComposedEvent(G, bad)


@pytest.mark.parametrize("bad", BAD_ORDER)
def test_mozo_order_must_be_renyi_order(bad) -> None:
    with pytest.raises(ConfigurationError):
        MozoTokenEvent(beta=0.1, order=bad)


@pytest.mark.parametrize("not_an_event", [None, 1.0, "gaussian", {"type": "gaussian", "noise_multiplier": 1.0}])
def test_inner_must_be_an_event(not_an_event) -> None:
    with pytest.raises(ConfigurationError):
        PoissonSampledEvent(0.1, not_an_event, neighbouring="add_remove")
    with pytest.raises(ConfigurationError):
        SampledWithoutReplacementEvent(0.1, not_an_event)
    with pytest.raises(ConfigurationError):
        SelfComposedEvent(not_an_event, 2)
    with pytest.raises(ConfigurationError):
        ComposedEvent((G, not_an_event))
    with pytest.raises(ConfigurationError):
        compose(G, not_an_event)


@pytest.mark.parametrize(
    "inner",
    [
        PureDPEvent(1.0, neighbouring="add_remove"),
        ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove"),
        ExponentialMechanismEvent(1.0, neighbouring="add_remove"),
        MozoTokenEvent(0.1, 4),
        RDPCurveEvent((2.0,), (0.1,), neighbouring="add_remove"),
        SelfComposedEvent(G, 2),
        ComposedEvent((G, G)),
        POISSON,
    ],
    ids=lambda e: e.type_name,
)
def test_poisson_over_non_gaussian_is_unsupported(inner) -> None:
    with pytest.raises(UnsupportedEventError):
        PoissonSampledEvent(0.1, inner, neighbouring="add_remove")


def test_without_replacement_needs_an_rdp_inner_event() -> None:
    with pytest.raises(UnsupportedEventError):
        SampledWithoutReplacementEvent(0.1, ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove"))
    with pytest.raises(UnsupportedEventError):
        SampledWithoutReplacementEvent(0.1, ComposedEvent((G, ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove"))))


def test_without_replacement_cannot_wrap_a_poisson_event() -> None:
    with pytest.raises(ConfigurationError):
        SampledWithoutReplacementEvent(0.1, POISSON)
    with pytest.raises(ConfigurationError):
        SampledWithoutReplacementEvent(0.1, SelfComposedEvent(POISSON, 3))


def test_from_sizes() -> None:
    g = GaussianEvent(1.0, neighbouring=ev.REPLACE_ONE)
    e = SampledWithoutReplacementEvent.from_sizes(4, 14732, g)
    assert e.sampling_rate == 4 / 14732
    assert SampledWithoutReplacementEvent.from_sizes(5, 5, g).sampling_rate == 1.0
    for m, n in [(6, 5), (0, 5), (1, 0), (2.0, 5), (1, True)]:
        with pytest.raises(ConfigurationError):
            SampledWithoutReplacementEvent.from_sizes(m, n, g)


@pytest.mark.parametrize(
    "events",
    [
        (POISSON, SWR),
        (SelfComposedEvent(POISSON, 3), SWR),
        (
            ComposedEvent((G, POISSON)),
            SelfComposedEvent(ComposedEvent((PureDPEvent(1.0, neighbouring="replace_one"), SWR)), 2),
        ),
    ],
    ids=["flat", "self-composed", "nested"],
)
def test_mixing_neighbouring_relations_is_refused(events) -> None:
    with pytest.raises(ConfigurationError):
        ComposedEvent(events)
    with pytest.raises(ConfigurationError):
        compose(*events)


def test_compositions_take_their_childrens_one_relation() -> None:
    assert ComposedEvent((G, PureDPEvent(1.0, neighbouring="add_remove"), POISSON)).neighbouring == ev.ADD_REMOVE
    assert ComposedEvent((ApproxDPEvent(1.0, 1e-6, neighbouring="replace_one"), SWR)).neighbouring == ev.REPLACE_ONE
    assert SelfComposedEvent(POISSON, 2).neighbouring == ev.ADD_REMOVE
    assert compose(SWR, SWR).neighbouring == ev.REPLACE_ONE
    with pytest.raises(ConfigurationError, match="tagged"):
        ComposedEvent((G,), neighbouring=ev.REPLACE_ONE)


@pytest.mark.parametrize(
    "make",
    [
        lambda: GaussianEvent(1.0),
        lambda: PureDPEvent(1.0),
        lambda: ApproxDPEvent(1.0, 1e-6),
        lambda: ExponentialMechanismEvent(1.0),
        lambda: RDPCurveEvent((2.0,), (0.1,)),
        lambda: PoissonSampledEvent(0.1, G),
    ],
    ids=["gaussian", "pure", "approx", "exponential", "curve", "poisson"],
)
def test_every_atomic_event_must_name_its_relation(make) -> None:
    with pytest.raises(TypeError, match="neighbouring"):
        make()


@pytest.mark.parametrize("bad", ["swap", "", None, 3, "Add_Remove"])
def test_unknown_relations_are_refused(bad) -> None:
    with pytest.raises(ConfigurationError, match="neighbouring"):
        GaussianEvent(1.0, neighbouring=bad)


def test_replace_one_only_events_refuse_add_remove() -> None:
    with pytest.raises(UnsupportedEventError):
        MozoTokenEvent(beta=0.1, order=8.0, neighbouring=ev.ADD_REMOVE)
    with pytest.raises(UnsupportedEventError):
        SampledWithoutReplacementEvent(0.1, MozoTokenEvent(beta=0.1, order=8.0), neighbouring=ev.ADD_REMOVE)
    with pytest.raises(ConfigurationError, match="replace-one"):
        SampledWithoutReplacementEvent(0.1, G)  # an add/remove inner event cannot sit inside
    with pytest.raises(ConfigurationError, match="add_remove"):
        PoissonSampledEvent(0.1, GaussianEvent(1.0, neighbouring=ev.REPLACE_ONE), neighbouring=ev.REPLACE_ONE)


def test_poisson_relation_selects_the_accountants() -> None:
    assert ev.PRV in POISSON.supported_accountants
    replace = PoissonSampledEvent(0.01, G, neighbouring=ev.REPLACE_ONE)
    assert replace.supported_accountants == frozenset({ev.PLD, ev.RDP})


def test_empty_composition_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        ComposedEvent(())
    with pytest.raises(ConfigurationError):
        compose()


def test_rdp_curve_validation_and_sorting() -> None:
    curve = RDPCurveEvent(orders=(8, 2, 4), epsilons=(0.8, 0.2, 0.4), neighbouring="add_remove")
    assert curve.orders == (2.0, 4.0, 8.0)
    assert curve.epsilons == (0.2, 0.4, 0.8)
    assert curve.epsilon_inf == math.inf
    assert RDPCurveEvent((2.0,), (0.1,), epsilon_inf=None, neighbouring="add_remove").epsilon_inf == math.inf
    bad = [
        dict(orders=(), epsilons=()),
        dict(orders=(2.0, 3.0), epsilons=(0.1,)),
        dict(orders=(2.0, 2.0), epsilons=(0.1, 0.2)),
        dict(orders=(1.0,), epsilons=(0.1,)),
        dict(orders=(math.inf,), epsilons=(0.1,)),
        dict(orders=(2.0,), epsilons=(-0.1,)),
        dict(orders=(2.0,), epsilons=(math.nan,)),
        dict(orders=(2.0,), epsilons=(math.inf,)),
        dict(orders=(2.0,), epsilons=(0.1,), epsilon_inf=0.0),
        dict(orders=(2.0,), epsilons=(0.1,), epsilon_inf=-1.0),
        dict(orders=(2.0,), epsilons=(0.1,), epsilon_inf=math.nan),
    ]
    for kwargs in bad:
        with pytest.raises(ConfigurationError):
            RDPCurveEvent(**kwargs, neighbouring=ev.ADD_REMOVE)


def test_numbers_are_normalised_to_float() -> None:
    e = GaussianEvent(2, neighbouring="add_remove")
    assert type(e.noise_multiplier) is float
    assert e == GaussianEvent(2.0, neighbouring="add_remove")
    assert MozoTokenEvent(beta=1, order=14).order == 14.0
    assert GaussianEvent(1.5, sensitivity=2.0, neighbouring="add_remove").noise_std == 3.0
    assert MozoTokenEvent(beta=0.1, order=5).rdp_bound == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------------------
# Serialisation
# ---------------------------------------------------------------------------------------------------------

positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
probability = st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True)
rate = st.floats(min_value=0.0, max_value=1.0, exclude_min=True)
order = st.floats(min_value=1.0, max_value=1e4, exclude_min=True, allow_nan=False)

mozos = st.builds(MozoTokenEvent, positive, order)


@st.composite
def rdp_curves(draw: st.DrawFn, relation: str) -> RDPCurveEvent:
    orders = draw(st.lists(order, min_size=1, max_size=6, unique=True))
    eps = draw(st.lists(st.floats(0.0, 1e3), min_size=len(orders), max_size=len(orders)))
    eps_inf = draw(st.one_of(st.none(), st.just(math.inf), positive))
    return RDPCurveEvent(tuple(orders), tuple(eps), eps_inf, neighbouring=relation)


def _rdp_atoms(relation: str) -> st.SearchStrategy:
    tag = st.just(relation)
    return st.one_of(
        st.builds(GaussianEvent, positive, positive, neighbouring=tag),
        st.builds(PureDPEvent, positive, neighbouring=tag),
        st.builds(ExponentialMechanismEvent, positive, neighbouring=tag),
        rdp_curves(relation),
        *([mozos] if relation == ev.REPLACE_ONE else []),
    )


def _atoms(relation: str) -> st.SearchStrategy:
    gaussians = st.builds(GaussianEvent, positive, positive, neighbouring=st.just(ev.ADD_REMOVE))
    poissons = st.builds(PoissonSampledEvent, rate, gaussians, neighbouring=st.just(relation))
    approxes = st.builds(ApproxDPEvent, positive, probability, neighbouring=st.just(relation))
    return st.one_of(_rdp_atoms(relation), approxes, poissons)


def _composites(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.builds(SelfComposedEvent, children, st.integers(1, 10_000)),
        st.lists(children, min_size=1, max_size=4).map(lambda es: ComposedEvent(tuple(es))),
    )


# Replace-one trees: without-replacement sampling over RDP-analysable (possibly composed) inner events.
rdp_trees = st.recursive(_rdp_atoms(ev.REPLACE_ONE), _composites, max_leaves=6)
without_replacements = st.builds(SampledWithoutReplacementEvent, rate, rdp_trees)
replace_one_trees = st.recursive(st.one_of(_atoms(ev.REPLACE_ONE), without_replacements), _composites, max_leaves=8)
add_remove_trees = st.recursive(_atoms(ev.ADD_REMOVE), _composites, max_leaves=8)
any_event = st.one_of(replace_one_trees, add_remove_trees)

EXAMPLES = {
    "gaussian": GaussianEvent(0.7, sensitivity=math.sqrt(2), neighbouring="add_remove"),
    "pure_dp": PureDPEvent(0.1, neighbouring="add_remove"),
    "approx_dp": ApproxDPEvent(0.5, 1e-6, neighbouring="add_remove"),
    "exponential_mechanism": ExponentialMechanismEvent(2 / 3, neighbouring="add_remove"),
    "rdp_curve": RDPCurveEvent((2.0, 3.5), (0.1, 0.3), epsilon_inf=5.0, neighbouring="add_remove"),
    "mozo_token": MozoTokenEvent(beta=0.081, order=14),
    "poisson_sampled": PoissonSampledEvent(
        20 / 30000, GaussianEvent(0.51, math.sqrt(2), neighbouring="add_remove"), neighbouring="add_remove"
    ),
    "sampled_without_replacement": SWR,
    "self_composed": SelfComposedEvent(POISSON, 100),
    "composed": ComposedEvent((ApproxDPEvent(0.5, 1e-6, neighbouring="replace_one"), SelfComposedEvent(SWR, 5000))),
    "filtered_release": ev.FilteredReleaseEvent(
        GaussianEvent(3.2, sensitivity=math.sqrt(2), neighbouring="add_remove"), covered_by=4, neighbouring="add_remove"
    ),
}


def test_every_registered_type_has_an_example() -> None:
    # Every event type the module exports (other test modules may register private types of their own).
    exported = {
        getattr(ev, name).type_name
        for name in ev.__all__
        if isinstance(getattr(ev, name), type) and issubclass(getattr(ev, name), ev.DPEvent)
    } - {""}
    assert set(EXAMPLES) == exported
    assert exported <= set(ev._REGISTRY)
    for name, event in EXAMPLES.items():
        assert event.type_name == name
        assert event.to_dict()["type"] == name


def _round_trip(event: ev.DPEvent) -> None:
    data = event.to_dict()
    rebuilt = event_from_dict(data)
    assert rebuilt == event
    assert type(rebuilt) is type(event)
    assert event_key(rebuilt) == event_key(event)
    # Through real JSON text (what a ledger stores): no infinities, exact floats.
    text = json.dumps(data, allow_nan=False)
    from_json = event_from_dict(json.loads(text))
    assert from_json == event
    assert event_key(from_json) == event_key(event)
    assert hash(from_json) == hash(event)


@pytest.mark.parametrize("event", list(EXAMPLES.values()), ids=list(EXAMPLES))
def test_round_trip_examples(event: ev.DPEvent) -> None:
    _round_trip(event)


@settings(max_examples=150, deadline=None)
@given(any_event)
def test_round_trip_property(event: ev.DPEvent) -> None:
    _round_trip(event)


def test_rdp_curve_infinity_serialises_as_null() -> None:
    data = RDPCurveEvent((2.0,), (0.1,), neighbouring="add_remove").to_dict()
    assert data["epsilon_inf"] is None
    assert event_from_dict(data).epsilon_inf == math.inf


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({}, ConfigurationError),
        ([("type", "gaussian")], ConfigurationError),
        ("gaussian", ConfigurationError),
        ({"type": "laplace", "scale": 1.0}, UnsupportedEventError),
        ({"type": "gaussian"}, ConfigurationError),
        ({"type": "gaussian", "noise_multiplier": "1.0"}, ConfigurationError),
        ({"type": "approx_dp", "epsilon": 1.0, "delta": 0.0}, ConfigurationError),
        (
            {
                "type": "poisson_sampled",
                "sampling_rate": 0.1,
                "neighbouring": "add_remove",
                "event": {"type": "pure_dp", "epsilon": 1.0, "neighbouring": "add_remove"},
            },
            UnsupportedEventError,
        ),
        ({"type": "pure_dp", "epsilon": 1.0}, ConfigurationError),  # untagged: refused
        ({"type": "pure_dp", "epsilon": 1.0, "neighbouring": "swap"}, ConfigurationError),
        ({"type": "self_composed", "event": {"type": "pure_dp", "epsilon": 1.0}, "count": 0}, ConfigurationError),
    ],
)
def test_event_from_dict_rejects_malformed_input(data, error) -> None:
    with pytest.raises(error):
        event_from_dict(data)


def test_event_key_is_canonical_and_stable() -> None:
    # Literal strings: the key must not depend on the process (hash seeds, dict order).
    assert event_key(GaussianEvent(1.5, neighbouring="add_remove")) == (
        '{"neighbouring":"add_remove","noise_multiplier":1.5,"sensitivity":1.0,"type":"gaussian"}'
    )
    assert event_key(SelfComposedEvent(PureDPEvent(0.1, neighbouring="add_remove"), 10)) == (
        '{"count":10,"event":{"epsilon":0.1,"neighbouring":"add_remove","type":"pure_dp"},'
        '"neighbouring":"add_remove","type":"self_composed"}'
    )
    assert event_key(RDPCurveEvent((3.0, 2.0), (0.2, 0.1), neighbouring="add_remove")) == (
        '{"epsilon_inf":null,"epsilons":[0.1,0.2],"neighbouring":"add_remove","orders":[2.0,3.0],"type":"rdp_curve"}'
    )
    # The relation is part of the identity: the same numbers under another relation are another event.
    assert event_key(PureDPEvent(0.1, neighbouring="add_remove")) != event_key(
        PureDPEvent(0.1, neighbouring="replace_one")
    )
    # Equal events have equal keys; distinct parameters give distinct keys.
    assert event_key(GaussianEvent(1, neighbouring="add_remove")) == event_key(
        GaussianEvent(1.0, neighbouring="add_remove")
    )
    assert event_key(GaussianEvent(1.0, 2.0, neighbouring="add_remove")) != event_key(
        GaussianEvent(1.0, neighbouring="add_remove")
    )
    assert event_key(PureDPEvent(1.0, neighbouring="add_remove")) != event_key(
        ExponentialMechanismEvent(1.0, neighbouring="add_remove")
    )
    # Floats round-trip exactly through the key.
    x = 0.1 + 0.2
    assert json.loads(event_key(PureDPEvent(x, neighbouring="add_remove")))["epsilon"] == x


@settings(max_examples=100, deadline=None)
@given(any_event, any_event)
def test_event_key_distinguishes_unequal_events(a: ev.DPEvent, b: ev.DPEvent) -> None:
    assert (event_key(a) == event_key(b)) == (a == b)


# ---------------------------------------------------------------------------------------------------------
# atoms() and compose()
# ---------------------------------------------------------------------------------------------------------


def test_atoms_of_an_atom() -> None:
    assert atoms(G) == Counter({G: 1})
    assert atoms(POISSON) == Counter({POISSON: 1})
    # Sampled events are atoms: their inner composition is not flattened.
    g = GaussianEvent(1.0, neighbouring="replace_one")
    inner = ComposedEvent((g, g))
    assert atoms(SampledWithoutReplacementEvent(0.1, inner)) == Counter({SampledWithoutReplacementEvent(0.1, inner): 1})


def test_atoms_flattens_nested_compositions() -> None:
    a, b, c = (
        PureDPEvent(0.1, neighbouring="add_remove"),
        GaussianEvent(2.0, neighbouring="add_remove"),
        ExponentialMechanismEvent(0.3, neighbouring="add_remove"),
    )
    event = SelfComposedEvent(
        ComposedEvent((a, SelfComposedEvent(ComposedEvent((b, a)), 3), SelfComposedEvent(SelfComposedEvent(c, 2), 5))),
        4,
    )
    assert atoms(event) == Counter({a: 4 * (1 + 3), b: 4 * 3, c: 4 * 2 * 5})


@settings(max_examples=100, deadline=None)
@given(any_event, st.integers(1, 50))
def test_atoms_multiply_under_self_composition(event: ev.DPEvent, n: int) -> None:
    flat = atoms(event)
    assert all(not isinstance(a, (ComposedEvent, SelfComposedEvent)) for a in flat)
    assert all(k >= 1 for k in flat.values())
    assert atoms(SelfComposedEvent(event, n)) == Counter({a: k * n for a, k in flat.items()})
    assert atoms(ComposedEvent((event, event))) == Counter({a: 2 * k for a, k in flat.items()})


def test_compose_groups_identical_events() -> None:
    a, b = PureDPEvent(0.1, neighbouring="add_remove"), GaussianEvent(2.0, neighbouring="add_remove")
    composed = compose(a, b, a, SelfComposedEvent(a, 3), ComposedEvent((b, a)))
    assert isinstance(composed, ComposedEvent)
    assert atoms(composed) == Counter({a: 6, b: 2})
    assert set(composed.events) == {SelfComposedEvent(a, 6), SelfComposedEvent(b, 2)}
    # Canonical: independent of argument order.
    assert compose(b, a, a, a, a, a, a, b) == composed
    assert event_key(compose(SelfComposedEvent(b, 2), SelfComposedEvent(a, 6))) == event_key(composed)


def test_compose_single_kind() -> None:
    a = PureDPEvent(0.1, neighbouring="add_remove")
    assert compose(a) == a
    assert compose(a, a) == SelfComposedEvent(a, 2)
    assert compose(SelfComposedEvent(a, 2), a) == SelfComposedEvent(a, 3)


@settings(max_examples=100, deadline=None)
@given(st.lists(replace_one_trees, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_compose_is_canonical(events: list[ev.DPEvent], rng) -> None:
    composed = compose(*events)
    expected: Counter[ev.DPEvent] = Counter()
    for e in events:
        expected.update(atoms(e))
    assert atoms(composed) == expected
    shuffled = list(events)
    rng.shuffle(shuffled)
    assert event_key(compose(*shuffled)) == event_key(composed)


# ---------------------------------------------------------------------------------------------------------
# Supported accountants and immutability
# ---------------------------------------------------------------------------------------------------------

SUPPORT = {
    "gaussian": {ev.PRV, ev.PLD, ev.RDP},
    "pure_dp": {ev.BASIC, ev.PRV, ev.PLD, ev.RDP},
    "approx_dp": {ev.BASIC, ev.PRV, ev.PLD},
    "exponential_mechanism": {ev.BASIC, ev.PRV, ev.PLD, ev.RDP},
    "rdp_curve": {ev.RDP},
    "mozo_token": {ev.RDP},
    "poisson_sampled": {ev.PRV, ev.PLD, ev.RDP},  # add/remove; replace-one drops PRV
    "sampled_without_replacement": {ev.RDP},
    "self_composed": {ev.PRV, ev.PLD, ev.RDP},  # of a Poisson-sampled Gaussian
    "composed": set(),  # (ε, δ) next to an RDP-only atom: no single accountant
    "filtered_release": {ev.BASIC, ev.PRV, ev.PLD, ev.RDP},  # costs nothing, so every accountant takes it
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_supported_accountants(name: str) -> None:
    assert EXAMPLES[name].supported_accountants == frozenset(SUPPORT[name])


def test_composite_support_is_the_intersection() -> None:
    ar = {"neighbouring": "add_remove"}
    assert SelfComposedEvent(ApproxDPEvent(1.0, 1e-6, **ar), 3).supported_accountants == {ev.BASIC, ev.PRV, ev.PLD}
    assert ComposedEvent((PureDPEvent(1.0, **ar), G)).supported_accountants == {ev.PRV, ev.PLD, ev.RDP}
    assert ComposedEvent((PureDPEvent(1.0, **ar), ApproxDPEvent(1.0, 1e-6, **ar))).supported_accountants == {
        ev.BASIC,
        ev.PRV,
        ev.PLD,
    }
    assert ComposedEvent((PureDPEvent(1.0, neighbouring="replace_one"), SWR)).supported_accountants == {ev.RDP}
    g = GaussianEvent(1.0, neighbouring="replace_one")
    assert SampledWithoutReplacementEvent(
        0.1, ComposedEvent((g, PureDPEvent(1.0, neighbouring="replace_one")))
    ).supported_accountants == {ev.RDP}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_events_are_frozen(name: str) -> None:
    event = EXAMPLES[name]
    first = dataclasses.fields(event)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(event, first, getattr(event, first))
    assert hash(event) == hash(event_from_dict(event.to_dict()))


def test_filtered_releases_cost_the_ledger_nothing_more() -> None:
    from dp_icl_plugin import BudgetManager, PrivacyBudget
    from dp_icl_plugin.accounting import get_accountant

    cover = ApproxDPEvent(1.0, 1e-6, neighbouring="add_remove")
    record = ev.FilteredReleaseEvent(
        GaussianEvent(0.5, neighbouring="add_remove"), covered_by=1, neighbouring="add_remove"
    )
    for name in ("basic", "rdp", "prv", "auto"):
        accountant = get_accountant(name)
        assert accountant.epsilon(record, delta=1e-5) == 0.0
        if accountant.supports(cover):
            assert accountant.epsilon(compose(cover, SelfComposedEvent(record, 1000)), delta=1e-5) == pytest.approx(
                accountant.epsilon(cover, delta=1e-5)
            )
    ledger = BudgetManager(PrivacyBudget(1.0, 1e-6, neighbouring="add_remove"))
    first = ledger.spend(cover, label="demo-filter:index")  # a filter's cover and its releases (see BudgetManager)
    for _ in range(5):
        ledger.spend(
            ev.FilteredReleaseEvent(
                GaussianEvent(5.0, neighbouring="add_remove"), covered_by=first.id, neighbouring="add_remove"
            ),
            label="demo-release:index",
        )
    assert ledger.spent().epsilon == pytest.approx(1.0)
    # Under replace-one (the default) the cover converts by group privacy: (2ε, (1 + e^ε)δ).
    replace = BudgetManager(PrivacyBudget(2.0, 1e-5))
    first = replace.spend(cover, label="demo-filter:index")
    replace.spend(
        ev.FilteredReleaseEvent(
            GaussianEvent(5.0, neighbouring="add_remove"), covered_by=first.id, neighbouring="add_remove"
        ),
        label="demo-release:index",
    )
    assert replace.spent().epsilon == pytest.approx(2.0, rel=1e-4)  # at most (2ε, (1 + e^ε)δ) ≤ δ of the budget
    with pytest.raises(ConfigurationError):
        ev.FilteredReleaseEvent(GaussianEvent(0.5, neighbouring="add_remove"), covered_by=0, neighbouring="add_remove")
    with pytest.raises(ConfigurationError, match="not another filtered release"):
        ev.FilteredReleaseEvent(record, covered_by=1, neighbouring="add_remove")
