"""Every example config loads through mmrl's own CLI parser and passes its checks, so a typo fails CI, not a cluster.

The cluster examples name models and data that are not here (7B weights, /data/...): nothing is downloaded or built;
the config, the algorithm's hyper-parameters and the task's option names are checked.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import mmrl.algos as algos
from mmrl.run.config import validate
from mmrl.tasks import TASKS
from mmrl.train import parse_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
CLUSTER = sorted((ROOT / "examples" / "cluster").glob("*.yaml"))


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT / "examples"))


def test_the_cluster_examples_are_there():
    names = {p.stem for p in CLUSTER}
    assert {"gpg_geoqa_qwen2.5-vl-3b", "gvpo_math_qwen2.5-math-7b", "gmpo_alfworld_qwen2.5-1.5b-instruct",
            "cw_grpo_openrs_r1-distill-qwen-1.5b"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_example_config_loads_and_validates(path):
    cfg = parse_config(["--config", str(path)])
    validate(cfg)
    algos.get(cfg.algo.name, **cfg.algo.params)  # unknown or ill-typed hyper-parameters raise


@pytest.mark.parametrize("path", EXAMPLES, ids=_id)
def test_example_task_options_exist(path):
    cfg = parse_config(["--config", str(path)])
    assert cfg.task.name in TASKS, f"{_id(path)}: task {cfg.task.name!r} is not registered"
    accepted = set(inspect.signature(TASKS[cfg.task.name]).parameters)
    unknown = set(cfg.task.options) - accepted
    assert not unknown, f"{_id(path)}: task {cfg.task.name!r} has no option(s) {sorted(unknown)}"


@pytest.mark.parametrize("path", CLUSTER, ids=_id)
def test_cluster_example_has_its_launch_script(path):
    script = path.with_suffix(".sh")
    assert script.is_file(), f"{script.name} is missing"
    # a paper recipe's script launches it by default ("${RECIPE:-$here/NAME}"); its GRPO baseline's sets RECIPE
    assert f'$here/{path.name}' in script.read_text(), f"{script.name} does not launch {path.name}"


def test_a_typo_in_a_config_fails(tmp_path):
    """The check above can fail: a misspelt field is an error naming it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples" / "gpg_arithmetic.yaml").read_text().replace("samples_per_prompt",
                                                                                   "samples_per_promt"))
    with pytest.raises(ValueError, match="samples_per_promt"):
        parse_config(["--config", str(bad)])


# --- through the openrlhf backend: OpenRLHF's own argument parser, for one node and for a two-node Ray cluster ---

PAPER_TRAIN_ROWS = {"geoqa": 8031, "math": 7000, "alfworld": 3553}  # sizes of the papers' training sets (about)


def _cluster_overrides(cfg, nodes: int) -> list[str]:
    """What examples/cluster/launch.sh adds for NODES > 1 (join the cluster, one vLLM shard per GPU)."""
    if nodes == 1:
        return []
    engines = nodes * cfg.cluster.gpus_per_node // cfg.cluster.vllm_tensor_parallel_size
    return ["--cluster.ray_address", "auto", "--cluster.nodes", str(nodes), "--cluster.vllm_engines", str(engines)]


def _cluster_launch(path: Path, nodes: int, tmp_path: Path, check: bool = True):
    """(config, OpenRLHF flags) of a cluster example on ``nodes`` × 8 GPUs, with mmrl's layout check first unless
    ``check`` is false. The task's data is not read (paths name /data and hub ids); the data-dependent inputs are
    stand-ins of the papers' sizes."""
    from mmrl.openrlhf.args import LaunchInputs, build_flags, check_layout, merge_extra
    from mmrl.openrlhf.launch import algorithm_spec
    from mmrl.run.build import build_algorithm

    cfg = parse_config(["--config", str(path)])
    cfg = parse_config(["--config", str(path), *_cluster_overrides(cfg, nodes)])
    assert cfg.run.backend == "openrlhf"
    validate(cfg)
    agent = cfg.task.name == "alfworld"
    algo = build_algorithm(cfg, multi_turn=agent)
    spec = algorithm_spec(cfg, algo)
    if check:
        check_layout(cfg, algo)
    inputs = LaunchInputs(model_path=cfg.model.name, train_data=str(tmp_path / "train.jsonl"),
                          eval_data=str(tmp_path / "eval.jsonl"),
                          reward_func="" if agent else str(tmp_path / "reward_func.py"),
                          agent_func=str(tmp_path / "agent.py") if agent else "",
                          train_rows=PAPER_TRAIN_ROWS[cfg.task.name], max_images=int(cfg.task.name == "geoqa"))
    kl = spec["kl_coef"] if spec["uses_reference"] else 0.0
    return cfg, merge_extra(build_flags(cfg, inputs, kl, str(tmp_path)), cfg.cluster.extra)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("path", CLUSTER, ids=_id)
