"""Each paper recipe of examples/cluster/ through its real ``--dry-run``, on stand-in files in its datasets' layouts,
and one real training step of each, and of each paper's GRPO baseline recipe, in the CPU rehearsal
(``--cluster.rehearsal true``) with the embedded model.

``python -m mmrl.train --backend openrlhf --config <recipe> --dry-run`` builds the task from the files (so a column,
split or directory the recipe names must exist in the real layout), checks the batch split over the recipe's GPUs,
and runs OpenRLHF 0.11.2's own argument parser on the resolved launch; nothing is started. Only the data paths are
overridden, to the stand-ins of tests/recipe_data.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import recipe_data
import torch
from rehearsal_run import any_group_varies, check_run, check_statistics, padded_cat, rehearse, step_items, step_records

from mmrl.train import main, parse_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"


def _flag(out: str, name: str) -> str:
    """The value printed for ``--name`` in the dry run's command (one flag per line)."""
    for line in out.splitlines():
        parts = line.strip().rstrip("\\").split()
        if parts and parts[0] == f"--{name}":
            return " ".join(parts[1:])
    raise AssertionError(f"--{name} is not in the dry run's command")


def _dry_run(recipe: str, overrides: list[str], tmp_path: Path, capsys) -> tuple[str, object]:
    pytest.importorskip("openrlhf", reason="make setup installs OpenRLHF 0.11.2 (--no-deps)")
    config = CLUSTER / f"{recipe}.yaml"
    argv = ["--config", str(config), "--dry-run", "--run.out_dir", str(tmp_path / "run"), *overrides]
    assert main(argv) == 0
    assert not (tmp_path / "run").exists(), "a dry run writes nothing"
    return capsys.readouterr().out, parse_config(["--config", str(config), *overrides])


def _sets_on(recipe: str, files: dict[str, str]) -> list[str]:
    """``--evaluation.sets`` of the recipe with each set's path replaced by its stand-in (``files[name]``)."""
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml")])
    sets = [dict(s, path=files[s["name"]]) if s.get("path") else dict(s) for s in cfg.evaluation.sets]
    return ["--evaluation.sets", json.dumps(sets)]


def _eval_checks(out: str, cfg) -> None:
    """Every set of the recipe reached the launch with its own sampling, and vLLM's context holds the longest."""
    sets = cfg.evaluation.sets
    assert sets, "the recipe evaluates named sets (its paper's protocol)"
    for s in sets:
        assert f"evaluation set {s['name']}:" in out
    longest = max(s.get("max_new_tokens") or cfg.rollout.max_new_tokens for s in sets)
    assert int(_flag(out, "data.max_len")) == cfg.rollout.max_prompt_tokens + max(longest, cfg.rollout.max_new_tokens)


