"""mmrl's GRPO update against TRL's ``GRPOTrainer`` (TRL 1.16, the ``bench`` extra), configured as
benchmarks/trl_compare.py configures them, on one identical batch.

mmrl samples a rollout batch; TRL's trainer is then given the same prompts, and its model's ``generate`` returns the
very tokens mmrl sampled, so that everything after sampling runs through TRL's own code: its cut after the first EOS
and loss mask, the reward, the group-normalised advantages, the loss and its reduction, the gradient clip. The
gradients at the optimizer step must be equal to float tolerance, and the AdamW settings the same, so that the two
trainers take the same step from the same batch.
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl")

from mmrl.models import EMBEDDED_NAME, load_model  # noqa: E402
from mmrl.run.config import resolve_config  # noqa: E402
from mmrl.trainer.local import build_trainer  # noqa: E402
from mmrl.trainer.rollout import eos_ids  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# 4 prompts x 4 samples; an 8-token budget ends some responses with EOS and cuts others at the cap (both are checked)
SETTINGS = {"steps": 1, "prompts": 4, "group": 4, "max_new_tokens": 8, "lr": 1e-3, "temperature": 1.0}
SEED = 1


@pytest.fixture(scope="module")
def compare():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling ``common``
    try:
        spec = importlib.util.spec_from_file_location("mmrl_trl_compare_benchmark", BENCHMARKS / "trl_compare.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def replay_generate(tokenizer, completions: dict[tuple[int, ...], list[list[int]]]):
    """A ``generate`` that returns, for each left-padded prompt row, the next of the completions recorded for that
    prompt, right-padded like ``transformers``' ``generate`` pads rows that stopped early."""

    def generate(input_ids, attention_mask, **kwargs):
        rows = []
        for ids, attended in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            prompt = tuple(t for t, a in zip(ids, attended, strict=True) if a)
            rows.append(completions[prompt].pop(0))
        width = max(len(r) for r in rows)
        padded = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, padded.to(input_ids.device)], dim=1)

    return generate


def test_one_batch_gives_trl_grpo_trainers_gradient(tmp_path, embedded_model_dir, compare):
    from datasets import Dataset
    from transformers import TrainerCallback

    cfg = resolve_config([(compare.mmrl_overrides(SETTINGS, SEED, str(tmp_path / "mmrl")), "test")])
    trainer = build_trainer(cfg)
    start = copy.deepcopy(trainer.model.state_dict())
    groups, _ = trainer.collect_rollouts()
    stop = set(eos_ids(trainer.tokenizer, trainer.model))
    responses = [r for g in groups for r in g.responses]
    assert any(r.truncated for r in responses), "the pinned seed must draw a response cut at the length cap"
    assert any(r.token_ids[-1] in stop for r in responses), "the pinned seed must draw a response ended by EOS"
    assert any(not g.all_rewards_equal for g in groups), "the pinned seed must draw a batch with reward signal"

    mmrl_grads: list[dict[str, torch.Tensor]] = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: mmrl_grads.append(
        {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}))
    batch, stats = trainer.prepare_batch(groups)
    trainer.update(batch, stats)

    model = load_model(EMBEDDED_NAME, dtype=torch.float32, device=torch.device("cpu"))
    model.load_state_dict(start)
    recorded = collections.defaultdict(list)
    for g in groups:
        recorded[tuple(g.prompt_ids)] += [list(r.token_ids) for r in g.responses]
    model.generate = replay_generate(trainer.tokenizer, recorded)
    trl_grads: list[dict[str, torch.Tensor]] = []

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):  # after TRL's gradient clip
            trl_grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    sampled = {g.sample["problem"] for g in groups}
    rows = [r for r in compare.trl_rows(trainer.task) if r["problem"] in sampled]  # the benchmark's rows
    assert len(rows) == len(groups)
    trl_trainer = trl.GRPOTrainer(
        model=model, processing_class=trainer.tokenizer, reward_funcs=compare.task_reward(trainer.task, stop, {}),
        train_dataset=Dataset.from_list(rows), callbacks=[Gradients()],
        args=trl.GRPOConfig(**compare.trl_arguments(SETTINGS, SEED, str(tmp_path / "trl"))))
    trl_trainer.train()
    assert all(not left for left in recorded.values()), "TRL must have trained on every recorded response"

    [ours], [theirs] = mmrl_grads, trl_grads
    assert ours.keys() == theirs.keys()
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in ours.values()))
    assert norm > 1e-3, "the batch must carry a gradient"
    for name, grad in ours.items():
        torch.testing.assert_close(grad, theirs[name], rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    # the same step from the same gradient: AdamW with the same settings
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
        assert trainer.optimizer.param_groups[0][key] == trl_trainer.optimizer.param_groups[0][key], key


def test_a_worker_that_dies_ends_the_comparison_instead_of_hanging_it(tmp_path):
    """One worker fails while the other lives (TRL's optimizer refuses a negative learning rate, mmrl's builds): the
    coordinator's pipe to the dead one reads EOF at once, and the living one ends when the coordinator lets go."""
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); import trl_compare; "
            "trl_compare.run_seed({'steps': 1, 'prompts': 2, 'group': 2, 'max_new_tokens': 4, 'lr': -1.0, "
            f"'temperature': 1.0}}, 0, 1, Path({str(tmp_path)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS.parent, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "Invalid learning rate" in proc.stderr and proc.stderr.rstrip().endswith("EOFError")


def test_trl_is_given_the_prompts_mmrl_builds_for_the_model(compare, embedded_model_dir, tmp_path):
    """A checkpoint that is not embedded gets the task's pretrained-model chat on mmrl's side (system prompt, one
    solved example); TRL's dataset must be built from that same task, or the two sides train on other prompts."""
    from mmrl.run.build import build_task
    from mmrl.run.config import resolve_config

    settings = {"model": str(embedded_model_dir), "steps": 1, "prompts": 2, "group": 2, "max_new_tokens": 4,
                "lr": 1e-6, "temperature": 1.0}
    mmrl_task = build_task(resolve_config([(compare.mmrl_overrides(settings, 0, str(tmp_path)), "test")]))
    trl_task = compare.comparison_task(settings, 0, str(tmp_path))
    assert compare.trl_rows(trl_task) == compare.trl_rows(mmrl_task)
    assert trl_task.train[0]["messages"][0]["role"] == "system" and len(trl_task.train[0]["messages"]) > 2