def test_cluster_example_is_a_valid_openrlhf_launch(path, nodes, tmp_path):
    """Batch layout over nodes × 8 GPUs, then OpenRLHF 0.11.2's own train_ppo_ray parser and checks.
    tests/test_recipes.py runs each recipe's whole ``--dry-run`` on stand-ins in the real layouts."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    from mmrl.openrlhf.args import to_argv
    from mmrl.openrlhf.cli import parse_openrlhf_args

    cfg, flags = _cluster_launch(path, nodes, tmp_path)
    args, _ = parse_openrlhf_args(to_argv(flags))
    assert args.actor.num_nodes == nodes
    assert args.vllm.num_engines * args.vllm.tensor_parallel_size == nodes * cfg.cluster.gpus_per_node
    assert args.rollout.n_samples_per_prompt == cfg.rollout.samples_per_prompt
    assert args.rollout.batch_size == cfg.rollout.prompts_per_step


def test_too_many_gpus_for_a_steps_sample_batches_is_one_line_naming_the_fields(tmp_path):
    """ALFWorld's 16 games × 8 episodes in micro-batches of 8 on 4 nodes: OpenRLHF's launch asserts one sample batch
    per GPU in its own flags' words; mmrl refuses it first, naming the config fields (docs/cluster.md's node counts)."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    from mmrl.openrlhf.args import to_argv
    from mmrl.openrlhf.cli import parse_openrlhf_args

    path = ROOT / "examples" / "cluster" / "gmpo_alfworld_qwen2.5-1.5b-instruct.yaml"
    with pytest.raises(ValueError) as err:
        _cluster_launch(path, 4, tmp_path)
    line = str(err.value)
    assert "\n" not in line and "make 16 sample batches, fewer than the 32 GPUs" in line
    for field in ("rollout.prompts_per_step", "optim.micro_batch_size", "cluster.nodes"):
        assert field in line
    _, flags = _cluster_launch(path, 4, tmp_path, check=False)
    with pytest.raises(ValueError, match="number of sample batches must be greater than or equal"):
        parse_openrlhf_args(to_argv(flags))


def _math_rows(path: Path, n: int, answer_key: str) -> str:
    import json

    with path.open("w") as f:
        for i in range(n):
            answer = f"\\boxed{{{i + 2}}}" if answer_key == "solution" else str(i + 2)
            f.write(json.dumps({"problem": f"What is {i} + 2?", answer_key: answer}) + "\n")
    return str(path)


