"""The openrlhf backend's launcher: mmrl config -> OpenRLHF arguments, checked by OpenRLHF 0.11.2's own parser; the
prompt files and the reward_func file OpenRLHF loads. Nothing here needs flash_attn, vllm, Ray or a GPU."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

import mmrl.algos as algos
from mmrl.openrlhf.args import LaunchInputs, build_flags, to_argv
from mmrl.openrlhf.cli import parse_openrlhf_args
from mmrl.openrlhf.launch import resolve_launch
from mmrl.openrlhf.reward import completion_text
from mmrl.tasks import get_task
from mmrl.train import parse_config
from mmrl.trainer.config import validate

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
    assert args.actor.aux_loss_coef == 0.0  # moe.aux_loss_coef passes through (issue 6)
    uses_ref = algo == "grpo"
    assert (args.algo.kl.init_coef > 0) == uses_ref and args.algo.kl.use_loss == uses_ref
    assert args.mmrl["algo"] == algo and args.mmrl["samples_per_prompt"] == 4
    if algo == "dr_grpo":
        assert args.mmrl["params"]["max_tokens"] == cfg.rollout.max_new_tokens
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
    # args.mmrl["optimizer_steps"]); OpenRLHF warms up ceil(steps × ratio) of them
    assert args.mmrl["optimizer_steps"] == 100
    assert math.ceil(100 * args.actor.lr_warmup_ratio) == 10


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_lr_schedule_is_the_same_on_both_backends(schedule, tmp_path, embedded_model_dir):
    """optim.schedule / warmup_steps / min_lr_ratio: the local trainer's scheduler and the one OpenRLHF builds from the
    resolved flags (transformers' get_scheduler with ceil(steps × lr_warmup_ratio) warm-up steps and min_lr_rate for
    the cosine, openrlhf/utils/deepspeed/deepspeed.py) give the same lr at every optimizer step."""
    from transformers import get_scheduler

    from mmrl.trainer.schedule import build_scheduler

    extra = ["--optim.min_lr_ratio", "0.1"] if schedule == "cosine" else []
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER, "--steps", "20",
                        "--optim.warmup_steps", "3", "--optim.schedule", schedule, *extra])
    args = resolve_launch(cfg, write=False).args
    total = cfg.run.steps * cfg.optim.epochs * cfg.optim.minibatches
    assert args.mmrl["optimizer_steps"] == total  # what the trainer hands OpenRLHF as scheduler_steps

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


def test_an_existing_run_is_not_overwritten_silently(tmp_path, embedded_model_dir):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        resolve_launch(parse_config(["--backend", "openrlhf", "--out", str(tmp_path), *SMALL_CLUSTER]), write=False)
    args = resolve_launch(parse_config(["--backend", "openrlhf", "--out", str(tmp_path), "--resume",
                                        *SMALL_CLUSTER]), write=False).args
    assert args.ckpt.load_enable and args.ckpt.path == f"{tmp_path.resolve()}/checkpoints"


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

    assert [float(out[0]["rewards"][0]) for out in asyncio.run(eight_at_once())] == [1.0] * 8


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
    from mmrl.models import build_embedded
    from mmrl.openrlhf.reward import _special_tokens

    path = str(build_embedded(name=EMBEDDED_VL_NAME))
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


@pytest.mark.parametrize("coef", [0.0, 0.001])
def test_the_entropy_bonus_reaches_openrlhfs_training_step(coef, tmp_path, embedded_model_dir):
    """``--algo.entropy_coef`` turns on OpenRLHF's own entropy term (``--actor.entropy_coef``); 0 leaves it off."""
    cfg = parse_config(["--backend", "openrlhf", "--algo", "gmpo", "--algo.entropy_coef", str(coef), "--out",
                        str(tmp_path / "run"), *SMALL_CLUSTER])
    args = resolve_launch(cfg, write=False).args
    assert args.actor.entropy_coef == (coef or None) and args.mmrl["params"]["entropy_coef"] == coef
