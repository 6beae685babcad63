"""The openrlhf backend's launcher: mmrl config -> OpenRLHF arguments, checked by OpenRLHF 0.11.2's own parser; the
prompt files and the reward_func file OpenRLHF loads. Nothing here needs flash_attn, vllm, Ray or a GPU."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from pathlib import Path

import pytest
import torch

import mmrl.algos as algos
from mmrl.openrlhf.args import LaunchInputs, build_flags, to_argv
from mmrl.openrlhf.checkpoint import remove_tag, rotate_tags
from mmrl.openrlhf.cli import parse_openrlhf_args
from mmrl.openrlhf.launch import prepare, resolve_launch
from mmrl.openrlhf.reward import completion_text
from mmrl.run.config import validate
from mmrl.tasks import get_task
from mmrl.train import parse_config

SMALL_CLUSTER = ["--cluster.nodes", "1", "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2",
                 "--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", "4", "--steps", "3"]


@pytest.fixture
def math_file(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(12)))
    return path


def task_flags(task: str, math_file) -> list[str]:
    return ["--task.path", str(math_file), "--task.eval_fraction", "0.25"] if task == "math" else []


@pytest.mark.parametrize("task", ["arithmetic", "countdown", "math"])
@pytest.mark.parametrize("algo", sorted(algos.ALGORITHMS))
def test_every_algo_and_task_gives_a_namespace_openrlhf_accepts(algo, task, tmp_path, math_file, embedded_model_dir):
    params = ["--algo.kl_coef", "0.04"] if algo == "grpo" else []
    cfg = parse_config(["--backend", "openrlhf", "--algo", algo, "--task", task, "--out", str(tmp_path / "run"),
                        *SMALL_CLUSTER, *params, *task_flags(task, math_file)])
    launch = resolve_launch(cfg, write=True)
    args = launch.args  # built by OpenRLHF's train_ppo_ray parser and its checks
    assert args.actor.model_name_or_path == str(embedded_model_dir.resolve())
    assert (args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.batch_size) == (4, 4, 16)
    assert (args.actor.num_gpus_per_node, args.vllm.num_engines, args.ds.zero_stage) == (2, 2, 2)
    assert args.train.colocate_all and args.vllm.enable_sleep and args.critic.model_name_or_path is None
    assert args.reward.remote_url == [launch.files["reward_func"]] and args.train.agent_func_path is None
    assert args.data.apply_chat_template and args.data.input_key == "messages" and args.data.label_key == "label"
    assert args.actor.aux_loss_coef == 0.0  # moe.aux_loss_coef passes through
    uses_ref = algo == "grpo"
    assert (args.algo.kl.init_coef > 0) == uses_ref and args.algo.kl.use_loss == uses_ref
    assert args.mmrl.algo == algo and args.mmrl.samples_per_prompt == 4
    if algo == "dr_grpo":
        assert args.mmrl.params["max_tokens"] == cfg.rollout.max_new_tokens
    rows = [json.loads(line) for line in open(launch.files["train"])]
    expected = get_task(task, **cfg.task.options).train
    assert len(rows) == len(expected) and rows[0]["messages"] == expected[0]["messages"]
    assert json.loads(rows[0]["label"])["answer"] == expected[0]["answer"]


def test_run_steps_cover_the_prompt_set(tmp_path, embedded_model_dir):
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--steps", "50",
                        "--optim.epochs", "2", "--optim.warmup_steps", "10"])
    args = resolve_launch(cfg, write=False).args
    rows = len(get_task("arithmetic").train)  # 80 prompts, 4 per step: 20 steps per episode
    assert (args.data.max_samples, args.train.num_episodes, args.train.max_epochs) == (rows, 3, 2)
    assert args.actor.lr_scheduler == "constant_with_warmup"
    # the lr schedule spans the run's 50 × 2 optimizer steps, not the 3 episodes' 120 (mmrl's trainer hands the actors
    # args.mmrl.optimizer_steps); OpenRLHF warms up ceil(steps × ratio) of them
    assert args.mmrl.optimizer_steps == 100
    assert math.ceil(100 * args.actor.lr_warmup_ratio) == 10


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_lr_schedule_is_the_same_on_both_backends(schedule, tmp_path, embedded_model_dir):
    """optim.schedule / warmup_steps / min_lr_ratio: the local trainer's scheduler and the one OpenRLHF builds from the
    resolved flags (transformers' get_scheduler with ceil(steps × lr_warmup_ratio) warm-up steps and min_lr_rate for
    the cosine, openrlhf/utils/deepspeed/deepspeed.py) give the same lr at every optimizer step."""
    from transformers import get_scheduler

    from mmrl.run.schedule import build_scheduler

    extra = ["--optim.min_lr_ratio", "0.1"] if schedule == "cosine" else []
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--steps", "20",
                        "--optim.warmup_steps", "3", "--optim.schedule", schedule, *extra])
    args = resolve_launch(cfg, write=False).args
    total = cfg.run.steps * cfg.optim.epochs * cfg.optim.minibatches
    assert args.mmrl.optimizer_steps == total  # what the trainer hands OpenRLHF as scheduler_steps

    def lrs(scheduler, optimizer):
        out = []
        for _ in range(total):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    local_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    local = lrs(build_scheduler(local_opt, schedule, 3, total, cfg.optim.min_lr_ratio), local_opt)
    ray_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.actor.adam.lr)
    kwargs = {"min_lr_rate": args.actor.min_lr_ratio} if "min_lr" in args.actor.lr_scheduler else {}
    warmup = math.ceil(total * args.actor.lr_warmup_ratio)
    ray = lrs(get_scheduler(args.actor.lr_scheduler, ray_opt, num_warmup_steps=warmup, num_training_steps=total,
                            scheduler_specific_kwargs=kwargs), ray_opt)
    assert local == pytest.approx(ray)
    assert local[0] == 0.0 and local[3] == pytest.approx(cfg.optim.lr)  # warm-up from 0, peak after 3 steps
    last = {"constant": cfg.optim.lr, "linear": cfg.optim.lr / (total - 3), "cosine": None}[schedule]
    if last is not None:
        assert local[-1] == pytest.approx(last)
    else:
        assert cfg.optim.lr * 0.1 < local[-1] < cfg.optim.lr * 0.11  # down to min_lr_ratio × lr


def test_min_lr_ratio_needs_the_cosine_schedule():
    with pytest.raises(ValueError, match="optim.min_lr_ratio is the floor of optim.schedule cosine"):
        validate(parse_config(["--optim.min_lr_ratio", "0.1"]))
    with pytest.raises(ValueError, match="optim.schedule must be one of"):
        validate(parse_config(["--optim.schedule", "step"]))


def test_moe_controls_and_extra_flags_pass_through(tmp_path, embedded_model_dir):
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--moe.aux_loss_coef",
                        "0.01", "--cluster.extra", '{"vllm.enforce_eager": true, "--actor.entropy_coef": 0.0}'])
    args = resolve_launch(cfg, write=False).args
    assert args.actor.aux_loss_coef == 0.01 and args.vllm.enforce_eager and args.actor.entropy_coef == 0.0


def test_lora_options_reach_openrlhfs_own_lora_flags(tmp_path, embedded_model_dir):
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--model.lora_rank", "8",
                        "--model.lora_alpha", "32", "--model.lora_targets", "q_proj,v_proj"])
    args = resolve_launch(cfg, write=False).args  # parsed by OpenRLHF 0.11.2's train_ppo_ray parser
    assert (args.ds.lora.rank, args.ds.lora.alpha, args.ds.lora.target_modules) == (8, 32, ["q_proj", "v_proj"])
    assert args.ds.lora.dropout == 0  # as the local trainer: the training forward is the sampling function
    full = resolve_launch(parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER]),
                          write=False).args
    assert full.ds.lora.rank == 0


@pytest.mark.parametrize("flags,message", [
    (["--cluster.extra", '{"actor.no_such_flag": 1}'], "OpenRLHF rejected the arguments"),
    (["--algo", "gvpo", "--optim.micro_batch_size", "2"], "gvpo needs whole groups in a micro-batch"),
    (["--optim.micro_batch_size", "3"], "must split evenly into 2 GPUs"),
    (["--cluster.vllm_engines", "1"], "must equal cluster.nodes × cluster.gpus_per_node (2)"),
    (["--moe.routing_replay", "true"], "moe.routing_replay is not supported by the openrlhf backend"),
    (["--model", "/no/such/dir"], "no such directory"),
    (["--cluster.extra", '{"algo.advantage.is_correction_level": "token"}'], "importance-sampling correction"),
])
def test_bad_launches_fail_at_start_with_one_line(flags, message, tmp_path, embedded_model_dir):
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, *flags])
    with pytest.raises(ValueError) as err:
        resolve_launch(cfg, write=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def openrlhf_cfg(out, *flags):
    return parse_config(["--backend", "openrlhf", "--out", str(out), *SMALL_CLUSTER, *flags])


def checkpointed(out, step: int) -> None:
    """The names OpenRLHF's DeepSpeed checkpoint of the policy leaves at ``step`` (tests/deepspeed_checkpoint.py
    writes a real one): the tag's folder with each rank's states and OpenRLHF's metric, the ``latest`` tag and
    DeepSpeed's recovery script."""
    actor = out / "checkpoints" / "_actor"
    (actor / f"global_step{step}").mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "metric.json"):
        (actor / f"global_step{step}" / name).write_text("states")
    (actor / "latest").write_text(f"global_step{step}")
    (actor / "zero_to_fp32.py").write_text("script")


