"""The embedded models the package ships: every file matches the manifest, the loader checks them and never builds,
an install carries them, and ``python -m mmrl.models.recipes.ship`` adds a model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.cache import EMBEDDED_NAME, RECIPE_VERSIONS
from mmrl.models import shipped
from mmrl.models.recipes.ship import MAX_FILE_BYTES, ship_files, warm_start_skill
from mmrl.models.shipped import MANIFEST_NAME, WEIGHTS_DIR, file_sha256, read_manifest, shipped_model

REPO = Path(__file__).resolve().parents[1]
MANIFEST = read_manifest()["models"]


def test_every_recipe_is_shipped():
    assert set(RECIPE_VERSIONS) <= set(MANIFEST)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_the_shipped_files_match_the_manifest(name):
    """The folder holds exactly the listed files, each with its sha256 and under the size limit, and the record says
    how the model was built and how well it does."""
    entry = MANIFEST[name]
    folder = WEIGHTS_DIR / entry["dir"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(entry["files"])
    for file, digest in entry["files"].items():
        assert file_sha256(folder / file) == digest, f"{folder / file} does not match the manifest"
        assert (folder / file).stat().st_size < MAX_FILE_BYTES
    assert entry["bytes"] == sum((folder / f).stat().st_size for f in entry["files"])
    assert entry["command"] and {"torch", "transformers", "kernels"} <= set(entry["build"])
    assert entry["recipe"] == RECIPE_VERSIONS.get(name)
    skill = entry["skill"]
    assert skill is not None, f"{name} has no measured skill; python -m mmrl.models.recipes.ship {name} --eval ..."
    assert skill["command"].startswith("python ") and skill["result"]


def test_nothing_unlisted_is_shipped_and_the_set_stays_small():
    listed = {entry["dir"] for entry in MANIFEST.values()}
    folders = {p.name for p in WEIGHTS_DIR.iterdir() if p.is_dir()}
    assert folders == listed, f"folders the manifest does not list: {folders - listed}"
    assert sum(entry["bytes"] for entry in MANIFEST.values()) < 20 * 2**20


def test_the_package_data_of_pyproject_ships_every_weight_file():
    """A non-editable install copies only what ``[tool.setuptools.package-data]`` names: every shipped file must
    match one of its patterns."""
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mmrl.models"]
    package = WEIGHTS_DIR.parent
    matched = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    shipped_files = {p for p in WEIGHTS_DIR.rglob("*") if p.is_file()}
    assert shipped_files and shipped_files == matched, sorted(map(str, shipped_files - matched))


def a_copy(tmp_path: Path, name: str = EMBEDDED_NAME) -> Path:
    """A weights folder in ``tmp_path`` holding ``name`` alone, as the package ships it."""
    entry = MANIFEST[name]
    weights = tmp_path / "weights"
    shutil.copytree(WEIGHTS_DIR / entry["dir"], weights / entry["dir"])
    (weights / MANIFEST_NAME).write_text(json.dumps({"models": {name: entry}}))
    return weights


def test_a_changed_or_missing_file_is_one_clear_error(tmp_path):
    weights = a_copy(tmp_path)
    folder = weights / MANIFEST[EMBEDDED_NAME]["dir"]
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model: embedded:tiny-qwen2: .*model.safetensors does not match its sha256"):
        shipped_model(EMBEDDED_NAME, weights)
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"tokenizer.json is missing") as caught:
        shipped_model(EMBEDDED_NAME, weights)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"unknown embedded model 'embedded:nope'; the package ships: embedded:tiny"):
        shipped_model("embedded:nope", weights)


def test_the_files_are_checked_once_per_process(tmp_path, monkeypatch):
    weights = a_copy(tmp_path)
    hashed = []
    monkeypatch.setattr(shipped, "file_sha256", lambda path: hashed.append(path) or file_sha256(path))
    first = shipped_model(EMBEDDED_NAME, weights)
    assert first == weights / MANIFEST[EMBEDDED_NAME]["dir"] and len(hashed) == len(MANIFEST[EMBEDDED_NAME]["files"])
    assert shipped_model(EMBEDDED_NAME, weights) == first and len(hashed) == len(MANIFEST[EMBEDDED_NAME]["files"])


def test_loading_an_embedded_model_builds_nothing(tmp_path):
    """A cold process with an empty cache loads the default from the package: nothing is written to the cache."""
    cache = tmp_path / "cache"
    code = ("from mmrl.models import load_model, resolve; import sys; where, _ = resolve('embedded:tiny-qwen2'); "
            "load_model('embedded:tiny-qwen2'); print(where)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MMRL_CACHE": str(cache), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip().splitlines()[-1]) == WEIGHTS_DIR / MANIFEST[EMBEDDED_NAME]["dir"]
    assert not cache.exists() or not any(cache.rglob("*"))


def test_an_unknown_embedded_model_is_one_line_on_the_command_line(capsys):
    from mmrl.eval import main

    assert main(["--model", "embedded:nope", "--max-problems", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: model: unknown embedded model 'embedded:nope'; the package ships")


def test_ship_copies_a_model_and_records_it(tmp_path):
    source = tmp_path / "built"
    shutil.copytree(WEIGHTS_DIR / MANIFEST[EMBEDDED_NAME]["dir"], source)
    (source / "build.json").write_text(json.dumps({"name": "x", "torch": "t", "transformers": "tf",
                                                   "kernels": "AVX2"}))
    weights = tmp_path / "weights"
    entry = ship_files("embedded:tiny-test", source, "tiny-test-v1", "python make.py", weights_dir=weights)
    assert entry["build"] == {"torch": "t", "transformers": "tf", "kernels": "AVX2"}
    assert sorted(entry["files"]) == sorted(MANIFEST[EMBEDDED_NAME]["files"])  # build.json stays out
    assert shipped_model("embedded:tiny-test", weights) == weights / "tiny-test-v1"
    assert read_manifest(weights)["models"]["embedded:tiny-test"]["command"] == "python make.py"
    with pytest.raises(ValueError, match="already shipped .* pass --replace"):
        ship_files("embedded:tiny-test", source, "tiny-test-v1", "python make.py", weights_dir=weights)
    with pytest.raises(ValueError, match="tiny-test-v1 is the folder of embedded:tiny-test"):
        ship_files("embedded:other", source, "tiny-test-v1", "python make.py", weights_dir=weights)
    (source / "model.safetensors").write_bytes(b"\0" * MAX_FILE_BYTES)
    with pytest.raises(ValueError, match="model.safetensors is 5.0 MiB; shipped files stay under 5 MiB"):
        ship_files("embedded:tiny-test", source, "tiny-test-v1", "python make.py", replace=True, weights_dir=weights)
    assert file_sha256(weights / "tiny-test-v1" / "model.safetensors") == entry["files"]["model.safetensors"]


def test_ship_replaces_only_a_folder_the_manifest_gives_the_model(tmp_path):
    """``--version`` names one folder of the weights folder; ``--replace`` removes nothing the manifest does not
    list as that model's."""
    source = tmp_path / "built"
    shutil.copytree(WEIGHTS_DIR / MANIFEST[EMBEDDED_NAME]["dir"], source)
    weights = tmp_path / "pkg" / "weights"
    ship_files("embedded:tiny-test", source, "tiny-test-v1", "python make.py", weights_dir=weights)
    (tmp_path / "pkg" / "notes.txt").write_text("mine")
    (weights / "mine").mkdir()
    (weights / "mine" / "todo.txt").write_text("mine too")
    for version in (".", "..", "../pkg", "a/b", "", "-x"):
        with pytest.raises(ValueError, match="--version: .* is not a folder name"):
            ship_files("embedded:tiny-test", source, version, "python make.py", replace=True, weights_dir=weights)
    with pytest.raises(ValueError, match="manifest names it no model's folder"):
        ship_files("embedded:tiny-test", source, "mine", "python make.py", replace=True, weights_dir=weights)
    assert (tmp_path / "pkg" / "notes.txt").is_file() and (weights / "mine" / "todo.txt").is_file()
    assert shipped_model("embedded:tiny-test", weights) == weights / "tiny-test-v1"