def _common_checks(out: str, cfg) -> None:
    assert _flag(out, "actor.model_name_or_path") == cfg.model.name
    assert _flag(out, "rollout.batch_size") == str(cfg.rollout.prompts_per_step)
    assert _flag(out, "rollout.n_samples_per_prompt") == str(cfg.rollout.samples_per_prompt)
    assert _flag(out, "rollout.temperature") == str(cfg.rollout.temperature)
    assert _flag(out, "actor.adam.lr") == str(cfg.optim.lr)
    schedules = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine_with_min_lr"}
    assert _flag(out, "actor.lr_scheduler") == schedules[cfg.optim.schedule]
    assert float(_flag(out, "actor.min_lr_ratio")) == cfg.optim.min_lr_ratio
    responses = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    assert _flag(out, "train.batch_size") == str(cfg.optim.minibatch_turns or responses // cfg.optim.minibatches)


def test_gpg_geoqa_recipe_dry_run(tmp_path, capsys):
    train = recipe_data.geoqa_r1v_train(tmp_path, 20)
    sets = _sets_on("gpg_geoqa_qwen2.5-vl-3b", {"geoqa_test": recipe_data.geoqa_r1v_test(tmp_path, 5)})
    out, cfg = _dry_run("gpg_geoqa_qwen2.5-vl-3b", ["--task.path", train, *sets], tmp_path, capsys)
    _common_checks(out, cfg)
    _eval_checks(out, cfg)
    assert _flag(out, "data.max_images_per_prompt") == "1"
    assert cfg.algo.params["loss_agg"] == "seq_mean_token_mean"  # the authors' GeoQA trainer
    assert "--algo.kl.use_loss" not in out  # GPG keeps no reference model
    assert _flag(out, "ds.zero_stage") == "3"
    assert "rollout sampling: temperature 1.0, top_p 1.0, top_k 50, repetition_penalty 1.0" in out  # authors' trainer
    assert "evaluation set geoqa_test: 1 per problem, greedy, repetition_penalty 1.05," in out  # the checkpoint's


def test_gvpo_math_recipe_dry_run(tmp_path, capsys):
    train = recipe_data.math_lighteval_train(tmp_path, 1030)
    sets = recipe_data.math_eval_sets(tmp_path)
    out, cfg = _dry_run("gvpo_math_qwen2.5-math-7b",
                        ["--task.path", train, *_sets_on("gvpo_math_qwen2.5-math-7b", sets)], tmp_path, capsys)
    _common_checks(out, cfg)
    _eval_checks(out, cfg)
    assert "evaluation set aime24: 32 per problem, temperature 1.0, top_p 1.0, 1024 new tokens, avg@32" in out
    assert _flag(out, "vllm.tensor_parallel_size") == "2"


def test_cw_grpo_openrs_recipe_dry_run(tmp_path, capsys):
    train = recipe_data.open_rs_train(tmp_path, 30)
    sets = recipe_data.math_eval_sets(tmp_path)
    out, cfg = _dry_run("cw_grpo_openrs_r1-distill-qwen-1.5b",
                        ["--task.path", train, *_sets_on("cw_grpo_openrs_r1-distill-qwen-1.5b", sets)], tmp_path,
                        capsys)
    _common_checks(out, cfg)
    _eval_checks(out, cfg)
    assert "evaluation set olympiadbench: 1 per problem, temperature 0.6, top_p 0.95, 32768 new tokens, pass@1" in out
    assert float(_flag(out, "algo.kl.init_coef")) == cfg.algo.params["kl_coef"]


def _turn_layout_checks(out: str, cfg) -> None:
    """verl-agent's per-turn settings reach the launch: every env step its own row (the turn agent executor, the
    env's window prompt of the last 2 turns), 256 turn-samples per optimizer step, the entropy bonus, 50 steps."""
    assert cfg.rollout.agent_layout == "turn" and _flag(out, "train.agent_func_path").endswith("turn_agent.py")
    assert _flag(out, "train.batch_size") == "256" == str(cfg.optim.minibatch_turns)
    assert float(_flag(out, "actor.entropy_coef")) == 0.001 == cfg.algo.params["entropy_coef"]
    assert cfg.task.options["history_length"] == 2 and cfg.task.options["max_steps"] == 50
    # The papers' runs = verl-agent's KL loss: a reference model is kept and its log-probs reach mmrl's loss
    assert float(_flag(out, "algo.kl.init_coef")) == 0.01 and "--algo.kl.use_loss" in out


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gmpo_alfworld_qwen2.5-1.5b-instruct", "gigpo_alfworld_qwen2.5-1.5b-instruct"])
def test_alfworld_recipe_dry_run(recipe, tmp_path, capsys):
    pytest.importorskip("alfworld")
    games = recipe_data.alfworld_official_tree(tmp_path)
    out, cfg = _dry_run(recipe, ["--task.games_root", games], tmp_path, capsys)
    _common_checks(out, cfg)
    _eval_checks(out, cfg)
    assert "evaluation set alfworld_valid_seen: 1 per problem, temperature 0.4, top_p 1.0, 512 new tokens" in out
    _turn_layout_checks(out, cfg)
    if cfg.algo.name == "gigpo":  # the paper's γ and ω, verl-agent's normalisation and exact anchor states
        assert {k: cfg.algo.params[k] for k in ("gamma", "step_weight", "scale_by_std", "similarity")} == {
            "gamma": 0.95, "step_weight": 1.0, "scale_by_std": True, "similarity": 1.0}
        assert f'"episode_scope": "{cfg.algo.params["episode_scope"]}"' in out


# --- one CPU rehearsal step of each recipe (--cluster.rehearsal true, docs/cluster.md) --------------------------------
# The recipe YAML, then the flags below as the command line's layer over it (resolve_config): the paper's model
# swapped for the embedded model of its modality (a text model also gets the bare question, BARE_QUESTION), and only
# sizes a CPU cannot hold shrunk -- prompts per step, new tokens (evaluation sets' too), ALFWorld episodes, turns and
# games, the GPU layout (1 policy rank and 1 engine; 2 of each for ALFWorld, as the vision and ALFWorld runs of
# tests/test_openrlhf_rehearsal.py did). Objective, loss aggregation, KL, rewards, lr schedule, update scheme
# (mini-batches, micro-batches, ZeRO stage) and evaluation sets stay the recipe's. The stand-in problems are ones the
# embedded models were pre-trained on (recipe_data.py), so rewards differ within groups and the step's loss is not
# zero.
ONE_RANK = ["--steps", "1", "--cluster.gpus_per_node", "1", "--cluster.vllm_engines", "1",
            "--cluster.vllm_tensor_parallel_size", "1", "--model.threads", "1"]
# The embedded text model was pre-trained on the question alone as the only turn: under a recipe's system prompt or
# its user-turn wrapping (GVPO's Open-Reasoner-Zero text before the problem) it writes no answer tag, every reward
# is 0 and no group varies, so the rehearsal step would have no gradient to check.
BARE_QUESTION = ["--task.system_prompt", "", "--task.template", "{problem}"]
# Problems in each stand-in evaluation set of a GeoQA or math recipe: every set is sampled at step 0 and after the last
# step with the recipe's own sampling (AIME's 32 samples per problem among them), so each problem costs the run time.
EVAL_PROBLEMS = 2


@pytest.mark.parametrize("recipe,stand_in", [("gvpo_math_qwen2.5-math-7b", recipe_data.math_lighteval_train),
                                             ("cw_grpo_openrs_r1-distill-qwen-1.5b", recipe_data.open_rs_train)])
def test_text_rehearsals_ask_the_bare_question(recipe, stand_in, tmp_path):
    """What a text recipe's rehearsal step sends the embedded model is each stand-in problem alone as the only turn,
    the chat it was pre-trained on, whatever system prompt and template the recipe gives its real model."""
    from mmrl.run.build import build_task

    train = stand_in(tmp_path, 6)
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml"), "--model", "embedded:tiny-qwen2",
                        "--task.path", train, *BARE_QUESTION])
    rows = build_task(cfg).train
    assert rows and all(row["messages"] == [{"role": "user", "content": row["problem"]}] for row in rows)