def test_an_existing_run_is_not_overwritten_silently(tmp_path, embedded_model_dir):
    out = tmp_path / "run"
    _, owner = prepare(openrlhf_cfg(out))
    owner.lock.release()
    checkpointed(out, 2)
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        prepare(openrlhf_cfg(out))
    launch, owner = prepare(openrlhf_cfg(out, "--resume"))
    owner.lock.release()
    assert launch.args.ckpt.load_enable and launch.args.ckpt.path == f"{out.resolve()}/checkpoints"


def test_the_launch_holds_the_run_directory(tmp_path, embedded_model_dir):
    """The driver's claim is the local trainer's: while it holds the folder, no run of either backend writes there."""
    import os

    from mmrl.run.run_dir import claim

    out = tmp_path / "run"
    _, owner = prepare(openrlhf_cfg(out))
    with pytest.raises(ValueError, match=rf"is in use by process {os.getpid()}"):
        prepare(openrlhf_cfg(out, "--run.overwrite", "true"))
    with pytest.raises(ValueError, match="is in use by process"):
        claim(parse_config(["--out", str(out), "--run.overwrite", "true"]))
    owner.lock.release()


def test_a_users_folder_is_refused_and_left_as_it_was(tmp_path, embedded_model_dir):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"learning_rate": 3}')
    (mine / "notes.txt").write_text("mine")
    for flags in ([], ["--run.overwrite", "true"]):
        with pytest.raises(ValueError, match="is not empty and is not an mmrl run") as refused:
            prepare(openrlhf_cfg(mine, *flags))
        assert "overwrite" not in str(refused.value)
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "notes.txt"]
    assert (mine / "config.json").read_text() == '{"learning_rate": 3}'


