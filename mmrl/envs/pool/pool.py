"""``EnvPool``: many text envs per worker process, stepped asynchronously, with a step timeout and crash isolation.

    pool = EnvPool(AlfWorldEnv, num_workers=2, step_timeout=60)
    envs = [pool.env(game_path=game.path) for _ in range(32)]    # PooledEnv: a TextEnv living in a worker
    firsts = await asyncio.gather(*(env.reset() for env in envs))
    results = await asyncio.gather(*(env.step(text) for env, text in zip(envs, texts)), return_exceptions=True)
    pool.close()

Why this layout: verl-agent runs one Ray actor (one process) per ALFWorld env. A process costs ~120 MB and every
step pays a round trip and a context switch; with more envs than cores the processes mostly wait. Here ``num_workers``
processes (about one per core) each hold many envs and serve their requests back to back, so the cores stay busy on
engine work (``benchmarks/envs.py`` measures both layouts in one run).

Failure rules (the contract of :mod:`mmrl.envs.base`: a broken env ends its episode, never the run):
- a worker that dies (killed, segfault, out of memory) fails every request it had in flight and every env it held
  with :class:`EnvError` naming the worker, its pid and exit code; it is restarted at once;
- a worker that sends nothing for ``step_timeout`` seconds while serving a step (``reset_timeout`` for a create or
  reset) is hung: it is killed and treated as dead. The clock restarts at each reply, so requests queued behind a
  slow one do not time out;
- a :class:`PooledEnv` whose worker died raises EnvError on ``step``; its next ``reset`` re-creates it on a live
  worker, so the caller simply starts a new episode;
- errors the env itself raises come back as EnvError too, except the caller's own mistakes (ValueError, TypeError,
  RuntimeError such as stepping a finished episode; UserError for a bad option), which are re-raised as they are.

Requests are batched: the requests a loop makes in one iteration (``asyncio.gather`` of every env's step) go to each
worker as one message, and the worker answers a batch with one message (or several, when a batch runs long, so the
watchdog keeps seeing progress). A step of 16 envs on a worker costs one pipe round trip, not 16.

Replies are delivered by one reader thread per worker to whichever event loop awaits them, so the pool works across
several ``asyncio.run`` calls. Envs are placed on the live worker holding the fewest.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from mmrl.envs.base import EnvError, StepResult, TextEnv
from mmrl.envs.pool.worker import serve
from mmrl.errors import UserError

MAX_FAILED_STARTS = 3  # a slot whose worker dies this many times in a row before answering anything is not restarted
_CALLER_ERRORS = {"UserError": UserError, "ValueError": ValueError, "TypeError": TypeError,
                  "RuntimeError": RuntimeError}


class _Worker:
    def __init__(self, index: int, process, conn) -> None:
        self.index = index
        self.process = process
        self.conn = conn
        self.send_lock = threading.Lock()  # guards the outbox and the pipe's sending end
        self.outbox: list[tuple] = []  # requests waiting for the next flush (one message per flush)
        self.flush_scheduled = False
        self.pending: dict[int, tuple[asyncio.Future, float]] = {}  # request id -> (future, timeout), in send order
        self.envs: set[int] = set()
        self.last_progress = time.monotonic()
        self.dead = False
        self.death_reason = ""
        self.served = False  # has answered at least one request (a worker that never does is crash-looping)

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> str:
        return f"env worker {self.index} (pid {self.pid})"


class EnvPool:
    def __init__(self, make_env: Callable[..., TextEnv], num_workers: int | None = None, *,
                 step_timeout: float = 120.0, reset_timeout: float = 600.0, mp_context: str = "spawn",
                 watchdog_interval: float = 0.2) -> None:
        """``make_env(**kwargs)`` builds one env inside a worker: a class or a module-level function (it is pickled
        into spawned processes). ``num_workers`` defaults to the number of usable cores. ``reset_timeout`` bounds
        creating and resetting an env (a fresh worker imports the engine first; a 40-receptacle game takes seconds
        to ground); ``step_timeout`` bounds a step."""
        for name, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout)):
            if value <= 0:
                raise UserError(f"{name} must be > 0, got {value}")
        self.reset_timeout = reset_timeout
        self.make_env = make_env
        self.num_workers = num_workers or _usable_cores()
        if self.num_workers < 1:
            raise UserError(f"num_workers must be >= 1, got {num_workers}")
        self.step_timeout = step_timeout
        self._ctx = multiprocessing.get_context(mp_context)
        self._lock = threading.RLock()
        self._ids = itertools.count()
        self._closed = False
        self.restarts = 0
        self._failed_starts = [0] * self.num_workers
        self._workers = [self._spawn(i) for i in range(self.num_workers)]
        self._watchdog = threading.Thread(target=self._watch, args=(watchdog_interval,), daemon=True,
                                          name="mmrl-envpool-watchdog")
        self._watchdog.start()
        # A pool still open when the interpreter exits (a trainer built but never run) is closed first: otherwise
        # multiprocessing's own exit handler kills its workers and the pool restarts them mid-shutdown.
        atexit.register(self.close)

    # ----------------------------------------------------------------------------------------------- workers
    def _spawn(self, index: int) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(target=serve, args=(child_conn, self.make_env), daemon=True,
                                    name=f"mmrl-env-worker-{index}")
        process.start()
        child_conn.close()
        worker = _Worker(index, process, parent_conn)
        threading.Thread(target=self._read, args=(worker,), daemon=True, name=f"mmrl-envpool-reader-{index}").start()
        return worker

    def _read(self, worker: _Worker) -> None:
        """Reader thread: hand replies to their futures' loops; on EOF the worker is dead.

        Replies that are already waiting in the pipe are delivered together, one wake-up of each event loop per
        batch instead of one per reply (that wake-up was most of the pool's overhead per step)."""
        while True:
            try:
                replies = list(worker.conn.recv())
                while worker.conn.poll():
                    replies += worker.conn.recv()
            except (EOFError, OSError, ConnectionError):
                break
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            with self._lock:
                worker.last_progress = time.monotonic()
                worker.served = True
                for request_id, ok, value in replies:
                    future, _ = worker.pending.pop(request_id, (None, 0.0))
                    if future is not None:
                        by_loop.setdefault(future.get_loop(), []).append((future, ok, value))
            for loop, items in by_loop.items():
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_deliver_all, items, worker)
        worker.process.join(timeout=5)
        self._on_death(worker, worker.death_reason or f"{worker.describe()} died (exit code {worker.process.exitcode})")

    def _on_death(self, worker: _Worker, reason: str) -> None:
        with self._lock:
            if worker.dead:
                return
            worker.dead, worker.death_reason = True, reason
            pending, worker.pending = worker.pending, {}
            self._failed_starts[worker.index] = 0 if worker.served else self._failed_starts[worker.index] + 1
            replace = (not self._closed and self._workers[worker.index] is worker
                       and self._failed_starts[worker.index] < MAX_FAILED_STARTS)
        for future, _ in pending.values():
            _fail(future, EnvError(reason))
        if replace:
            fresh = self._spawn(worker.index)
            with self._lock:
                self._workers[worker.index] = fresh
                self.restarts += 1
        worker.conn.close()

    def _watch(self, interval: float) -> None:
        """Kill workers that made no progress for step_timeout seconds while requests were in flight."""
        while not self._closed:
            time.sleep(interval)
            now = time.monotonic()
            hung = []
            with self._lock:
                for worker in self._workers:
                    if worker.dead or not worker.pending:
                        continue
                    # requests are served in send order: the oldest pending one is the one being worked on
                    _, timeout = next(iter(worker.pending.values()))
                    if now - worker.last_progress > timeout:
                        worker.death_reason = (f"{worker.describe()} timed out: no reply for {timeout:g} s; "
                                               "killed and restarted")
                        hung.append(worker)
            for worker in hung:
                _kill(worker)  # the reader thread sees EOF and runs _on_death with the reason set above

    # ----------------------------------------------------------------------------------------------- requests
    async def _request(self, worker: _Worker, env_id: int, method: str, payload: Any) -> Any:
        timeout = self.step_timeout if method == "step" else self.reset_timeout
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        request_id = next(self._ids)
        with self._lock:
            if worker.dead:
                raise EnvError(worker.death_reason)
            if not worker.pending:
                worker.last_progress = time.monotonic()  # the timeout clock starts when work arrives
            worker.pending[request_id] = (future, timeout)
        with worker.send_lock:
            worker.outbox.append((request_id, env_id, method, payload))
            schedule, worker.flush_scheduled = not worker.flush_scheduled, True
        if schedule:  # after the callbacks of this loop iteration: the other envs' requests join the message
            loop.call_soon(self._flush, worker)
        return await future

    def _flush(self, worker: _Worker) -> None:
        """Send every request waiting in ``worker``'s outbox as one message."""
        with worker.send_lock:
            batch, worker.outbox, worker.flush_scheduled = worker.outbox, [], False
            if not batch:
                return
            try:
                worker.conn.send(batch)
                return
            except (OSError, ValueError) as err:
                error = EnvError(f"{worker.describe()} is unreachable: {err}")
        with self._lock:
            futures = [worker.pending.pop(request[0], (None, 0.0))[0] for request in batch]
        for future in futures:
            if future is not None:
                _fail(future, error)

    def _least_loaded(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("EnvPool is closed")
            live = [w for w in self._workers if not w.dead]
            if not live:
                raise EnvError("no live env worker")
            return min(live, key=lambda w: (len(w.envs), w.index))

    def env(self, **env_kwargs: Any) -> PooledEnv:
        """A new env handle; the env itself is built in a worker at its first reset."""
        return PooledEnv(self, next(self._ids), env_kwargs)

    async def _place(self, env: PooledEnv) -> None:
        worker = self._least_loaded()
        with self._lock:
            worker.envs.add(env.env_id)
        try:
            await self._request(worker, env.env_id, "create", env.env_kwargs)
        except BaseException:
            with self._lock:
                worker.envs.discard(env.env_id)
            raise
        env.worker = worker

    def _release(self, env: PooledEnv) -> None:
        with self._lock:
            if env.worker is not None:
                env.worker.envs.discard(env.env_id)

    # ----------------------------------------------------------------------------------------------- lifecycle
    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._workers]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"workers": self.num_workers, "restarts": self.restarts,
                    "envs_per_worker": [len(w.envs) for w in self._workers]}

    def close(self, timeout: float = 5.0) -> None:
        """Stop every worker (politely, then by force). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
        atexit.unregister(self.close)
        for worker in workers:
            try:
                with worker.send_lock:
                    worker.conn.send([(-1, -1, "shutdown", None)])
            except (OSError, ValueError):
                pass  # already gone: nothing to ask
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                _kill(worker)
                worker.process.join(timeout=1)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> EnvPool:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class PooledEnv(TextEnv):
    """A :class:`TextEnv` whose engine runs in an :class:`EnvPool` worker."""

    def __init__(self, pool: EnvPool, env_id: int, env_kwargs: dict[str, Any]) -> None:
        self.pool = pool
        self.env_id = env_id
        self.env_kwargs = env_kwargs
        self.worker: _Worker | None = None

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if self.worker is None or self.worker.dead:  # first use, or the worker died: build it (again) somewhere alive
            self.pool._release(self)
            self.worker = None
            await self.pool._place(self)
        return await self.pool._request(self.worker, self.env_id, "reset", {"seed": seed, "options": options})

    async def step(self, action_text: str) -> StepResult:
        if self.worker is None:
            raise RuntimeError("PooledEnv.step called before reset()")
        return await self.pool._request(self.worker, self.env_id, "step", action_text)

    async def close(self) -> None:
        worker = self.worker
        self.pool._release(self)
        self.worker = None
        if worker is not None and not worker.dead:
            await self.pool._request(worker, self.env_id, "close", None)


def _deliver_all(items: list[tuple[asyncio.Future, bool, Any]], worker: _Worker) -> None:
    """Runs in the futures' event loop: resolve each with its value or the matching error."""
    for future, ok, value in items:
        if future.done():  # cancelled by its awaiter meanwhile
            continue
        if ok:
            future.set_result(value)
            continue
        name, detail = value
        error_class = _CALLER_ERRORS.get(name)
        future.set_exception(error_class(detail) if error_class else EnvError(f"{worker.describe()}: {detail}"))


def _fail(future: asyncio.Future, error: BaseException) -> None:
    loop = future.get_loop()
    if not loop.is_closed():
        loop.call_soon_threadsafe(lambda: future.done() or future.set_exception(error))


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _kill(worker: _Worker) -> None:
    try:
        os.kill(worker.pid, signal.SIGKILL)
    except (ProcessLookupError, TypeError):
        pass  # already gone (or never started): nothing to kill