def _shrunk_sets(recipe: str, files: dict[str, str], tokens: int) -> list[str]:
    """The recipe's evaluation sets on the stand-ins, each generating at most ``tokens`` new tokens."""
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml")])
    sets = [dict(s, max_new_tokens=tokens, **({"path": files[s["name"]]} if s.get("path") else {}))
            for s in cfg.evaluation.sets]
    return ["--evaluation.sets", json.dumps(sets)]


def _objective_value(algo, items: list[dict]) -> float:
    """The objective on the step's experiences at the policy they were sampled from (ratio 1, no drift from the
    reference), loss-mass weighted over groups as the actor's ``policy_loss`` metric is."""
    old = padded_cat([it["old_logprobs"].float() for it in items])
    mask = padded_cat([it["action_mask"].float() for it in items])
    per_token = padded_cat([it["advantages"].float() for it in items])  # OpenRLHF's layout: constant per response
    advantages = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    group_ids = torch.cat([it["group_ids"] for it in items]).long()
    stats = {k: float(v[0]) for k, v in items[0]["stats"].items()}
    loss, _ = algo.policy_loss(logprobs=old, old_logprobs=old, advantages=advantages, mask=mask, group_ids=group_ids,
                               ref_logprobs=old, stats=stats)
    return float(loss)