def test_a_refused_launch_leaves_nothing_behind(tmp_path, embedded_model_dir):
    out = tmp_path / "new" / "run"
    with pytest.raises(ValueError, match="OpenRLHF rejected the arguments"):
        prepare(openrlhf_cfg(out, "--cluster.extra", '{"actor.no_such_flag": 1}'))
    with pytest.raises(ValueError, match="has no checkpoint"):
        prepare(openrlhf_cfg(out, "--resume"))
    assert list(tmp_path.iterdir()) == []


def test_resume_keeps_the_run_as_configured(tmp_path, embedded_model_dir):
    out = tmp_path / "run"
    _, owner = prepare(openrlhf_cfg(out, "--algo", "grpo"))
    owner.lock.release()
    saved = (out / "config.json").read_text()
    assert json.loads(saved)["algo"]["name"] == "grpo"
    checkpointed(out, 2)
    with pytest.raises(ValueError, match="--resume cannot change algo.name"):
        prepare(openrlhf_cfg(out, "--resume", "--algo", "gpg"))
    _, owner = prepare(openrlhf_cfg(out, "--resume", "--steps", "5"))
    owner.lock.release()
    assert (out / "config.json").read_text() == saved  # written once; the resume's change goes to resumes.jsonl
    assert json.loads((out / "resumes.jsonl").read_text())["changed"] == {"run.steps": [3, 5]}


def test_resume_of_a_finished_run_says_so(tmp_path, embedded_model_dir):
    out = tmp_path / "run"
    _, owner = prepare(openrlhf_cfg(out))
    owner.lock.release()
    checkpointed(out, 3)  # SMALL_CLUSTER runs 3 steps
    with pytest.raises(ValueError, match=r"is finished \(its last checkpoint, .*global_step3, is at step 3 of "
                                         r"run.steps 3\)"):
        prepare(openrlhf_cfg(out, "--resume"))


def test_overwrite_replaces_only_what_the_run_wrote(tmp_path, embedded_model_dir):
    out = tmp_path / "run"
    _, owner = prepare(openrlhf_cfg(out))
    owner.lock.release()
    checkpointed(out, 3)
    (out / "model").mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints" / "mine.txt").write_text("mine too")
    _, owner = prepare(openrlhf_cfg(out, "--run.overwrite", "true"))
    owner.lock.release()
    assert not (out / "checkpoints" / "_actor").exists() and not (out / "model").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "checkpoints" / "mine.txt").read_text() == "mine too"
    assert (out / "openrlhf" / "train.jsonl").is_file() and json.loads((out / "config.json").read_text())


