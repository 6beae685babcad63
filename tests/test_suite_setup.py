"""The suite's own set-up: every module that starts a local Ray cluster is in conftest.RAY_MODULES, so that
`make test`'s parallel workers never start two clusters at once; the files conftest hands out first exist."""

from __future__ import annotations

import platform
import re
from pathlib import Path

from conftest import LONG_MODULES, RAY_MODULES

TESTS = Path(__file__).resolve().parent
# ray.init(...) in the module, or a test that takes conftest's `ray_address` fixture (which calls ray.init)
STARTS_RAY = re.compile(r"\bray\.init\(|^def test_\w+\([^)]*\bray_address\b", re.MULTILINE)


def test_every_module_that_starts_ray_is_scheduled_with_the_others():
    modules = [path for path in TESTS.glob("test_*.py") if path.name != Path(__file__).name]
    starting = {f"tests/{path.name}" for path in modules if STARTS_RAY.search(path.read_text())}
    assert starting == set(RAY_MODULES)


def test_the_files_handed_out_first_exist():
    root = TESTS.parent
    assert all((root / module).is_file() for module in (*RAY_MODULES, *LONG_MODULES))
    assert not set(LONG_MODULES) & set(RAY_MODULES)


def test_the_venv_runs_the_locked_versions():
    """`make setup` installs what requirements/dev-lock.txt lists, so a fresh clone tests the stack CI tested, not
    whatever was released since. A package of the lock that is absent is one of the ALFWorld extra's, which machines
    without TextWorld wheels (aarch64) skip."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.utils import canonicalize_name

    lock = TESTS.parent / "requirements" / "dev-lock.txt"
    pins = dict(line.split("==") for line in lock.read_text().splitlines() if line and not line.startswith("#"))
    assert len(pins) > 100 and "transformers" in pins
    drifted, absent = {}, []
    for name, pinned in pins.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            absent.append(canonicalize_name(name))
            continue
        if installed != pinned:
            drifted[name] = (installed, pinned)
    assert not drifted, f"installed != locked: {drifted}; rerun `make setup`, or `make lock` after a deliberate upgrade"
    if platform.machine() in ("x86_64", "AMD64"):
        assert not absent


def test_every_install_of_make_setup_reads_the_lock():
    """Each `pip install` that `make setup` runs passes the lock as a constraint (printed by `make -n`, nothing run)."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        return
    root = TESTS.parent
    done = subprocess.run(["make", "-n", "-B", "VENV=/nonexistent/venv", "setup"], cwd=root, capture_output=True,
                          text=True, check=True)
    installs = [line for line in done.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert len(installs) >= 5
    assert all("-c requirements/dev-lock.txt" in line for line in installs), installs