def _rehearse_recipe(recipe: str, address: str, tmp_path: Path, *flags: str):
    """(run directory, the rehearsal's resolved config, the recipe's own config, the driver's output)."""
    out = tmp_path / recipe
    config = ["--config", str(CLUSTER / f"{recipe}.yaml")]
    done = rehearse(address, out, *config, *ONE_RANK, *flags)
    cfg = parse_config([*config, "--cluster.rehearsal", "true", *ONE_RANK, *flags])
    return out, cfg, parse_config(config), done.stdout


def _check_recipe_step(out: Path, cfg, recipe_cfg, stdout: str, rows_per_set: dict[str, int], steps: int = 1) -> dict:
    """What every recipe's rehearsal run of ``steps`` steps must show; returns step 1's metrics line."""
    from mmrl.openrlhf.args import optimizer_steps
    from mmrl.run.build import build_algorithm
    from mmrl.run.schedule import build_scheduler

    check_run(out, steps, weights_show_step=False)
    # the objective the policy's loss function called is the recipe's, every hyper-parameter the YAML sets included
    trained = [json.loads(line) for line in (out / "rehearsal" / "objective.jsonl").read_text().splitlines()]
    algo = build_algorithm(cfg, cfg.task.name == "alfworld")
    assert {t["algo"] for t in trained} == {recipe_cfg.algo.name}
    assert trained[0]["params"] == dataclasses.asdict(algo)
    assert {k: trained[0]["params"][k] for k in recipe_cfg.algo.params} == recipe_cfg.algo.params
    if cfg.rollout.agent_layout == "episode":  # turn rows: tests/test_openrlhf_turns.py checks their advantages
        check_statistics(out, algo.name, 1, cfg.rollout.samples_per_prompt, recipe_cfg.algo.params)
    # the rewards differed within some group, so the step had a gradient, and the objective's value is the one
    # mmrl.algos gives on the step's experiences
    step = step_records(out)[0]
    # an untrained agent in 3-turn episodes may fail every game alike; the recipes' entropy bonus still moves it
    assert any_group_varies(out, 1) or (cfg.task.name == "alfworld" and algo.entropy_coef > 0)
    # OpenRLHF's actor_grad_norm is the step's last optimizer step only, whose mini-batch may hold no varying group
    assert math.isfinite(step["actor_grad_norm"])
    assert step["mmrl/grad_norm"] > 0 and math.isfinite(step["mmrl/grad_norm"])
    items = [it for share in step_items(out, 1).values() for it in share]
    assert step["loss"] == pytest.approx(_objective_value(algo, items), rel=0.02, abs=2e-3)
    # KL to the reference model: kept and read by the loss exactly when the recipe has a KL coefficient
    assert ("mmrl/kl_ref" in step) == (algo.reference_kl_coef() > 0) == ("--algo.kl.use_loss" in stdout)
    # the lr schedule: the recipe's shape and warm-up over this run's optimizer steps
    total = optimizer_steps(cfg)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    scheduler = build_scheduler(optimizer, cfg.optim.schedule, min(cfg.optim.warmup_steps, total), total,
                                cfg.optim.min_lr_ratio)
    for _ in range(total):
        optimizer.step()
        scheduler.step()
    assert step_records(out)[-1]["actor_lr"] == pytest.approx(scheduler.get_last_lr()[0], abs=1e-12)
    assert cfg.optim.schedule == recipe_cfg.optim.schedule and cfg.optim.lr == recipe_cfg.optim.lr
    # every evaluation set of the recipe ran, on all its problems, with its own metric: at step 0 (the base model,
    # before any update: the paper's base row) and after the last step
    assert [s["name"] for s in cfg.evaluation.sets] == [s["name"] for s in recipe_cfg.evaluation.sets]
    evaluation = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval/average" in r]
    assert recipe_cfg.run.eval_every > steps and [r["step"] for r in evaluation] == [0, steps]
    assert "loss" not in evaluation[0]  # step 0 trained nothing
    for record in evaluation:
        for s in cfg.evaluation.sets:
            assert record[f"eval/{s['name']}/problems"] == rows_per_set[s["name"]]
            assert math.isfinite(record[f"eval/{s['name']}/{s['metric']}"])
    return step


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gpg_geoqa_qwen2.5-vl-3b", "grpo_geoqa_qwen2.5-vl-3b"])
def test_geoqa_recipe_rehearsal_step(recipe, ray_address, tmp_path):
    train = recipe_data.geoqa_r1v_train(tmp_path, 20)
    sets = _shrunk_sets(recipe, {"geoqa_test": recipe_data.geoqa_r1v_test(tmp_path, EVAL_PROBLEMS)}, 16)
    out, cfg, recipe_cfg, stdout = _rehearse_recipe(
        recipe, ray_address, tmp_path, "--model", "embedded:tiny-qwen2.5-vl", "--task.path", train, *sets,
        "--rollout.prompts_per_step", "2", "--rollout.max_new_tokens", "16")
    step = _check_recipe_step(out, cfg, recipe_cfg, stdout, {"geoqa_test": EVAL_PROBLEMS})
    assert "vision_config" in json.loads((out / "model" / "config.json").read_text())  # a VL model was trained
    # the format term (weight 1.0) scores the response itself: it was 0 on every response while the reward read the
    # image pads' tail and the question as part of the completion (mmrl.openrlhf.reward.completion_text)
    assert step["mmrl/format"] > 0
    assert cfg.cluster.zero_stage == 3 and cfg.optim.schedule == "linear"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gvpo_math_qwen2.5-math-7b", "grpo_math_qwen2.5-math-7b"])