def test_overwrite_keeps_a_users_files_among_the_policy_checkpoints(tmp_path, embedded_model_dir, caplog):
    """Only what DeepSpeed, OpenRLHF and mmrl write in ``checkpoints/_actor`` and ``model/`` goes; a user's folder
    beside the tags, a file inside one and a model card stay (and are named), and the next overwrite keeps them too."""
    out = tmp_path / "run"
    _, owner = prepare(openrlhf_cfg(out))
    owner.lock.release()
    checkpointed(out, 2)
    checkpointed(out, 3)
    actor = out / "checkpoints" / "_actor"
    (actor / "global_step3" / "mmrl_replay").mkdir()
    (actor / "global_step3" / "mmrl_replay" / "state.json").write_text("{}")
    (actor / "global_step3" / "eval.json").write_text("mine")
    (actor / "analysis").mkdir()
    (actor / "analysis" / "plot.txt").write_text("mine too")
    # the final model as OpenRLHF saves it (the files of a rehearsal run's model/), and a model card of the user's
    (out / "model").mkdir()
    for name in ("chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                 "tokenizer.json", "tokenizer_config.json", "README.md"):
        (out / "model" / name).write_text("x")
    # a rehearsal's records and OpenRLHF's event files, each folder with a note of the user's
    for name in ("rehearsal/objective.jsonl", "rehearsal/rank1_step2.pt", "rehearsal/notes.md",
                 "tensorboard/run/events.out.tfevents.1.host", "tensorboard/run/notes.md", "openrlhf/notes.md"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    record = json.loads((out / ".mmrl-run.json").read_text())  # a run with --run.tensorboard, rehearsed
    (out / ".mmrl-run.json").write_text(json.dumps({**record, "files": [*record["files"], "tensorboard", "rehearsal"]}))
    for _ in range(2):
        with caplog.at_level(logging.WARNING, logger="mmrl"):
            _, owner = prepare(openrlhf_cfg(out, "--run.overwrite", "true", "--run.tensorboard", "true",
                                            "--cluster.rehearsal", "true"))
        owner.lock.release()
        assert sorted(p.relative_to(actor).as_posix() for p in actor.rglob("*")) == [
            "analysis", "analysis/plot.txt", "global_step3", "global_step3/eval.json"]
        assert [p.name for p in (out / "model").iterdir()] == ["README.md"]
        assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/**/notes.md")) == [
            "openrlhf/notes.md", "rehearsal/notes.md", "tensorboard/run/notes.md"]
        assert not list(out.glob("rehearsal/*.jsonl")) and not list(out.glob("tensorboard/run/events.*"))
        assert all(f"checkpoints/_actor/{name}" in caplog.text for name in ("analysis", "global_step3/eval.json"))
        assert "model/README.md" in caplog.text


def test_dry_run_prints_the_launch_and_writes_nothing(tmp_path, capsys, embedded_model_dir):
    from mmrl.train import main

    out = tmp_path / "run"
    assert main(["--backend", "openrlhf", "--algo", "gpg", "--dry-run", "--out", str(out), *SMALL_CLUSTER]) == 0
    printed = capsys.readouterr().out
    assert "--actor.model_name_or_path" in printed and "--reward.remote_url" in printed
    assert "objective: gpg" in printed and not out.exists()
    assert main(["--dry-run"]) == 2 and "needs --backend openrlhf" in capsys.readouterr().err


def test_agent_tasks_get_the_agent_executor_flag():
    flags = build_flags(parse_config(["--backend", "openrlhf", *SMALL_CLUSTER]),
                        LaunchInputs("m", "train.jsonl", "", "", "/x/openrlhf_agent.py", train_rows=40), 0.0, "/out")
    args, _ = parse_openrlhf_args(to_argv(flags))
    assert args.train.agent_func_path == "/x/openrlhf_agent.py"
    assert args.reward.remote_url == ["agent"]  # OpenRLHF's own convention when an agent file is given


def test_vision_rows_become_openrlhf_image_prompts(tmp_path):
    from PIL import Image

    from mmrl.openrlhf.data import export_rows

    image = Image.new("RGB", (8, 6), "red")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                       {"type": "text", "text": "Where is it?"}]}],
             "answer": [1, 2, 3, 4]}]
    most = export_rows(rows, tmp_path / "train.jsonl", "train", "grounding",
                       annotate=lambda row: {"coord_frame": "pixels", "original_hw": [[6, 8]]})
    line = json.loads((tmp_path / "train.jsonl").read_text())
    assert most == 1 and line["messages"][0]["content"][0] == {"type": "image"}
    assert Image.open(line["images"][0]).size == (8, 6)
    assert json.loads(line["label"]) == {"answer": [1, 2, 3, 4], "coord_frame": "pixels", "original_hw": [[6, 8]]}
    flags = build_flags(parse_config(["--backend", "openrlhf", *SMALL_CLUSTER]),
                        LaunchInputs("m", "t.jsonl", "", "r.py", "", train_rows=40, max_images=most), 0.0, "/out")
    args, _ = parse_openrlhf_args(to_argv(flags))
    assert (args.data.image_key, args.data.max_images_per_prompt) == ("images", 1)