def test_the_skill_of_a_warm_start_is_its_greedy_held_out_evaluations(tmp_path):
    record = tmp_path / "warm_start.json"
    final = {"valid_seen/greedy": {"pass@1": 0.25}, "valid_seen/sampled": {"pass@1": 0.1},
             "valid_unseen/greedy": {"pass@1": 0.2}}
    record.write_text(json.dumps({"final": final}))
    skill = warm_start_skill(record, "python benchmarks/alfworld.py --rl-steps 0")
    assert skill["result"] == {"valid_seen/greedy": {"pass@1": 0.25}, "valid_unseen/greedy": {"pass@1": 0.2}}
    record.write_text("{}")
    with pytest.raises(ValueError, match="no 'final' entry of a greedy held-out evaluation"):
        warm_start_skill(record, "python x")


def test_one_command_ships_a_warm_started_agent(tmp_path, capsys):
    """The command that adds benchmarks/alfworld.py's warm-started agent: its folder has no build.json, its skill is
    the greedy held-out success the warm start measured, its record the command that made it."""
    from mmrl.cache import EMBEDDED_AGENT_NAME, EMBEDDED_AGENT_SFT_NAME, EMBEDDED_VERSIONS
    from mmrl.models.recipes.ship import main

    source = tmp_path / "sft-seed0"
    shutil.copytree(WEIGHTS_DIR / MANIFEST[EMBEDDED_AGENT_NAME]["dir"], source / "model")
    (source / "warm_start.json").write_text(json.dumps({"final": {"valid_seen/greedy": {"pass@1": 0.25}}}))
    weights = tmp_path / "weights"
    command = "python benchmarks/alfworld.py --rl-steps 0 --out OUT"
    bad = ["--from", str(source / "model"), "--warm-start", str(tmp_path / "none.json"), "--command", command]
    assert main([EMBEDDED_AGENT_SFT_NAME, *bad, "--weights", str(weights)]) == 2
    assert "--warm-start: cannot read" in capsys.readouterr().err and not weights.exists()
    assert main([EMBEDDED_AGENT_SFT_NAME, "--from", str(source / "model"), "--warm-start",
                 str(source / "warm_start.json"), "--command", command, "--weights", str(weights)]) == 0
    entry = read_manifest(weights)["models"][EMBEDDED_AGENT_SFT_NAME]
    assert entry["dir"] == EMBEDDED_VERSIONS[EMBEDDED_AGENT_SFT_NAME] and entry["command"] == command
    assert entry["skill"] == {"command": command, "result": {"valid_seen/greedy": {"pass@1": 0.25}},
                              "source": "warm_start.json"}
    assert "recorded" in entry["build"] and {"torch", "transformers", "kernels"} <= set(entry["build"])
    assert shipped_model(EMBEDDED_AGENT_SFT_NAME, weights) == weights / entry["dir"]