def test_math_recipe_rehearsal_step(recipe, ray_address, tmp_path):
    train = recipe_data.math_lighteval_train(tmp_path, 40)
    sets = _shrunk_sets(recipe, recipe_data.math_eval_sets(tmp_path, EVAL_PROBLEMS), 8)
    out, cfg, recipe_cfg, stdout = _rehearse_recipe(
        recipe, ray_address, tmp_path, "--model", "embedded:tiny-qwen2", "--task.path", train, *BARE_QUESTION, *sets,
        "--rollout.prompts_per_step", "4", "--rollout.max_new_tokens", "8")
    step = _check_recipe_step(out, cfg, recipe_cfg, stdout, {s["name"]: EVAL_PROBLEMS for s in cfg.evaluation.sets})
    if cfg.algo.name == "gvpo":
        # group_sum: the official loss's scale, groups_per_micro_batch (4) x the mean over groups, not the mean
        import mmrl.algos as algos

        items = [it for share in step_items(out, 1).values() for it in share]
        group_mean = _objective_value(algos.get("gvpo", beta=cfg.algo.params["beta"]), items)
        assert group_mean > 0 and step["loss"] == pytest.approx(4 * group_mean, rel=0.02)
    assert cfg.optim.minibatches == 4 and step["rollout/num_samples"] == 4 * 5  # 4 optimizer steps of one group each


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["cw_grpo_openrs_r1-distill-qwen-1.5b", "grpo_openrs_r1-distill-qwen-1.5b"])
def test_openrs_recipe_rehearsal_step(recipe, ray_address, tmp_path):
    train = recipe_data.open_rs_train(tmp_path, 30)
    sets = _shrunk_sets(recipe, recipe_data.math_eval_sets(tmp_path, EVAL_PROBLEMS), 8)
    out, cfg, recipe_cfg, stdout = _rehearse_recipe(
        recipe, ray_address, tmp_path, "--model", "embedded:tiny-qwen2", "--task.path", train, *BARE_QUESTION, *sets,
        "--rollout.prompts_per_step", "2", "--rollout.max_new_tokens", "8")
    step = _check_recipe_step(out, cfg, recipe_cfg, stdout, {s["name"]: EVAL_PROBLEMS for s in cfg.evaluation.sets})
    assert step["rollout/num_samples"] == 2 * 12  # the recipe's 12 completions per prompt
    assert "mmrl/format" in step and cfg.task.options["format_reward"] == "think_close"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gmpo_alfworld_qwen2.5-1.5b-instruct", "gigpo_alfworld_qwen2.5-1.5b-instruct",
                                    "grpo_alfworld_qwen2.5-1.5b-instruct"])