def test_generated_reward_func_file_scores_like_the_task(tmp_path, embedded_model_dir):
    """The file is loaded and called by OpenRLHF's own SingleTurnAgentExecutor code, as inside a vLLM actor."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor
    from transformers import AutoTokenizer

    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--task.format_weight", "0.5"])
    launch = resolve_launch(cfg, write=True)
    executor = SingleTurnAgentExecutor(launch.files["reward_func"])
    row = json.loads(open(launch.files["train"]).readline())
    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    prompt = tok.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
    answer = json.loads(row["label"])["answer"]
    cases = {f"<answer>{answer}</answer><|im_end|>": 1.5, "<answer>-1</answer>": 0.5, "no tags at all": 0.0}
    for completion, expected in cases.items():
        out = asyncio.run(executor._fetch_rewards_via_func([prompt + completion], [prompt], [row["label"]]))[0]
        assert float(out["rewards"][0]) == expected
        assert float(out["extra_logs"]["mmrl/accuracy"][0]) == float(expected >= 1)
    broken = asyncio.run(executor._fetch_rewards_via_func([prompt + "<answer>4</answer>"], [prompt], ["{bad json"]))
    # a malformed label never raises: accuracy scores 0 (nothing to compare against), the format part still counts
    assert float(broken[0]["rewards"][0]) == 0.5 and float(broken[0]["extra_logs"]["mmrl/accuracy"][0]) == 0.0


def test_concurrent_first_calls_of_the_reward_func_file_all_score(tmp_path, embedded_model_dir):
    """OpenRLHF scores the samples of a step at once, each in its own thread (``asyncio.to_thread``); the first calls
    of a fresh file all arrive while its reward is still being built. Each must score, not fail on a half-built state
    (a KeyError that OpenRLHF only logs, so the step then failed with "reward_model_group is required")."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor
    from transformers import AutoTokenizer

    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER])
    launch = resolve_launch(cfg, write=True)
    executor = SingleTurnAgentExecutor(launch.files["reward_func"])
    row = json.loads(open(launch.files["train"]).readline())
    prompt = AutoTokenizer.from_pretrained(embedded_model_dir).apply_chat_template(
        row["messages"], tokenize=False, add_generation_prompt=True)
    answer = json.loads(row["label"])["answer"]

    async def eight_at_once():
        return await asyncio.gather(*[executor._fetch_rewards_via_func(
            [f"{prompt}<answer>{answer}</answer>"], [prompt], [row["label"]]) for _ in range(8)])

    assert [float(out[0]["rewards"][0]) for out in asyncio.run(eight_at_once())] == [1.5] * 8  # right and well-formed


def test_completion_text_drops_the_prompt_and_special_tokens():
    assert completion_text("PROMPT<b>ans</b><|im_end|>", "PROMPT", ["<|im_end|>"]) == "<b>ans</b>"
    assert completion_text("PROMPX rest", "PROMPT", []) == "X rest"


def test_completion_text_of_a_vision_prompt(tmp_path):
    """What OpenRLHF's single-turn executor hands the reward for an image prompt: the query is decoded from the
    prompt's tokens after ``process_prompt_with_images`` expanded ``<|image_pad|>`` (one per image token), the prompt
    is the chat template's text with one. The response alone must come out (it was the question, the image pads'
    tail and ``assistant``, so a format reward was always 0: the GPG GeoQA recipe's rehearsal step found it)."""
    pytest.importorskip("openrlhf")
    from openrlhf.utils.vlm_utils import process_prompt_with_images
    from PIL import Image
    from transformers import AutoProcessor

    from mmrl.cache import EMBEDDED_VL_NAME
    from mmrl.models import shipped_model
    from mmrl.openrlhf.reward import _special_tokens

    path = str(shipped_model(EMBEDDED_VL_NAME))
    processor = AutoProcessor.from_pretrained(path)
    image = tmp_path / "a.png"
    Image.new("RGB", (112, 112), "white").save(image)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How long is AB?"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids, _, _ = process_prompt_with_images(processor, prompt, [str(image)])
    response = "<think>5-2=3</think><answer>3</answer>"
    response_ids = processor.tokenizer(response + "<|im_end|>", add_special_tokens=False)["input_ids"]
    query = processor.tokenizer.decode(list(prompt_ids) + response_ids, skip_special_tokens=False)
    assert prompt.count("<|image_pad|>") == 1 and query.count("<|image_pad|>") > 1
    assert completion_text(query, prompt, _special_tokens(path)) == response


