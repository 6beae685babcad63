"""The recipes of the embedded models, each run on a tiny budget (the shipped models are never built in tests), and
``python -m mmrl.models.recipes.build``, which runs one into a new folder."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.cache import (
    EMBEDDED_AGENT_NAME,
    EMBEDDED_GROUNDING_NAME,
    EMBEDDED_MOE_NAME,
    EMBEDDED_NAME,
    EMBEDDED_VL_NAME,
    RECIPE_VERSIONS,
)
from mmrl.models.loading import is_embedded
from mmrl.models.recipes.build import build_model
from mmrl.models.recipes.registry import BUILDERS, KERNELS_PINNED_HERE, write_embedded
from mmrl.models.shipped import BUILD_RECORD, WEIGHTS_DIR
from mmrl.run.build import build_task
from mmrl.train import parse_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def threads_kept():
    """A build sets one torch thread (bit-identical results); the rest of this test process keeps its own count."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_every_embedded_model_has_a_recipe_and_a_version():
    assert set(BUILDERS) == set(RECIPE_VERSIONS)


NO_ALFWORLD = pytest.mark.skipif(importlib.util.find_spec("alfworld") is None,
                                 reason="the agent recipe reads ALFWorld's words: needs the alfworld extra")


@pytest.mark.parametrize("name,model_type", [(EMBEDDED_MOE_NAME, "qwen3_moe"),
                                             pytest.param(EMBEDDED_AGENT_NAME, "qwen2", marks=NO_ALFWORLD),
                                             (EMBEDDED_VL_NAME, "qwen2_5_vl"), (EMBEDDED_GROUNDING_NAME, "qwen3_vl")])
def test_a_recipe_runs_on_a_tiny_budget(name, model_type, tmp_path, threads_kept):
    from mmrl.models import load_model, load_tokenizer

    write_embedded(name, tmp_path, steps=1)
    record = json.loads((tmp_path / BUILD_RECORD).read_text())
    assert (record["name"], record["recipe"], record["steps"]) == (name, RECIPE_VERSIONS[name], 1)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
    assert load_tokenizer(str(tmp_path)).eos_token == "<|im_end|>"
    assert load_model(str(tmp_path)) is not None


def test_the_text_recipe_is_repeatable_in_one_process(tmp_path, threads_kept):
    from safetensors.torch import load_file

    write_embedded(EMBEDDED_NAME, tmp_path / "a", steps=3)
    write_embedded(EMBEDDED_NAME, tmp_path / "b", steps=3)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_build_command_builds_into_a_new_folder_with_pinned_kernels(tmp_path):
    """PyTorch picks its kernels when it starts, by the CPU: the build's child process gets AVX2 ones even on an
    AVX-512 CPU (whose kernels round differently), as its build record says."""
    out = tmp_path / "rebuilt"
    done = subprocess.run([sys.executable, "-m", "mmrl.models.recipes.build", EMBEDDED_NAME, "--out", str(out),
                           "--steps", "2"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    record = json.loads((out / BUILD_RECORD).read_text())
    assert record["steps"] == 2 and (out / "model.safetensors").is_file()
    assert not any(p.name.startswith(".building-") for p in tmp_path.iterdir())
    if KERNELS_PINNED_HERE and " avx2" in Path("/proc/cpuinfo").read_text():
        assert record["kernels"] == "AVX2"
    # a rebuild is an embedded model: tasks keep the prompts it was pre-trained on (no instruct system prompt)
    cfg = parse_config(["--model", str(out), "--task", "arithmetic"])
    build_task(cfg)
    assert is_embedded(str(out)) and "system_prompt" not in cfg.task.options
    assert not is_embedded(str(tmp_path))


def test_a_build_never_replaces_a_folder_or_the_shipped_weights(tmp_path, capsys):
    from mmrl.models.recipes.build import main

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert main([EMBEDDED_NAME, "--out", str(taken)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out: {taken} already exists and is not an empty folder")
    assert (taken / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="is inside the shipped weights"):
        build_model(EMBEDDED_NAME, WEIGHTS_DIR / "new")
    with pytest.raises(ValueError, match="no recipe for 'embedded:nope'"):
        build_model("embedded:nope", tmp_path / "x")
    assert not (tmp_path / "x").exists() and not (WEIGHTS_DIR / "new").exists()


def test_the_agent_recipe_without_the_alfworld_extra_names_it(monkeypatch):
    """Only the agent recipes read ALFWorld's words; without the extra (e.g. on aarch64, where TextWorld has no
    wheels) the build stops with a user error naming it, not an import traceback."""
    import random

    from mmrl.errors import UserError
    from mmrl.models.recipes.agent_corpus import alfworld_corpus

    monkeypatch.setitem(sys.modules, "alfworld", None)  # `import alfworld` now raises ImportError
    with pytest.raises(UserError, match=r"needs the ALFWorld engine \(pip install 'mmrl\[alfworld\]'\)"):
        alfworld_corpus(random.Random(0))
