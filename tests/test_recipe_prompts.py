"""The paper recipes' prompts, character for character against the authors' templates.

Each recipe's task is built as a run builds it for the recipe's own (non-embedded) model -- the same
``build_task`` / ``build_eval_sets`` path, with a real model's ``pretrained_options`` applied under the recipe's
options -- on stand-in files in the datasets' real layouts (tests/recipe_data.py). The first training prompt and the
first prompt of the first evaluation set are rendered through SmolLM2-135M-Instruct's tokenizer (a real chat
template; `make setup` installs it, and only the tokenizer is loaded) with mmrl's prompt encoder, decoded, and
compared with the authors' strings placed in the same chat turns. The authors' strings are written out here as their
code has them, so a recipe that drifts from them (a worked example switched on, a cut template, one space) fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import recipe_data

from mmrl.run.build import build_task
from mmrl.run.eval_sets import build_eval_sets
from mmrl.run.prompts import encode_prompt
from mmrl.tasks.base import option_defaults
from mmrl.train import parse_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"
RECIPES = ["gpg_geoqa_qwen2.5-vl-3b", "gvpo_math_qwen2.5-math-7b", "cw_grpo_openrs_r1-distill-qwen-1.5b",
           "gmpo_alfworld_qwen2.5-1.5b-instruct"]

# Open-RS recipes/grpo.yaml system_prompt after YAML unescaping (its "\\boxed{{}}"): no code formats it.
OPEN_RS_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer, and put your "
    "final answer within \\boxed{{}} . The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>. Note that respond by English, NOT use other languages.")
# Open-RS src/open_r1/evaluate.py MATH_QUERY_TEMPLATE (a str.format template, formatted with Question=...).
OPEN_RS_QUERY = (
    "Solve the following math problem efficiently and clearly.  The last line of your response should be of the "
    "following format: 'Therefore, the final answer is: $\\boxed{{ANSWER}}$. I hope it is correct' (without quotes) "
    "where ANSWER is just the final number or expression that solves the problem. Think step by step before "
    "answering.\n\n{Question}")
# Open-Reasoner-Zero playground/zero_setting_base.py: the instruction line and the user text (GVPO's template [18]).
ORZ_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The Assistant "
    "first thinks about the reasoning process in the mind and then provides the User with the answer. The reasoning "
    "process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> tags, respectively, "
    "i.e., <think> reasoning process here </think> <answer> answer here </answer>.")
ORZ_USER = ("You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. And your "
            "final answer will be extracted automatically by the \\boxed{{}} tag.\nThis is the problem:\n{prompt}")
# AMAP-ML/GPG R1-V: the trainer's QUESTION_TEMPLATE (src/r1-v/src/open_r1/grpo.py, two spaces) and the eval's
# (src/eval/test_qwen2vl_geoqa.py, one space).
R1V_TRAIN = ("{Question}  Output the thinking process in <think> </think> and final answer (number) in <answer> "
             "</answer> tags.")
R1V_EVAL = ("{Question} Output the thinking process in <think> </think> and final answer (number) in <answer> "
            "</answer> tags.")
# SmolLM2-135M-Instruct's chat template: ChatML, with its own system turn when a chat has none.
SMOL_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(system: str, user: str) -> str:
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from mmrl.models.loading import SMOLLM2, resolve

    where, gguf = resolve(SMOLLM2)
    return AutoTokenizer.from_pretrained(where, gguf_file=gguf)


def _built(recipe: str, task_path: str, set_files: dict[str, str]):
    """(task, evaluation sets) of ``recipe`` as a run of its own model builds them, on the stand-in files."""
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml")])
    sets = [dict(s, path=set_files[s["name"]]) if s.get("path") else dict(s) for s in cfg.evaluation.sets]
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml"), "--task.path", task_path,
                        "--evaluation.sets", json.dumps(sets)])
    task = build_task(cfg)
    return task, build_eval_sets(cfg, task)


def _rendered(tokenizer, row: dict) -> str:
    return tokenizer.decode(encode_prompt(tokenizer, row["messages"], 4096))


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_sets_every_task_option(recipe):
    """No option is left to a default that depends on the model (a real model's one-shot example, say)."""
    cfg = parse_config(["--config", str(CLUSTER / f"{recipe}.yaml")])
    missing = sorted(set(option_defaults(cfg.task.name)) - set(cfg.task.options))
    assert not missing, f"{recipe} leaves task options to their defaults: {missing}"


def test_cw_grpo_prompts_are_open_rs_templates(tmp_path, smollm2_tokenizer):
    task, sets = _built("cw_grpo_openrs_r1-distill-qwen-1.5b", recipe_data.open_rs_train(tmp_path, 3),
                        recipe_data.math_eval_sets(tmp_path))
    train = task.train[0]
    assert _rendered(smollm2_tokenizer, train) == chatml(OPEN_RS_SYSTEM, train["problem"])
    first = sets[0].task.eval[0]
    query = OPEN_RS_QUERY.format(Question=first["problem"])
    assert _rendered(smollm2_tokenizer, first) == chatml(SMOL_DEFAULT_SYSTEM, query)  # the query is the only turn
    for s in sets:  # every benchmark gets the same query, and no worked example
        assert s.task.eval[0]["messages"] == [{"role": "user", "content": OPEN_RS_QUERY.format(
            Question=s.task.eval[0]["problem"])}]


def test_gvpo_prompts_are_open_reasoner_zero_template(tmp_path, smollm2_tokenizer):
    task, sets = _built("gvpo_math_qwen2.5-math-7b", recipe_data.math_lighteval_train(tmp_path, 3),
                        recipe_data.math_eval_sets(tmp_path))
    for row in (task.train[0], sets[0].task.eval[0]):  # the GVPO paper gives evaluation no other template
        user = ORZ_USER.format(prompt=row["problem"])
        assert _rendered(smollm2_tokenizer, row) == chatml(ORZ_INSTRUCTION, user)


def test_gpg_geoqa_prompts_are_r1v_templates(tmp_path):
    """Qwen-VL prompts are content lists (image, then text), which SmolLM2's text-only template does not render; the
    chat the processor renders is compared instead, its text character for character."""
    task, sets = _built("gpg_geoqa_qwen2.5-vl-3b", recipe_data.geoqa_r1v_train(tmp_path, 2),
                        {"geoqa_test": recipe_data.geoqa_r1v_test(tmp_path, 2)})
    for row, template in ((task.train[0], R1V_TRAIN), (sets[0].task.eval[0], R1V_EVAL)):
        (turn,) = row["messages"]  # no system turn, as R1-V's trainer and eval
        assert turn["role"] == "user" and [c["type"] for c in turn["content"]] == ["image", "text"]
        assert turn["content"][1]["text"] == template.format(Question=row["problem"])
