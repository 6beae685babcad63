"""EnvPool on real AlfWorldEnvs in real worker processes: results equal in-process play, a worker killed with
os.kill or frozen with SIGSTOP ends only its own episodes and is replaced, the caller's mistakes come back as such."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

pytest.importorskip("alfworld")

from mmrl.envs.actions import format_action  # noqa: E402
from mmrl.envs.alfworld import AlfWorldEnv, list_games  # noqa: E402
from mmrl.envs.base import EnvError  # noqa: E402
from mmrl.envs.pool import EnvPool  # noqa: E402


def games_by_type(root):
    return {g.task_type: g for g in list_games(root, "train")}


async def play(env, commands):
    first = await env.reset(seed=0)
    return first, [await env.step(format_action(c)) for c in commands]


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_pool_plays_like_in_process_and_survives_a_killed_worker(alfworld_games):
    games = games_by_type(alfworld_games)
    pick, clean = games["pick_and_place_simple"], games["pick_clean_then_place_in_recep"]
    walk_pick, walk_clean = AlfWorldEnv(pick.path).walkthrough, AlfWorldEnv(clean.path).walkthrough

    async def scenario(pool):
        local = await play(AlfWorldEnv(pick.path), walk_pick)
        envs = [pool.env(game_path=str(path)) for path in (pick.path, clean.path, pick.path, clean.path)]
        firsts = await asyncio.gather(*(env.reset(seed=0) for env in envs))
        assert pool.stats()["envs_per_worker"] == [2, 2]
        pooled = await play(envs[0], walk_pick)  # pooled and in-process episodes agree to the byte
        assert pooled[0] == local[0] and [r.observation for r in pooled[1]] == [r.observation for r in local[1]]
        assert pooled[1][-1].info["won"] and pooled[1][-1].reward == 10.0

        victim = envs[1].worker
        survivors = [env for env in envs[1:] if env.worker is not victim]
        lost = [env for env in envs[1:] if env.worker is victim]
        os.kill(victim.pid, signal.SIGKILL)  # a real crash of one worker process
        for env in lost:
            with pytest.raises(EnvError, match=r"died \(exit code -9\)"):
                await env.step(format_action("look"))
        for env in survivors:  # the other worker's episodes go on and can still be won
            walk = walk_pick if env.env_kwargs["game_path"] == str(pick.path) else walk_clean
            await env.reset(seed=0)
            results = [await env.step(format_action(c)) for c in walk]
            assert results[-1].info["won"]
        await asyncio.to_thread(wait_for, lambda: pool.stats()["restarts"] == 1)
        assert victim.pid not in pool.worker_pids()
        again = [await env.reset(seed=0) for env in lost]  # a new episode re-creates the env on a live worker
        assert [a[0] for a in again] == [firsts[envs.index(env)][0] for env in lost]
        await asyncio.gather(*(env.close() for env in envs))

    with EnvPool(AlfWorldEnv, num_workers=2, step_timeout=60) as pool:
        asyncio.run(scenario(pool))


@pytest.mark.slow
def test_hung_worker_times_out_and_is_replaced(alfworld_games):
    game = games_by_type(alfworld_games)["look_at_obj_in_light"]

    async def scenario(pool):
        envs = [pool.env(game_path=str(game.path)) for _ in range(2)]
        await asyncio.gather(*(env.reset() for env in envs))
        frozen, healthy = envs
        os.kill(frozen.worker.pid, signal.SIGSTOP)  # a real hang: the process exists but never answers
        started = time.monotonic()
        outcomes = await asyncio.gather(frozen.step(format_action("look")), healthy.step(format_action("look")),
                                        return_exceptions=True)
        assert isinstance(outcomes[0], EnvError) and "timed out" in str(outcomes[0])
        assert 2.0 <= time.monotonic() - started < 30
        assert not isinstance(outcomes[1], Exception) and outcomes[1].info["step"] == 1
        await asyncio.to_thread(wait_for, lambda: pool.stats()["restarts"] == 1)
        obs, info = await frozen.reset()
        assert info["step"] == 0 and "Your task is to:" in obs

    with EnvPool(AlfWorldEnv, num_workers=2, step_timeout=2.0) as pool:
        asyncio.run(scenario(pool))


def test_caller_mistakes_are_not_env_failures(alfworld_games):
    game = games_by_type(alfworld_games)["pick_and_place_simple"]

    async def scenario(pool):
        env = pool.env(game_path=str(game.path), max_steps=1)
        with pytest.raises(RuntimeError, match="before reset"):
            await env.step("look")
        await env.reset()
        assert (await env.step(format_action("look"))).done
        with pytest.raises(RuntimeError, match="after the episode ended"):
            await env.step(format_action("look"))
        with pytest.raises(ValueError, match="observation_mode"):
            await pool.env(game_path=str(game.path), observation_mode="everything").reset()
        with pytest.raises(EnvError, match="not found"):
            await pool.env(game_path=str(game.path) + ".missing").reset()
        assert pool.stats()["restarts"] == 0

    with EnvPool(AlfWorldEnv, num_workers=1) as pool:
        asyncio.run(scenario(pool))
    with pytest.raises(ValueError, match="step_timeout"):
        EnvPool(AlfWorldEnv, num_workers=1, step_timeout=0)


def cpu_ticks(pid: int) -> int:
    """The process's user + system CPU time so far, in clock ticks (``/proc/PID/stat`` fields 14 and 15)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads the workers' CPU time from /proc")
