"""A pipeline's faults get generators that seed on their first draw (setup cost), and draw
exactly what `random.Random(seed)` would, so every seeded replay is unchanged."""

from __future__ import annotations

import random

import pytest

from faults.latency import Latency
from middlebox.core.fault import (
    ConnectionRandom,
    FaultContext,
    FaultRandom,
    LazyRandom,
    Pipeline,
)


def draws(rng: random.Random) -> list[object]:
    return [
        rng.random(),
        rng.uniform(1, 9),
        rng.randint(0, 100),
        rng.choice("abcdef"),
        rng.getrandbits(64),
        rng.gauss(0, 1),
        rng.randrange(10**30),
        rng.sample(range(100), 5),
        rng.expovariate(2.0),
        rng.random(),
    ]


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**64 - 1])
def test_a_lazy_generator_draws_what_random_random_draws(seed: int) -> None:
    assert draws(LazyRandom(seed)) == draws(random.Random(seed))


@pytest.mark.parametrize("first", ["random", "getrandbits", "choice", "getstate"])
def test_whatever_comes_first_seeds_it_and_the_rest_follows_random_random(first: str) -> None:
    lazy, eager = LazyRandom(99), random.Random(99)
    if first == "getrandbits":
        assert lazy.getrandbits(7) == eager.getrandbits(7)
    elif first == "choice":
        assert lazy.choice(range(1000)) == eager.choice(range(1000))
    elif first == "getstate":
        assert lazy.getstate() == eager.getstate()
    else:
        assert lazy.random() == eager.random()
    assert draws(lazy) == draws(eager)


def test_it_is_not_seeded_until_it_draws_and_reseeding_or_a_state_replaces_the_seed() -> None:
    lazy = LazyRandom(5)
    assert lazy._seed_later == 5
    lazy.seed(6)
    assert lazy._seed_later is None and draws(lazy) == draws(random.Random(6))
    other = LazyRandom(7)
    other.setstate(random.Random(8).getstate())
    assert draws(other) == draws(random.Random(8))


def test_a_pipeline_binds_each_fault_with_a_lazy_generator_seeded_in_path_order() -> None:
    faults = [Latency(delay=0.01, jitter=0.005) for _ in range(3)]
    Pipeline(faults).bind(FaultContext(rng=random.Random("7:1")))
    seeds = random.Random("7:1")
    for fault in faults:
        assert isinstance(fault.rng, LazyRandom)
        assert fault.rng._seed_later is not None  # nothing drew yet: nothing seeded
        assert draws(fault.rng) == draws(random.Random(seeds.getrandbits(64)))


def test_both_generators_a_fault_may_hold_are_fault_randoms_and_a_draw_seeds_once() -> None:
    # What mypy checks statically (Fault.rng: FaultRandom, no cast), at run time too:
    # each of FaultRandom's methods is the class's until the first draw, then the
    # generator's own bound method (no Python call per draw).
    def five(rng: FaultRandom) -> list[object]:
        return [
            rng.random(),
            rng.uniform(2, 3),
            rng.randint(1, 6),
            rng.choice(["a", "b", "c"]),
            rng.getrandbits(32),
        ]

    lazy = LazyRandom(42)
    assert "random" not in vars(lazy)
    assert five(lazy) == five(random.Random(42))
    generator = lazy._generator
    assert generator is not None
    for name in ("random", "uniform", "randint", "choice", "getrandbits"):
        assert getattr(lazy, name) == getattr(generator, name)
        assert getattr(lazy, name).__self__ is generator
    assert lazy._generate() is generator  # seeded once


def bound_faults(rng: FaultRandom, count: int = 4) -> list[Latency]:
    faults = [Latency(delay=0.01, jitter=0.005) for _ in range(count)]
    Pipeline(faults).bind(FaultContext(rng=rng))
    return faults


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 1, 0, 2], [2], []])
def test_a_connection_generator_hands_out_seeds_without_seeding_and_draws_what_eager_does(
    order: list[int],
) -> None:
    lazy, eager = ConnectionRandom("7:1"), random.Random("7:1")
    lazy_faults, eager_faults = bound_faults(lazy), bound_faults(eager)
    assert lazy._generator is None  # bound, and nothing seeded: no fault drew
    for index in order:
        assert draws(lazy_faults[index].rng) == draws(eager_faults[index].rng)
    # the connection's own draws come after the seeds it handed out, as eager ones do
    assert draws(lazy) == draws(eager)
    for index in range(4):
        assert draws(lazy_faults[index].rng) == draws(eager_faults[index].rng)


def test_a_seed_handed_out_after_the_connection_generator_is_made_is_drawn_at_once() -> None:
    lazy, eager = ConnectionRandom(11), random.Random(11)
    first, first_eager = bound_faults(lazy, 2), bound_faults(eager, 2)
    assert lazy.random() == eager.random()  # made now: the two seeds first, then this
    second, second_eager = bound_faults(lazy, 2), bound_faults(eager, 2)
    for lazy_fault, eager_fault in zip(second + first, second_eager + first_eager, strict=True):
        assert draws(lazy_fault.rng) == draws(eager_fault.rng)