def test_alfworld_recipe_rehearsal_step(recipe, ray_address, tmp_path):
    """GiGPO on 2 policy ranks and 2 engines for 2 steps (its step-level advantages, every turn its own row, dealt to
    both ranks); GMPO and the GRPO baseline on 1 of each (the turn rows' dealing is the same for every objective)."""
    pytest.importorskip("alfworld")
    games = recipe_data.alfworld_official_tree(tmp_path, n_per_type=1)
    gigpo = recipe.startswith("gigpo")
    ranks, steps = (2, 2) if gigpo else (1, 1)
    # 4 episodes per game (the recipe: 8), 3 turns (50) and 2 validation games (128): episodes are what costs here;
    # 8 turn-samples per optimizer step (256) in micro-batches of 2 (16). The GiGPO run plays its episodes in an env
    # pool of 2 workers; the others in the rollout engine's process, as the recipes do.
    pool = ["--rollout.env_workers", "2"] if gigpo else []
    out, cfg, recipe_cfg, stdout = _rehearse_recipe(
        recipe, ray_address, tmp_path, "--model", "embedded:tiny-qwen2-agent", "--task.games_root", games,
        "--task.max_steps", "3", "--task.max_eval_games", "2", "--rollout.prompts_per_step", "2",
        "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens", "16", "--rollout.max_episode_tokens", "3072",
        *pool, "--cluster.gpus_per_node", str(ranks), "--cluster.vllm_engines", str(ranks),
        "--optim.micro_batch_size", "2", "--optim.minibatch_turns", "8", "--steps", str(steps),
        *_shrunk_sets(recipe, {}, 16))
    step = _check_recipe_step(out, cfg, recipe_cfg, stdout, {"alfworld_valid_seen": 2}, steps)
    assert cfg.rollout.agent_layout == "turn" and step["rollout/num_samples"] >= 2 * 4  # a row per turn
    for n, record in enumerate(step_records(out), start=1):
        shares = step_items(out, n)
        assert sorted(shares) == [f"rank{r}_step{n}.pt" for r in range(ranks)]  # every rank got rows
        items = [it for share in shares.values() for it in share]
        assert sum(it["rewards"].numel() for it in items) == record["rollout/num_samples"] >= 2 * 4
        assert all(it["action_mask"].sum(1).max() <= 16 for it in items)  # a row is one turn (16 new tokens)
        assert set(torch.cat([it["group_ids"] for it in items]).tolist()) <= {0, 1}  # a group per game
        assert all(torch.isfinite(it["advantages"][it["action_mask"]]).all() for it in items)


@pytest.mark.parametrize("gpus,rows,prompts,steps",
                         [(None, None, 4, 2000), ("8", None, 16, 500), ("2", "8030", 4, 2007)])