def model_with_its_own_code(embedded_model_dir, tmp_path):
    """A copy of the embedded model's configs whose config.json names code of its own (auto_map)."""
    model = tmp_path / "own-code-model"
    model.mkdir()
    for f in embedded_model_dir.iterdir():
        if f.suffix == ".json" or f.name.startswith("tokenizer"):
            (model / f.name).write_bytes(f.read_bytes())
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_own.OwnModel"}
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_model_with_its_own_code_launches_only_when_trusted(tmp_path, embedded_model_dir):
    """OpenRLHF's loaders always pass trust_remote_code=True: the launcher enforces model.trust_remote_code."""
    model = model_with_its_own_code(embedded_model_dir, tmp_path)
    base = ["--backend", "openrlhf", "--out", str(tmp_path / "run"), *SMALL_CLUSTER, "--model", str(model)]
    with pytest.raises(ValueError) as err:
        resolve_launch(parse_config(base), write=False)
    assert "config.json name it under auto_map" in str(err.value) and "--model.trust_remote_code true" in \
        str(err.value) and "\n" not in str(err.value)
    args = resolve_launch(parse_config([*base, "--model.trust_remote_code", "true"]), write=False).args
    assert args.mmrl.trust_remote_code is True
    plain = resolve_launch(parse_config(base[:-2]), write=False).args
    assert plain.mmrl.trust_remote_code is False  # the rehearsal's rollout actors follow it