def test_the_trainers_default_env_pool_resets_side_by_side(tmp_path, small_config):
    """By default the local trainer runs multi-turn envs in a pool of one worker per usable core, so resets awaited
    together run side by side (in one process an engine call holds the GIL: they would load one after another).

    Side by side is read from the workers' CPU time, sampled every 20 ms while the resets run: in many intervals
    every worker is busy at once. Unlike a wall-clock speed-up, that holds on a machine whose cores other jobs hold
    too (there the scheduler still runs both workers within each interval, only slower)."""
    from mmrl.tasks import get_task
    from mmrl.trainer.local import _setup_env_pool

    cfg = small_config(tmp_path, **{"task.name": "alfworld", "task.n_per_type": 1, "task.n_eval_per_type": 1})
    task = get_task("alfworld", n_per_type=1, n_eval_per_type=1)
    pool = _setup_env_pool(cfg.rollout, task)
    assert pool is not None, "rollout.env_workers' default runs the envs in this process, one engine call at a time"
    try:
        assert pool.num_workers == len(os.sched_getaffinity(0))
        if pool.num_workers < 2:
            pytest.skip("one usable core: nothing to run side by side")

        async def scenario() -> None:
            rows = task.train
            warm = [pool.env(**task.kwargs_for(rows[i % len(rows)])) for i in range(pool.num_workers)]
            await asyncio.gather(*(env.reset() for env in warm))  # every worker has imported the engine
            await asyncio.gather(*(env.close() for env in warm))
            assert pool.stats()["envs_per_worker"] == [0] * pool.num_workers
            pids = pool.worker_pids()
            samples, gaps, running = [], [0.0], True

            async def sample() -> None:  # also the event loop's heartbeat: a gap is a stall of the loop
                last = time.perf_counter()
                while running:
                    samples.append([cpu_ticks(pid) for pid in pids])
                    await asyncio.sleep(0.02)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            sampler = asyncio.create_task(sample())
            envs = [pool.env(**task.kwargs_for(rows[i % len(rows)])) for i in range(2 * pool.num_workers)]
            started = time.perf_counter()
            firsts = await asyncio.gather(*(env.reset() for env in envs))
            wall = time.perf_counter() - started
            running = False
            await sampler
            await asyncio.gather(*(env.close() for env in envs))
            assert all("Your task is to:" in first for first, _ in firsts)
            busy = [[b > a for a, b in zip(before, after, strict=True)]
                    for before, after in zip(samples, samples[1:], strict=False)]
            side_by_side = sum(all(workers) for workers in busy)
            # one after another, no interval would have every worker busy; 5 %: a loaded machine's scheduler may run
            # each worker only part of an interval, and a tick of CPU time is 10 ms
            assert side_by_side >= 0.05 * sum(any(workers) for workers in busy), busy
            assert max(gaps) < max(0.5 * wall, 1.0), (max(gaps), wall)  # the event loop kept running meanwhile

        asyncio.run(scenario())
    finally:
        pool.close()
