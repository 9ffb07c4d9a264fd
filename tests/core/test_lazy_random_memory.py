"""A pipeline's lazy generators hold no Mersenne Twister state until a fault draws:
a `random.Random` carries its 2.5 KiB of state inline, one per fault per connection."""

from __future__ import annotations

import random
import sys
import tracemalloc

from faults.latency import Latency
from middlebox.core.fault import FaultContext, LazyRandom, Pipeline
from middlebox.core.stream import UP, Chunk


def test_an_undrawn_lazy_generator_is_a_small_object_not_a_twister() -> None:
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        lazies = [LazyRandom(seed) for seed in range(200)]
        lazy_size = tracemalloc.get_traced_memory()[0] - before
        before, _ = tracemalloc.get_traced_memory()
        eager = [random.Random(seed) for seed in range(200)]
        eager_size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(lazies) == len(eager)
    assert sys.getsizeof(random.Random(0)) > 2400  # the state is inline
    assert lazy_size * 4 < eager_size


def test_after_its_first_draw_a_lazy_generator_calls_the_generators_methods_directly() -> None:
    lazy = LazyRandom(3)
    first = lazy.random()
    assert lazy._seed_later is None
    assert lazy.__dict__["random"].__self__ is lazy._generator  # no __getattr__ from now on
    eager = random.Random(3)
    assert [first, lazy.random(), lazy.uniform(0, 5)] == [
        eager.random(),
        eager.random(),
        eager.uniform(0, 5),
    ]


def test_a_bound_pipeline_of_faults_that_never_draw_makes_no_generator() -> None:
    faults = [Latency(delay=0.01) for _ in range(4)]  # no jitter: nothing to draw
    pipeline = Pipeline(faults)
    pipeline.bind(FaultContext(rng=random.Random(1)))
    pipeline.on_open(0.0)
    pipeline.on_item(Chunk(UP, b"GET / HTTP/1.1\r\n\r\n"), 0.0)
    assert pipeline.deadline() == 0.01  # held by the first, as a delay line does
    for fault in faults:
        assert isinstance(fault.rng, LazyRandom) and fault.rng._generator is None


def test_a_framed_streams_log_and_a_framers_methods_are_lists_not_deques() -> None:
    # A deque allocates a 64-slot block up front (about 0.7 KiB) however little it holds:
    # four framed streams and two framers a faulted connection were 4.5 KiB of it.
    from middlebox.core.framed import FramedStream
    from middlebox.core.stream import DOWN

    stream = FramedStream(DOWN)
    assert type(stream._log) is list
    assert stream.http is not None and type(stream.http._methods) is list
