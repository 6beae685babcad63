"""The backend-neutral build layer: both backends train the identical objective, a task's declared defaults reach
either backend and the eval command line, and they are the training defaults."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mmrl.algos as algos
from mmrl.cache import EMBEDDED_GROUNDING_NAME, EMBEDDED_NAME, EMBEDDED_VL_NAME, VL_RECIPE_VERSION
from mmrl.run.build import build_algorithm, build_task, response_budget
from mmrl.train import parse_config

CLUSTER = ["--cluster.nodes", "1", "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2",
           "--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", "4", "--steps", "3"]
TASK_FLAGS = {"arithmetic": [], "geoqa": ["--task.n_samples", "20"], "grounding": ["--task.n_samples", "20"],
              "alfworld": ["--task.n_per_type", "1", "--task.n_eval_per_type", "1", "--task.max_eval_games", "2"]}


def a_batch(n_groups: int = 2, size: int = 4, width: int = 6) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    n = n_groups * size
    old = -torch.rand(n, width, generator=gen) * 3
    mask = (torch.rand(n, width, generator=gen) > 0.3).float()
    rewards = torch.rand(n, generator=gen)
    return {"logprobs": old + 0.05 * torch.randn(n, width, generator=gen), "old_logprobs": old, "mask": mask,
            "ref_logprobs": old - 0.1, "group_ids": torch.arange(n_groups).repeat_interleave(size), "rewards": rewards}


def loss_on(algo: algos.Algorithm, batch: dict[str, torch.Tensor]) -> float:
    advantages = algo.advantages(batch["rewards"], batch["group_ids"])
    stats = algo.batch_stats(batch["rewards"], batch["group_ids"], advantages, batch["old_logprobs"], batch["mask"])
    loss, _ = algo.policy_loss(logprobs=batch["logprobs"], old_logprobs=batch["old_logprobs"], advantages=advantages,
                               mask=batch["mask"], group_ids=batch["group_ids"], ref_logprobs=batch["ref_logprobs"],
                               stats=stats)
    return float(loss)


@pytest.mark.parametrize("task", ["arithmetic", "geoqa", "grounding", "alfworld"])
@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_both_backends_build_the_identical_objective(name, task, tmp_path):
    """The local trainer's objective (`build_algorithm`, as `build_trainer` calls it) and the one every OpenRLHF actor
    rebuilds from the launch (``algos.get(spec.algo, **spec.params)``): same class, same hyper-parameters, same
    constant normaliser, hence the same loss on the same batch."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    if task == "alfworld":
        pytest.importorskip("alfworld")
    from mmrl.openrlhf.launch import resolve_launch

    params = ["--algo.kl_coef", "0.04"] if name == "grpo" else []
    cfg = parse_config(["--backend", "openrlhf", "--algo", name, "--task", task, "--out", str(tmp_path / "run"),
                        *CLUSTER, *params, *TASK_FLAGS[task]])
    multi_turn = build_task(cfg).multi_turn
    if multi_turn and algos.ALGORITHMS[name].needs_steps:  # the turn layout, which the openrlhf backend lacks
        with pytest.raises(ValueError, match="needs the per-step rewards"):
            build_algorithm(cfg, multi_turn)
        return
    local = build_algorithm(cfg, multi_turn)
    spec = resolve_launch(cfg, write=False).args.mmrl
    remote = algos.get(spec.algo, **spec.params)
    assert type(remote) is type(local) and dataclasses.asdict(remote) == dataclasses.asdict(local)
    assert remote == local and remote.resampling() == local.resampling()
    assert loss_on(remote, a_batch()) == loss_on(local, a_batch())
    if "max_tokens" in spec.params:  # the GRPO family: Dr.GRPO's constant is the task's response budget
        budget = cfg.rollout.max_episode_tokens if task == "alfworld" else cfg.rollout.max_new_tokens
        assert remote.max_tokens == local.max_tokens == budget == response_budget(cfg, multi_turn)


