"""The harness's delayed promotions on vLLM's real fs-tier thread pool: a promotion started
in a step completes only after the next ``steps`` steps ended; stores are never held."""

from __future__ import annotations

import pytest

from kvscope.sim.promotion_delay import DelayedPromotions

pytestmark = pytest.mark.vllm


@pytest.fixture
def pool():
    from vllm.v1.kv_offload.tiering.fs.thread_pool import DualQueueThreadPool

    p = DualQueueThreadPool(n_read_threads=1, n_write_threads=1)
    yield p
    p.shutdown(wait=True)


def _finished_after_settling(pool) -> list:
    pool.wait_idle()
    return sorted(done[:2] for done in pool.get_finished())  # 0.33 adds the transfer time


def test_a_promotion_stays_in_flight_for_the_next_steps(pool):
    delayed = DelayedPromotions(pool, 2)
    ran = []
    pool.enqueue_load(7, 2, [lambda: ran.append("a"), lambda: ran.append("b")])
    pool.enqueue_store(8, 1, [lambda: ran.append("store")])
    assert _finished_after_settling(pool) == [(8, True)]  # the store is not held
    delayed.tick()  # the step that started it ends
    assert _finished_after_settling(pool) == []
    delayed.tick()  # the next step: its lookup found it in flight
    assert _finished_after_settling(pool) == []
    pool.enqueue_load(9, 1, [lambda: ran.append("c")])  # started in the second step
    delayed.tick()  # the second step after it ends: handed to the I/O threads
    assert _finished_after_settling(pool) == [(7, True)]
    assert sorted(ran) == ["a", "b", "store"]
    delayed.release_all()  # drained: nothing stays held
    assert _finished_after_settling(pool) == [(9, True)]
