"""The local trainer end to end on the embedded default: every algorithm, the rollout features two papers define,
bad-input guards, artifacts of a run, and kill-and-resume bit-identity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import mmrl.algos as algos
from mmrl.run.checkpoint import latest_checkpoint, load_checkpoint
from mmrl.trainer.local import build_trainer
from mmrl.trainer.rollout import batch_logprobs


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_every_algorithm_trains_two_steps(tmp_path, embedded_model_dir, name, small_config):
    params = {"algo.valid_threshold": 0.0} if name == "gpg" else {}
    cfg = small_config(tmp_path, **{"algo.name": name, **params})
    trainer = build_trainer(cfg)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    last = trainer.run()
    assert trainer.step == 2 and last["step"] == 2  # a record's step: the updates made once it ends
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("reward", "accuracy", "response_length", "entropy", "grad_norm", "kl_old", "kl_step", "kl_step_max",
                "adv_group_std", "adv_zero_spread", "adv_mean", "lr", "step_time", "tokens_per_s", "format_rate",
                "eval/pass@1", "eval/pass@2", "eval/avg@2", "eval/format_rate"):
        assert key in records[-1], key
    changed = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=False))
    assert changed or all(r["reward_std"] == 0 for r in records)  # no signal is the only excuse not to move


def test_run_artifacts_and_refusal_to_clobber(tmp_path, embedded_model_dir, small_config):
    cfg = small_config(tmp_path, **{"run.plot": True, "run.checkpoint_every": 1})
    trainer = build_trainer(cfg)
    trainer.run()
    run = trainer.run_dir
    assert (run / "curves.png").stat().st_size > 1000
    assert json.loads((run / "config.json").read_text())["algo"]["name"] == "grpo"
    assert latest_checkpoint(run).name == "step_0000002"
    assert len(list((run / "checkpoints").glob("step_*"))) == 2  # keep_checkpoints
    with pytest.raises(ValueError, match="already holds a run"):
        build_trainer(small_config(tmp_path))
    with pytest.raises(ValueError, match="has no checkpoint"):
        build_trainer(small_config(tmp_path, **{"run.resume": True, "run.out_dir": str(tmp_path / "other")}))


def test_nan_loss_never_reaches_the_optimizer(tmp_path, embedded_model_dir, monkeypatch, small_config):
    trainer = build_trainer(small_config(tmp_path, **{"run.steps": 1}))
    real = type(trainer.algo).policy_loss

    def poisoned(self, *args, **kwargs):
        loss, metrics = real(self, *args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(type(trainer.algo), "policy_loss", poisoned)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    last = trainer.run()
    assert last["skipped_updates"] == 1 and last["updates"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=False))


def test_gpg_resamples_until_enough_valid_groups(tmp_path, embedded_model_dir, small_config):
    cfg = small_config(tmp_path, **{"algo.name": "gpg", "algo.valid_threshold": 1.0, "algo.max_resample": 3})
    trainer = build_trainer(cfg)
    groups, info = trainer.collect_rollouts()
    assert len(groups) == 4
    valid = [not g.all_rewards_equal for g in groups]
    assert valid == sorted(valid, reverse=True)  # valid groups first, then degenerate ones from the last round
    if not all(valid):
        assert info["resample_rounds"] == 3
    assert trainer.rollouts.sampler.pos >= 4 * (1 + info["resample_rounds"]) or trainer.rollouts.sampler.order
    # β_th = 0 turns it off: exactly one round.
    off = build_trainer(small_config(tmp_path / "off", **{"algo.name": "gpg", "algo.valid_threshold": 0.0}))
    assert off.collect_rollouts()[1] == {}


def test_dynamic_sampling_resamples_until_every_group_is_valid(tmp_path, embedded_model_dir, small_config):
    """DAPO's dynamic sampling on GRPO: the same loop as GPG's resampling, asking for every group to be valid."""
    cfg = small_config(tmp_path, **{"algo.name": "grpo", "algo.dynamic_sampling": 2})
    trainer = build_trainer(cfg)
    groups, info = trainer.collect_rollouts()
    assert len(groups) == 4
    valid = [not g.all_rewards_equal for g in groups]
    assert valid == sorted(valid, reverse=True)
    if not all(valid):
        assert info["resample_rounds"] == 2
    assert trainer.rollouts.sampler.pos >= 4 * (1 + info["resample_rounds"]) or trainer.rollouts.sampler.order
    assert build_trainer(small_config(tmp_path / "off", **{"algo.name": "grpo"})).collect_rollouts()[1] == {}


def test_overlong_shaping_lowers_the_rewards_the_update_trains_on(tmp_path, embedded_model_dir, small_config):
    """DAPO's overlong shaping in the local loop: the advantages are the objective's on the task's rewards plus Eq. 13's
    penalty of each response's length against the generation budget (L_max); the batch keeps the task's rewards."""
    from mmrl.algos.base import overlong_penalty

    cfg = small_config(tmp_path, **{"algo.name": "grpo", "algo.overlong_buffer": 12})  # the whole budget
    trainer = build_trainer(cfg)
    groups = trainer.collect_rollouts()[0]
    raw = torch.tensor([r.reward.score for g in groups for r in g.responses])
    batch, _ = trainer.prepare_batch(groups)
    lengths = batch.response_mask.sum(1)
    budget = cfg.rollout.max_new_tokens
    assert trainer.algo.max_length == budget
    penalty = overlong_penalty(lengths, budget, 12)
    assert (penalty < 0).all()
    torch.testing.assert_close(batch.rewards, raw)
    torch.testing.assert_close(batch.advantages, trainer.algo.advantages(raw + penalty, batch.group_ids))


def test_gvpo_replays_historical_responses(tmp_path, embedded_model_dir, small_config):
    cfg = small_config(tmp_path, **{"algo.name": "gvpo", "rollout.replay_historical": 2,
                                    "task.max_operand": 1, "task.eval_fraction": 0.0})
    trainer = build_trainer(cfg)  # 4 problems, 4 prompts per step: every prompt comes back every step
    first, _ = trainer.collect_rollouts()
    assert not any(r.historical for g in first for r in g.responses)
    second, _ = trainer.collect_rollouts()
    for g in second:
        hist = [r for r in g.responses if r.historical]
        assert len(g.responses) == 4 and len(hist) == 2
        assert all(r.reward is not None for r in hist)
    batch, _ = trainer.prepare_batch(second)
    assert batch.size == 16 and torch.isfinite(batch.old_logprobs).all()


def test_dr_grpo_normaliser_is_the_generation_budget(tmp_path, embedded_model_dir, small_config):
    trainer = build_trainer(small_config(tmp_path, **{"algo.name": "dr_grpo"}))
    assert trainer.algo.max_tokens == 12


def test_reference_model_only_when_needed(tmp_path, embedded_model_dir, small_config):
    assert build_trainer(small_config(tmp_path / "a")).learner.ref_model is None
    with_kl = build_trainer(small_config(tmp_path / "b", **{"algo.kl_coef": 0.04}))
    assert with_kl.learner.ref_model is not None
    assert not any(p.requires_grad for p in with_kl.learner.ref_model.parameters())
    with_kl.run()


def _final_state(run_dir):
    return load_checkpoint(latest_checkpoint(run_dir))


def _stable(record):
    return {k: v for k, v in record.items() if "time" not in k and k != "tokens_per_s"}


@pytest.mark.slow
def test_kill_and_resume_is_bit_identical(tmp_path, embedded_model_dir):
    """SIGTERM a real training process mid-run, resume it, and compare with an uninterrupted run."""
    steps = 6
    base = [sys.executable, "-m", "mmrl.train", "--algo", "gvpo", "--steps", str(steps),
            "--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens", "12",
            "--run.checkpoint_every", "2", "--run.progress", "false", "--run.plot", "false",
            "--run.eval_every", "3", "--run.eval_samples", "2", "--model.threads", "1",
            "--optim.warmup_steps", "2", "--optim.schedule", "linear"]  # the lr schedule's state resumes too
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    straight = tmp_path / "straight"
    subprocess.run(base + ["--out", str(straight)], check=True, env=env, timeout=600, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(base + ["--out", str(killed)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 1):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    interrupted_at = load_checkpoint(latest_checkpoint(killed))["step"]
    assert interrupted_at < steps, "the run finished before the signal; nothing was tested"
    assert b"continue with --resume" in err

    # Resuming needs only the run directory: the run's own config.json is the base.
    resume = [sys.executable, "-m", "mmrl.train", "--out", str(killed), "--resume"]
    subprocess.run(resume, check=True, env=env, timeout=600, capture_output=True)
    a, b = _final_state(straight), _final_state(killed)
    assert a["step"] == b["step"] == steps
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    rec_a = [_stable(json.loads(x)) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    rec_b = [_stable(json.loads(x)) for x in metrics.read_text().splitlines()]
    assert rec_a == rec_b  # same metrics, no step lost or logged twice
    assert (straight / "samples.jsonl").read_text() == (killed / "samples.jsonl").read_text()


def test_reward_model_as_reward_source(tmp_path, embedded_model_dir, small_config):
    """The GVPO paper's App. C: a learned reward model (here a tiny one built from config) adds to the task's reward."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from mmrl.models import load_tokenizer

    tok = load_tokenizer("embedded:tiny-qwen2")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id)
    Qwen2ForSequenceClassification(cfg).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    trainer = build_trainer(small_config(tmp_path, **{"task.reward_model": str(tmp_path / "rm"),
                                                      "run.steps": 1}))
    assert "reward_model" in trainer.task.reward.name
    groups, _ = trainer.collect_rollouts()
    scores = {round(r.reward.components["reward_model"], 6) for g in groups for r in g.responses}
    assert len(scores) > 1  # the reward model scores responses differently
    trainer.run()


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_micro_batching_accumulates_the_exact_mini_batch_gradient(tmp_path, embedded_model_dir, name, small_config):
    """Gradient accumulation over micro-batches (weighted by the objective's loss_mass) equals one big batch."""
    extra = {"algo.valid_threshold": 0.0} if name == "gpg" else {}

    def first_gradient(micro: int, where: str) -> list[torch.Tensor]:
        cfg = small_config(tmp_path / where, **{"algo.name": name, "optim.micro_batch_size": micro,
                                                "run.steps": 1, "run.eval_every": 0, **extra})
        trainer = build_trainer(cfg)
        grads: list[list[torch.Tensor]] = []
        trainer.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: grads.append([p.grad.clone() for p in trainer.model.parameters()
                                                    if p.grad is not None]))
        batch, stats = trainer.prepare_batch(trainer.collect_rollouts()[0])
        assert float(batch.rewards.std()) > 0, "the pinned seed must draw a batch with reward signal"
        if micro:
            assert len(trainer.learner.micro_batches(batch, torch.arange(4))) == 4
        trainer.update(batch, stats)
        return grads[0]

    whole, split = first_gradient(0, "whole"), first_gradient(4, "split")
    assert len(whole) == len(split) > 0
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", ["grpo", "gvpo", "gpg"])
def test_pi_old_from_the_update_gives_the_separate_forwards_gradient(tmp_path, embedded_model_dir, name,
                                                                       small_config):
    """With one update per rollout the trainer skips the π_old forward (as TRL does with num_iterations=1); the
    gradient is the one a separately re-scored π_old gives."""
    extra = {"algo.valid_threshold": 0.0} if name == "gpg" else {}

    def first_gradient(separate: bool, where: str) -> list[torch.Tensor]:
        trainer = build_trainer(small_config(tmp_path / where, **{"algo.name": name, "run.steps": 1, **extra}))
        assert trainer.learner.old_logprobs_from_update()
        grads: list[list[torch.Tensor]] = []
        trainer.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: grads.append([p.grad.clone() for p in trainer.model.parameters()
                                                    if p.grad is not None]))
        batch, stats = trainer.prepare_batch(trainer.collect_rollouts()[0])
        assert batch.old_logprobs is None
        assert float(batch.rewards.std()) > 0, "the pinned seed must draw a batch with reward signal"
        if separate:
            batch.old_logprobs, _ = batch_logprobs(trainer.model, batch, trainer.cfg.rollout.temperature)
        trainer.update(batch, stats)
        return grads[0]

    reused, separate = first_gradient(False, "reused"), first_gradient(True, "separate")
    assert len(reused) == len(separate) > 0
    for a, b in zip(reused, separate, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("overrides", [{"optim.epochs": 2}, {"optim.minibatches": 2}, {"algo.name": "cw_grpo"},
                                       {"algo.name": "grpo", "algo.kl_coef": 0.1}])
def test_pi_old_is_scored_separately_when_the_update_cannot_give_it(tmp_path, embedded_model_dir, overrides,
                                                                    small_config):
    trainer = build_trainer(small_config(tmp_path, **{"run.steps": 1, **overrides}))
    assert not trainer.learner.old_logprobs_from_update()
    batch, _ = trainer.prepare_batch(trainer.collect_rollouts()[0])
    assert batch.old_logprobs is not None and torch.isfinite(batch.old_logprobs).all()


def test_overwrite_starts_afresh_and_drops_the_old_checkpoints(tmp_path, embedded_model_dir, small_config):
    old = build_trainer(small_config(tmp_path, **{"run.steps": 3, "run.checkpoint_every": 1}))
    old.run()
    fresh = build_trainer(small_config(tmp_path, **{"run.steps": 1, "run.overwrite": True}))
    assert latest_checkpoint(fresh.run_dir) is None
    fresh.run()
    assert load_checkpoint(latest_checkpoint(fresh.run_dir))["step"] == 1
    assert [json.loads(x)["step"] for x in (fresh.run_dir / "metrics.jsonl").read_text().splitlines()] == [1]


def test_bf16_autocast_and_gradient_checkpointing_train(tmp_path, embedded_model_dir, small_config):
    trainer = build_trainer(small_config(tmp_path, **{"model.dtype": "bfloat16", "model.gradient_checkpointing": True,
                                                      "run.steps": 1}))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights stay float32
    assert trainer.model.is_activation_checkpointing and trainer.model.training
    last = trainer.run()
    assert last["updates"] == 1 and last["skipped_updates"] == 0


def test_sampler_ignores_logits_processors_shipped_in_generation_config(embedded_model_dir):
    """A checkpoint's generation_config (top_k=1, repetition penalty) must not change what we sample."""
    from mmrl.models import load_model, load_tokenizer
    from mmrl.run.prompts import encode_prompt
    from mmrl.trainer.rollout import generate

    tok = load_tokenizer("embedded:tiny-qwen2")
    model = load_model("embedded:tiny-qwen2")
    model.generation_config.top_k = 1
    model.generation_config.repetition_penalty = 10.0
    prompt = encode_prompt(tok, [{"role": "user", "content": "Compute 4+4. Answer in <answer></answer> tags."}], 64)
    torch.manual_seed(0)
    texts = {r.text for r in generate(model, tok, [prompt] * 32, 12, temperature=1.0, top_p=1.0)}
    assert len(texts) > 1  # top_k=1 would have made every sample identical


def test_too_long_prompts_fail_at_start_naming_the_field(tmp_path, embedded_model_dir, small_config):
    with pytest.raises(ValueError, match=r"rollout.max_prompt_tokens: a prompt has \d+ tokens.*\(train row 0\)"):
        build_trainer(small_config(tmp_path, **{"rollout.max_prompt_tokens": 5}))


def test_metrics_survive_a_half_written_line(tmp_path):
    from mmrl.run.metrics import MetricsLog, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward": 1}\n{"step": 1, "rew')
    MetricsLog(path, resume_step=1)
    assert read_metrics(path) == [{"step": 0, "reward": 1}]


def test_row_by_row_scoring_equals_the_padded_batch(embedded_model_dir):
    """Long batches are scored one unpadded row at a time (ROW_BY_ROW_MIN_WIDTH): the log-probs, entropies and
    gradients must equal the padded batch's, for uneven prompts, model turns after env feedback, and an empty
    response; a row that is not collate's layout is refused."""
    from mmrl.batch import Group, Response, collate
    from mmrl.models import load_model
    from mmrl.trainer.rollout import response_logprobs

    model = load_model(str(embedded_model_dir))
    gen = torch.Generator().manual_seed(0)
    tokens = lambda n: torch.randint(3, 200, (n,), generator=gen).tolist()  # noqa: E731
    turns = lambda a, b, c: [1] * a + [0] * b + [1] * c  # noqa: E731  (a model turn, env feedback, a model turn)
    groups = [Group(0, {}, tokens(7), [Response(tokens(30), loss_mask=turns(8, 12, 10)), Response(tokens(12)),
                                       Response([])]),
              Group(1, {}, tokens(15), [Response(tokens(41), loss_mask=turns(5, 30, 6)), Response(tokens(5))])]
    batch = collate(groups, pad_id=0)
    results = []
    for min_width in (0, 1):  # 0: one padded batch; 1: every batch row by row
        model.zero_grad()
        logprobs, entropy = response_logprobs(model, batch, 0.7, with_entropy=True, row_by_row_min_width=min_width)
        (logprobs * batch.response_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((logprobs.detach(), entropy * batch.response_mask, grads))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    assert lp_a.shape == lp_b.shape == batch.response_mask.shape
    assert torch.count_nonzero(lp_b[batch.response_mask == 0]) == 0  # env, padding and the empty row score 0
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_b, grad_a, rtol=1e-3, atol=1e-6)
    holed = collate(groups, pad_id=0)
    holed.attention_mask[0, holed.prompt_width + 3] = 0  # a hole inside a response: not collate's layout
    with pytest.raises(ValueError, match="row 0"):
        response_logprobs(model, holed, 0.7, row_by_row_min_width=1)


@pytest.mark.parametrize("overrides, expected", [({}, "split"), ({"optim.row_by_row": False}, 0)])
def test_row_by_row_follows_the_config(tmp_path, embedded_model_dir, small_config, overrides, expected):
    from mmrl.trainer.rollout import ROW_BY_ROW_MIN_WIDTH

    trainer = build_trainer(small_config(tmp_path, **overrides))
    assert trainer.learner.row_by_row_min_width == (ROW_BY_ROW_MIN_WIDTH if expected == "split" else 0)


def test_the_logged_lr_is_the_mean_rate_of_the_steps_updates(tmp_path, small_config):
    """Warm-up over 4 updates to 1e-3, two updates per step: step 1 steps at 0 and 2.5e-4, step 2 at 5e-4 and
    7.5e-4 (the scheduler's last rate after a step would be the next update's)."""
    cfg = small_config(tmp_path, **{"optim.lr": 1e-3, "optim.warmup_steps": 4, "optim.minibatches": 2,
                                    "run.eval_every": 0})
    trainer = build_trainer(cfg)
    trainer.run()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in records if r.get("updates") == 2]
    assert rates == pytest.approx([1.25e-4, 6.25e-4])