def test_overlong_shaping_takes_the_response_budget_and_refuses_episodes(tmp_path):
    """DAPO's L_max defaults to the generation budget on both backends; a multi-turn task's episodes are refused at
    start (their reward is the episode's, their length an episode's)."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    from mmrl.openrlhf.launch import resolve_launch

    cfg = parse_config(["--backend", "openrlhf", "--algo", "sapo", "--algo.overlong_buffer", "4", "--task",
                        "arithmetic", "--out", str(tmp_path / "run"), *CLUSTER])
    local = build_algorithm(cfg, False)
    assert local.max_length == cfg.rollout.max_new_tokens
    assert algos.get("sapo", overlong_buffer=4).max_length is None  # until the budget is known
    remote = resolve_launch(cfg, write=False).args.mmrl
    assert remote.params["max_length"] == local.max_length and remote.params["overlong_buffer"] == 4
    with pytest.raises(ValueError, match="single-turn"):
        build_algorithm(cfg, True)


def test_dry_run_of_an_image_task_names_the_vision_model(tmp_path, capsys):
    """``--backend openrlhf --task geoqa --dry-run`` without ``--model``: the task's declared default, the embedded
    Qwen2.5-VL, is the model OpenRLHF is given (not the text default)."""
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    from mmrl.train import main

    code = main(["--backend", "openrlhf", "--algo", "gpg", "--task", "geoqa", "--dry-run", "--out",
                 str(tmp_path / "run"), *CLUSTER, *TASK_FLAGS["geoqa"]])
    out = capsys.readouterr().out
    assert code == 0
    model_line = next(line for line in out.splitlines() if "--actor.model_name_or_path" in line)
    assert model_line.rstrip(" \\").endswith(VL_RECIPE_VERSION)
    assert "--data.image_key images" in out


@pytest.mark.parametrize("task,model", [("arithmetic", EMBEDDED_NAME), ("geoqa", EMBEDDED_VL_NAME),
                                        ("grounding", EMBEDDED_GROUNDING_NAME),
                                        ("alfworld", "embedded:tiny-qwen2-agent")])
def test_eval_resolves_the_same_defaults_as_training(task, model):
    from mmrl.eval import parse_command

    cfg, _ = parse_command(["--task", task])
    train = parse_config(["--task", task])
    assert cfg.model.name == train.model.name == model
    assert cfg.rollout == train.rollout and cfg.run.eval_samples == train.run.eval_samples
    assert cfg.run.eval_temperature == train.run.eval_temperature and cfg.run.seed == train.run.seed
    shortcuts, _ = parse_command(["--task", task, "--k", "3", "--rollout.max_new_tokens", "7"])
    assert (shortcuts.run.eval_samples, shortcuts.rollout.max_new_tokens) == (3, 7)


def test_grounding_declares_its_rl_settings_and_geoqa_the_demos_length():
    """``--task grounding`` gets the settings its lift was measured with (lr 5e-4: at 1e-3 held-out mIoU falls back
    after ~50 steps); geoqa, the headline command, runs as ``make demo`` (40 steps, held-out pass@1 every 20) with the
    generic lr and samples; a user's flag still wins."""
    grounding = parse_config(["--algo", "gpg", "--task", "grounding"])
    assert (grounding.optim.lr, grounding.run.steps, grounding.run.eval_every, grounding.run.eval_samples) == \
        (5e-4, 150, 50, 2)
    geoqa = parse_config(["--algo", "gpg", "--task", "geoqa"])
    assert (geoqa.optim.lr, geoqa.run.steps, geoqa.run.eval_every, geoqa.run.eval_samples) == (1e-3, 40, 20, 4)
    user = parse_config(["--task", "grounding", "--optim.lr", "1e-3", "--steps", "7"])
    assert (user.optim.lr, user.run.steps) == (1e-3, 7)


def test_eval_help_lists_only_what_eval_reads():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mmrl.eval", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for flag in ("--model", "--task", "--config", "--rollout.max_new_tokens", "--k", "--max-problems"):
        assert flag in proc.stdout
    for flag in ("--algo", "--optim.", "--rollout.temperature", "--cluster.", "--max-new-tokens"):
        assert flag not in proc.stdout, flag


def test_loading_an_embedded_policy_draws_no_weight_loading_bar(tmp_path, capfd):
    """An embedded model loads in a blink: transformers' per-load "Loading weights" bar only fills the run's log. Its
    other bars, and its warnings, stay as they were."""
    from transformers.utils.logging import tqdm as transformers_tqdm

    from mmrl.run.build import load_policy
    from mmrl.run.config import resolve_config

    capfd.readouterr()
    load_policy(resolve_config([({"run.out_dir": str(tmp_path / "run")}, "test")]).model, torch.device("cpu"))
    assert "Loading weights" not in capfd.readouterr().err
    for _ in transformers_tqdm(range(3), desc="after the load"):
        pass
    assert "after the load" in capfd.readouterr().err
