"""Shared test set-up: the cache of generated data (the repo's .cache, git-ignored), threads, the embedded default's
folder, small configs and the generated ALFWorld set."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MMRL_CACHE", str(REPO / ".cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded in tests
# Every Ray a test starts is a one-machine Ray on loopback, as mmrl's own local launches (docs/security.md); Ray
# reads this when it is imported, before any test module imports it.
from mmrl.openrlhf.network import local_ray_options, single_machine_ray  # noqa: E402

single_machine_ray()
# `make test` runs the suite in pytest-xdist workers that share the machine's cores: each worker, and each command a
# test starts, gets its share of threads instead of all of them.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, torch.get_num_threads()) // _WORKERS)
torch.set_num_threads(_THREADS)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))


# The modules whose tests start a local Ray cluster (ray.init here or in the module). Under `make test` they form one
# work unit of pytest-xdist's `--dist loadfile`, so one worker runs them one after another, as a single process would:
# two rehearsal modules run at once in two workers (beside a benchmark) left both runs stalled until their 900 s
# timeout. A new module that starts Ray belongs in this list.
RAY_MODULES = ("tests/test_openrlhf_devices.py", "tests/test_openrlhf_rehearsal.py", "tests/test_recipes.py")
# The longest of the other files (20-40 s each on one core), handed out right after the Ray unit: one of them started
# last would run alone on one core while the other idled.
LONG_MODULES = ("tests/test_trl_alfworld.py", "tests/test_alfworld_rl.py", "tests/test_pretrained.py",
                "tests/test_gpu_check.py", "tests/test_trainer.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without xdist it is never called
def pytest_xdist_make_scheduler(config, log):
    # Every mode that splits the tests (also xdist's default --dist load of a bare `pytest -n 2`) keeps whole files and
    # the Ray unit together; only --dist each (every test on every worker) keeps xdist's own scheduler.
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayModulesTogether(LoadFileScheduling):
        """One work unit per test file, except that the Ray modules are one unit together, handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "ray modules" if scope in RAY_MODULES else scope

        def _assign_work_unit(self, node) -> None:
            # The Ray unit is the longest (most of the suite's wall time on 2 cores); started last, it ran alone while
            # the others idled. The long files follow it, longest first.
            for unit in (*reversed(LONG_MODULES), "ray modules"):
                if unit in self.workqueue:
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return RayModulesTogether(config, log)


# Under `make test` the other tests run at the nice value Ray gives its workers (15): at 0 they got ~28 times the CPU
# share of each Ray actor, and the Ray unit, the suite's critical path, waited behind them. Lower still, their own
# "fails within seconds" checks would starve beside a rehearsal.
YIELDING_NICE = 15


def pytest_runtest_setup(item):
    if _WORKERS > 1 and item.location[0] not in RAY_MODULES and hasattr(os, "nice"):
        os.nice(max(0, YIELDING_NICE - os.nice(0)))


def pytest_runtest_teardown(item, nextitem):
    """A test outside RAY_MODULES that leaves a Ray cluster up in this process would be scheduled beside the Ray
    unit: fail it, so the module gets added to the list (tests/test_suite_setup.py checks the source the same way)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and item.location[0] not in RAY_MODULES:
        pytest.fail(f"{item.location[0]} starts Ray: add it to RAY_MODULES in tests/conftest.py", pytrace=False)


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    from mmrl.cache import EMBEDDED_NAME
    from mmrl.models import shipped_model

    return shipped_model(EMBEDDED_NAME)


SMALL_RUN = {"rollout.prompts_per_step": 4, "rollout.samples_per_prompt": 4, "rollout.max_new_tokens": 12,
             "run.steps": 2, "run.progress": False, "run.plot": False, "run.eval_samples": 2,
             "run.checkpoint_every": 0}


def make_small_config(tmp_path, **overrides):
    """A TrainConfig for a seconds-long run in ``tmp_path/run``; ``overrides`` are dotted fields over the task's
    declared defaults, as on the command line."""
    from mmrl.run.config import resolve_config

    return resolve_config([({**SMALL_RUN, "run.out_dir": str(tmp_path / "run"), **overrides}, "test")])


@pytest.fixture
def small_config():
    return make_small_config


@pytest.fixture(scope="session")
def alfworld_games() -> Path:
    """A small generated ALFWorld set (one train game per task type), built once into the cache; skips without the
    alfworld extra."""
    pytest.importorskip("alfworld")
    from mmrl.envs.alfworld import ensure_games

    return ensure_games(n_per_type=1, n_eval_per_type=1)


@pytest.fixture(scope="module")
def ray_address(embedded_model_dir):
    """One local Ray cluster for every rehearsal run of a module (tests/rehearsal_run.py): 2 declared GPUs (the
    largest layout of the runs), CPU slots for a placement bundle per GPU plus the PPO trainer actor."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("deepspeed")
    info = ray.init(num_cpus=4, num_gpus=2, object_store_memory=512 * 1024 ** 2, **local_ray_options())
    try:
        yield info.address_info["gcs_address"]
    finally:
        ray.shutdown()
