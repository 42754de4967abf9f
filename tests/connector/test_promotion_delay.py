"""The harness's tier I/O clock on vLLM's real fs-tier thread pool: a delayed promotion
started in a step completes only after the next ``steps`` steps ended (stores are never
held); a settled engine's jobs reach vLLM as of the last step's end, in submission order."""

from __future__ import annotations

import threading
import time

import pytest

from kvscope.sim.promotion_delay import CompletionsAtStepEnd, DelayedPromotions

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


def test_jobs_reach_vllm_as_of_the_step_end_in_submission_order(pool):
    at_end = CompletionsAtStepEnd(pool)
    first_may_finish = threading.Event()
    pool.enqueue_store(3, 1, [lambda: first_may_finish.wait(10)])  # a slow cascade
    pool.enqueue_load(4, 1, [lambda: None])  # a promotion done at once
    deadline = time.monotonic() + 10
    while not any(job[0] == 4 for job in list(pool._finished_q)):  # vLLM's own queue
        assert time.monotonic() < deadline, "the promotion never finished"
        time.sleep(0.001)  # poll: the promotion is done, the cascade not
    assert pool.get_finished() == []  # finished inside the step: not vLLM's yet
    first_may_finish.set()
    pool.wait_idle()  # the step's end: the tier settled
    at_end.step_ended()
    # the cascade finished last but was submitted first: vLLM collects it first
    assert [job[:2] for job in pool.get_finished()] == [(3, True), (4, True)]
    assert pool.get_finished() == []  # collected once
    pool.enqueue_load(5, 1, [lambda: None])
    pool.wait_idle()
    assert pool.get_finished() == []  # done, but the step has not ended
    at_end.step_ended()
    assert [job[:2] for job in pool.get_finished()] == [(5, True)]