def test_dry_run_of_an_image_task_checks_the_model_family(tmp_path, capsys, embedded_model_dir):
    from mmrl.train import main

    flags = ["--backend", "openrlhf", "--dry-run", "--task", "grounding", "--out", str(tmp_path / "run"),
             *SMALL_CLUSTER]
    assert main([*flags, "--model", str(embedded_model_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a Qwen-VL model" in err and "'grounding' has images" in err and len(err.splitlines()) == 1
    # a hub id that is not in the local cache: the dry run says, in one line, what it could not check
    assert main([*flags, "--model", "nobody-here/no-such-vl-model"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: model:")]
    assert len(notes) == 1 and "did not check its family" in notes[0] and "offline" in notes[0]


def test_secret_flags_of_cluster_extra_are_masked_in_the_launch_and_config_json(tmp_path, capsys,
                                                                                embedded_model_dir):
    from mmrl.openrlhf.launch import describe
    from mmrl.run.masking import is_secret

    extra = '{"--logger.wandb.key": "wk-123456", "actor.entropy_coef": 0.0}'
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--cluster.extra", extra])
    launch = resolve_launch(cfg, write=False)
    assert launch.args.logger.wandb.key == "wk-123456"  # OpenRLHF still gets the value
    text = describe(cfg, launch)
    assert "wk-123456" not in text and "--logger.wandb.key '***'" in text and "--actor.entropy_coef 0.0" in text
    assert "set it in WANDB_API_KEY instead" in text
    _, owner = prepare(openrlhf_cfg(tmp_path / "run", "--cluster.extra", extra))  # what a real launch writes
    owner.lock.release()
    saved = (tmp_path / "run" / "config.json").read_text()
    assert "wk-123456" not in saved and json.loads(saved)["cluster"]["extra"]["--logger.wandb.key"] == "***"
    assert [f for f in ("data.input_key", "rollout.max_new_tokens", "ckpt.best_metric_key", "logger.wandb.key",
                        "api_secret", "hub_token") if is_secret(f)] == ["logger.wandb.key", "api_secret", "hub_token"]


def test_url_passwords_are_masked_in_the_launch_and_a_resume_asks_for_them_again(tmp_path, embedded_model_dir):
    from mmrl.openrlhf.args import unmasked_extra
    from mmrl.openrlhf.launch import check_devices, describe

    url = "http://bob:PW-333@rm:5000/score"
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--cluster.ray_address",
                        "ray://alice:PW-111@head:10001", "--cluster.extra", json.dumps({"reward.remote_url": url})])
    launch = resolve_launch(cfg, write=False)
    assert launch.args.reward.remote_url == [url]  # OpenRLHF still gets the value
    text = describe(cfg, launch)
    assert "PW-" not in text and "ray://alice:***@head:10001" in text and "http://bob:***@rm:5000/score" in text
    # what a resume reads back from config.json: the masked URL is left out, with one line; the address is asked for
    kept, dropped = unmasked_extra({"reward.remote_url": "http://bob:***@rm:5000/score", "actor.entropy_coef": 0})
    assert kept == {"actor.entropy_coef": 0}
    assert dropped == ["cluster.extra: reward.remote_url holds a URL whose password the saved config.json masks, "
                       "and is left out; give it again in --cluster.extra"]
    cfg.cluster.ray_address = "ray://alice:***@head:10001"
    with pytest.raises(ValueError, match=r"cluster.ray_address: .* holds the password that config.json masks; give "
                                         r"--cluster.ray_address again"):
        check_devices(cfg)


@pytest.mark.parametrize("coef", [0.0, 0.001])
def test_the_entropy_bonus_reaches_openrlhfs_training_step(coef, tmp_path, embedded_model_dir):
    """``--algo.entropy_coef`` turns on OpenRLHF's own entropy term (``--actor.entropy_coef``); 0 leaves it off."""
    cfg = parse_config(["--backend", "openrlhf", "--algo", "gmpo", "--algo.entropy_coef", str(coef), "--out",
                        str(tmp_path / "run"), *SMALL_CLUSTER])
    args = resolve_launch(cfg, write=False).args
    assert args.actor.entropy_coef == (coef or None) and args.mmrl.params["entropy_coef"] == coef


def tag(actor, name: str, metric: float | None = None, age: int = 0) -> None:
    """A checkpoint tag as DeepSpeed and OpenRLHF write it (a rank's states and the metric), ``age`` seconds old."""
    folder = actor / name
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"x" * 100)
    (folder / "metric.json").write_text(json.dumps({"metric_key": "acc" if metric is not None else None,
                                                    "metric_value": metric}))
    then = time.time() - age
    os.utime(folder, (then, then))


def read_metric(folder: str) -> float | None:
    return json.loads((Path(folder) / "metric.json").read_text())["metric_value"]


def test_rotation_removes_old_checkpoints_files_only(tmp_path, caplog):
    """OpenRLHF's order (no metric first, then the worst, then the oldest; best tags kept and not counted) down to
    ``max_num - 1`` before a save, but only tags and only their writers' files: OpenRLHF's own rotation removed the
    oldest folder of ``_actor`` whole, a user's folder there included."""
    actor = tmp_path / "_actor"
    (actor / "analysis").mkdir(parents=True)  # the oldest folder of all
    (actor / "analysis" / "plot.txt").write_text("mine")
    os.utime(actor / "analysis", (0, 0))
    tag(actor, "global_step1", None, age=30)
    tag(actor, "global_step2", 0.5, age=20)
    tag(actor, "global_step3", 0.0, age=10)
    tag(actor, "best_global_step2", 0.5, age=20)
    (actor / "global_step1" / "eval.json").write_text("mine too")
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        gone = rotate_tags(actor, "global_step4", 2, 1000, read_metric)
    # 3 regular tags, room for 1 beside the new one: global_step1 (no metric), then global_step3 (metric 0.0 < 0.5)
    assert [p.name for p in gone] == ["global_step1", "global_step3"]
    assert sorted(p.relative_to(actor).as_posix() for p in actor.rglob("*") if p.is_file()) == [
        "analysis/plot.txt", "best_global_step2/metric.json", "best_global_step2/mp_rank_00_model_states.pt",
        "global_step1/eval.json", "global_step2/metric.json", "global_step2/mp_rank_00_model_states.pt"]
    assert "global_step1: removed its states; left eval.json" in caplog.text
    # the folder left with the user's file is no checkpoint: it neither counts nor goes at the next rotation
    assert rotate_tags(actor, "global_step5", 2, 1000, read_metric) == []
    # a new best replaces the earlier best only; a size limit removes regular tags until the rest fits
    assert [p.name for p in rotate_tags(actor, "best_global_step5", 2, 1000, read_metric)] == ["best_global_step2"]
    tag(actor, "global_step5", 0.9, age=0)
    assert [p.name for p in rotate_tags(actor, "global_step6", 10, 150 / 1024 ** 3, read_metric)] == ["global_step2"]
    assert (actor / "analysis" / "plot.txt").is_file() and (actor / "global_step1" / "eval.json").is_file()


def test_a_tag_loses_its_model_states_last_and_a_replay_write_that_never_finished(tmp_path, monkeypatch):
    """A removal cut short leaves a tag the next rotation still finds (its model states go last), and a replay
    store's unfinished write (``.tmp-*``, mmrl's own) goes with the tag."""
    folder = tmp_path / "global_step2"
    (folder / ".tmp-abc12_x9").mkdir(parents=True)  # as tempfile.mkdtemp names it
    (folder / ".tmp-abc12_x9" / "tensors.safetensors").write_text("half")
    (folder / ".tmp-notes").mkdir()  # a user's folder of the same prefix stays
    (folder / ".tmp-notes" / "notes.txt").write_text("mine")
    for name in ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt",
                 "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        (folder / name).write_text("states")
    order = []
    unlink = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: (order.append(self.name), unlink(self, *a, **k)))
    assert remove_tag(folder) == ([".tmp-abc12_x9", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                   "mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"],
                                  [".tmp-notes"])
    assert order[-1] == "mp_rank_00_model_states.pt" and os.listdir(folder) == [".tmp-notes"]


def test_removing_a_tag_leaves_what_its_writers_did_not_write(tmp_path):
    folder = tmp_path / "global_step2"
    (folder / "mmrl_replay").mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt", "metric.json",
                 "mmrl_replay/state.json", "mmrl_replay/tensors.safetensors", "mmrl_replay/SHA256SUMS"):
        (folder / name).write_text("written by the run")
    assert remove_tag(folder) == (["metric.json", "mmrl_replay", "mp_rank_00_model_states.pt",
                                   "zero_pp_rank_1_mp_rank_00_optim_states.pt"], [])
    assert not folder.exists()
    (folder / "mmrl_replay").mkdir(parents=True)
    for name in ("mp_rank_00_model_states.pt", "mmrl_replay/state.json", "mmrl_replay/notes.txt", "states.md"):
        (folder / name).write_text("x")
    assert remove_tag(folder) == (["mp_rank_00_model_states.pt"], ["mmrl_replay", "states.md"])
    assert sorted(p.name for p in folder.rglob("*")) == ["mmrl_replay", "notes.txt", "states.md"]