def test_gpg_geoqa_script_derives_the_batch_from_gpus(gpus, rows, prompts, steps):
    """The GeoQA script's GPUS (default: the authors' R1-V/test.sh GPUS=2) sets the GPU count, the vLLM engines, the
    prompts per step (1 prompt x 2 accumulation steps x GPUS) and the step count (one epoch of ROWS rows)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GPUS", "ROWS", "NODES")}
    env.update({"PYTHON": sys.executable, **({"GPUS": gpus} if gpus else {}), **({"ROWS": rows} if rows else {})})
    proc = subprocess.run(["bash", str(CLUSTER / "gpg_geoqa_qwen2.5-vl-3b.sh"), "--print-config"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads(proc.stdout)
    n = int(gpus or 2)
    assert (cfg["cluster"]["gpus_per_node"], cfg["cluster"]["vllm_engines"]) == (n, n)
    assert (cfg["rollout"]["prompts_per_step"], cfg["run"]["steps"]) == (prompts, steps)
    recipe = parse_config(["--config", str(CLUSTER / "gpg_geoqa_qwen2.5-vl-3b.yaml")])
    assert (recipe.rollout.prompts_per_step, recipe.run.steps, recipe.cluster.gpus_per_node) == (4, 2000, 2)


def test_gpg_geoqa_script_on_two_nodes_takes_launch_shs_layout():
    """With NODES=2 the script leaves the layout to launch.sh (GPUS GPUs per node, an engine on every GPU of the
    cluster): a one-node engine count after launch.sh's would win, and the launch would be refused."""
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if k not in ("ROWS", "GPUS_PER_NODE")},
           "PYTHON": sys.executable, "NODES": "2", "GPUS": "8", "DRY_RUN": "1"}
    proc = subprocess.run(["bash", str(CLUSTER / "gpg_geoqa_qwen2.5-vl-3b.sh"), "--print-config"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads(proc.stdout)
    assert [cfg["cluster"][k] for k in ("nodes", "gpus_per_node", "vllm_engines")] == [2, 8, 16]
    assert (cfg["rollout"]["prompts_per_step"], cfg["run"]["steps"]) == (16, 500)


BASELINES = {"grpo_geoqa_qwen2.5-vl-3b": "gpg_geoqa_qwen2.5-vl-3b",
             "grpo_math_qwen2.5-math-7b": "gvpo_math_qwen2.5-math-7b",
             "grpo_openrs_r1-distill-qwen-1.5b": "cw_grpo_openrs_r1-distill-qwen-1.5b",
             "grpo_alfworld_qwen2.5-1.5b-instruct": "gmpo_alfworld_qwen2.5-1.5b-instruct"}


@pytest.mark.parametrize("baseline", sorted(BASELINES))
def test_grpo_baseline_is_its_paper_recipe_but_for_the_objective(baseline):
    paper = parse_config(["--config", str(CLUSTER / f"{BASELINES[baseline]}.yaml")])
    grpo = parse_config(["--config", str(CLUSTER / f"{baseline}.yaml")])
    assert grpo.algo.name == "grpo" and paper.algo.name != "grpo"
    assert grpo.run.out_dir != paper.run.out_dir  # never writes into the paper run's directory
    mine, theirs = dataclasses.asdict(grpo), dataclasses.asdict(paper)
    for cfg in (mine, theirs):
        cfg.pop("algo")
        cfg["run"].pop("out_dir")
    assert mine == theirs
    # the same launch (GPG's GPUS derivation included): the baseline runs the paper's script with its own recipe
    commands = [line for line in (CLUSTER / f"{baseline}.sh").read_text().splitlines() if not line.startswith("#")]
    assert commands[-1] == f'RECIPE="$here/{baseline}.yaml" exec bash "$here/{BASELINES[baseline]}.sh" "$@"'
    assert f'"${{RECIPE:-$here/{BASELINES[baseline]}.yaml}}"' in (CLUSTER / f"{BASELINES[baseline]}.sh").read_text()