def test_launch_script_dry_run_on_two_nodes(tmp_path):
    """examples/cluster/launch.sh itself with NODES=2 DRY_RUN=1: reads the config's tensor-parallel size, sizes the
    vLLM engines for 16 GPUs, and hands over to the launcher (no Ray started)."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    import os
    import subprocess
    import sys

    config = ROOT / "examples" / "cluster" / "cw_grpo_openrs_r1-distill-qwen-1.5b.yaml"
    env = {**os.environ, "NODES": "2", "DRY_RUN": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "examples" / "cluster" / "launch.sh"), str(config),
                           "--run.out_dir", str(tmp_path / "run"), "--evaluation.sets", "[]",
                           "--task.path", _math_rows(tmp_path / "train.jsonl", 30, "answer"),
                           "--task.eval_path", _math_rows(tmp_path / "eval.jsonl", 5, "answer")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ray: auto" in proc.stdout
    assert "--actor.num_nodes 2" in proc.stdout and "--vllm.num_engines 16" in proc.stdout


@pytest.mark.parametrize("script,env", [("launch.sh", {"NODES": "2x"}), ("launch.sh", {"NODES": "0"}),
                                        ("launch.sh", {"NODES": "2", "GPUS_PER_NODE": "abc"}),
                                        ("gpg_geoqa_qwen2.5-vl-3b.sh", {"GPUS": "0"}),
                                        ("gpg_geoqa_qwen2.5-vl-3b.sh", {"NODES": "abc"})])
def test_a_count_that_is_not_a_whole_number_is_one_line(script, env):
    """bash arithmetic took "2x" as an error and went on as one node, "0" as one node, and "abc" as an unset
    variable: each count is now checked, in one line naming it, before anything starts."""
    import os
    import subprocess

    config = ROOT / "examples" / "cluster" / "gvpo_math_qwen2.5-math-7b.yaml"
    args = [str(config)] if script == "launch.sh" else []
    proc = subprocess.run(["bash", str(ROOT / "examples" / "cluster" / script), *args],
                          env={**os.environ, "DRY_RUN": "1", **env}, capture_output=True, text=True, timeout=60)
    name, value = list(env.items())[-1]  # the count in question is the last one given
    assert proc.returncode == 2 and proc.stderr == f"{name}={value}: must be a whole number >= 1\n"


# Tasks with data made by code: the example's own --dry-run on the bundled/generated set instead of /data.
GENERATED_DATA = {  # the recipes' own evaluation sets read /data: tests/test_recipes.py covers them
    # the recipe's column names are the official files' (a set column option is refused without task.path)
    "geoqa": (["--task.path", "", "--task.answer_key", "", "--task.n_samples", "40", "--evaluation.sets", "[]"], None),
    "alfworld": (["--task.games_root", "", "--task.n_per_type", "3", "--evaluation.sets", "[]"], "alfworld"),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in CLUSTER if any(t in p.stem for t in GENERATED_DATA)], ids=_id)
def test_generated_data_examples_dry_run(path, tmp_path, capsys):
    """The GeoQA / ALFWorld examples' real ``--dry-run`` with the task's own generated data in place of /data (the
    tasks come from the vision and ALFWorld work)."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    from mmrl.train import main

    cfg = parse_config(["--config", str(path)])
    assert cfg.task.name in TASKS, f"{_id(path)}: task {cfg.task.name!r} is not registered"
    overrides, needs = GENERATED_DATA[cfg.task.name]
    if needs:
        pytest.importorskip(needs)
    argv = ["--config", str(path), "--dry-run", "--run.out_dir", str(tmp_path / "run"), *overrides]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"--actor.model_name_or_path {cfg.model.name}" in out
    assert f"--rollout.batch_size {cfg.rollout.prompts_per_step}" in out


@pytest.mark.slow
def test_alfworld_example_exports_labels_the_agent_file_reads(tmp_path):
    """The ALFWorld example's exported prompt file: every label is a game spec the OpenRLHF agent file accepts, with
    a game that exists and one reset seed per game (the group's episodes start identically)."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    pytest.importorskip("alfworld")
    import json

    from mmrl.envs.adapters.openrlhf_agent import parse_label
    from mmrl.openrlhf.launch import resolve_launch

    path = next(p for p in CLUSTER if "alfworld" in p.stem)
    overrides, _ = GENERATED_DATA["alfworld"]
    # the shipped agent model stands in for the recipe's hub model, whose config cannot be read offline
    cfg = parse_config(["--config", str(path), "--run.out_dir", str(tmp_path / "run"), *overrides,
                        "--model", "embedded:tiny-qwen2-agent"])
    launch = resolve_launch(cfg, write=True)
    lines = [json.loads(x) for x in Path(launch.files["train"]).read_text().splitlines()]
    assert lines
    specs = [parse_label(line["label"]) for line in lines]
    assert all(Path(s["game_path"]).exists() for s in specs)
    assert len({s["seed"] for s in specs}) == len(specs)
    assert all(s["env"]["max_steps"] == cfg.task.options.get("max_steps", s["env"]["max_steps"]) for s in specs)