def test_the_actor_spec_refuses_an_unknown_missing_or_mistyped_field_at_launch(tmp_path, embedded_model_dir):
    """``args.mmrl`` is built once on the driver: a misspelt, missing or mistyped field fails there."""
    import dataclasses

    from mmrl.openrlhf.spec import ActorSpec

    cfg = parse_config(["--backend", "openrlhf", "--algo", "grpo", "--out", str(tmp_path / "run"), *SMALL_CLUSTER])
    spec = resolve_launch(cfg, write=False).args.mmrl
    assert isinstance(spec, ActorSpec) and spec.algo == "grpo"
    fields = dataclasses.asdict(spec)
    assert ActorSpec(**fields) == spec
    with pytest.raises(TypeError, match="samples_per_promt"):
        ActorSpec(**fields, samples_per_promt=4)
    with pytest.raises(TypeError, match="metrics_path"):
        ActorSpec(**{k: v for k, v in fields.items() if k != "metrics_path"})
    with pytest.raises(TypeError, match=r"ActorSpec.steps: expected int, got '3'"):
        ActorSpec(**{**fields, "steps": "3"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.steps = 4


def actor_spec_reads(source: str) -> set[str]:
    """Every field read off an `ActorSpec` in ``source``: ``<...>.mmrl.<field>``, and ``<name>.<field>`` for a name
    bound to one (a parameter annotated ``ActorSpec``, or ``name = <...>.mmrl``)."""
    import ast

    tree = ast.parse(source)
    names = {"mmrl_spec"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None and "ActorSpec" in ast.unparse(node.annotation):
            names.add(node.arg)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "mmrl":
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            if (isinstance(value, ast.Attribute) and value.attr == "mmrl") or \
                    (isinstance(value, ast.Name) and value.id in names):
                reads.add(node.attr)
    return reads


def test_every_field_the_backend_reads_off_the_actor_spec_exists():
    """The actors read ``args.mmrl`` on GPU nodes: a misspelt field there fails here instead."""
    import dataclasses

    from mmrl.openrlhf.spec import ActorSpec

    assert actor_spec_reads("def f(spec: ActorSpec):\n    return spec.stpes\n") == {"stpes"}  # the check can fail
    assert actor_spec_reads("def f(args):\n    s = args.mmrl\n    return s.steps + args.mmrl.resume\n") == \
        {"steps", "resume"}
    fields = {f.name for f in dataclasses.fields(ActorSpec)}
    source = Path(__file__).resolve().parents[1] / "mmrl" / "openrlhf"
    read = {path.name: actor_spec_reads(path.read_text()) for path in sorted(source.glob("*.py"))}
    assert set().union(*read.values()) >= {"algo", "params", "samples_per_prompt", "optimizer_steps", "eval_sets"}
    unknown = {name: sorted(r - fields) for name, r in read.items() if r - fields}
    assert not unknown, f"fields read off args.mmrl that ActorSpec does not have: {unknown}"
