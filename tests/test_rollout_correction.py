"""The rollout importance-sampling correction (mmrl/algos/rollout_correction.py): each method's weights by its
equation, OpenRLHF 0.11.2's own correction on the same tensors, the weight reaching every objective's gradient, and
the sampler-trainer gap in metrics.jsonl on both backends."""

from __future__ import annotations

import inspect
import json
import math
import random

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

import mmrl.algos as algos
from mmrl.algos.rollout_correction import METHODS, RolloutCorrection, weighted_gradient
from mmrl.batch import Group, Response, collate
from mmrl.errors import UserError
from mmrl.models import load_model, load_tokenizer
from mmrl.run.prompts import encode_prompt
from mmrl.train import parse_config
from mmrl.trainer.collect import ReplayHistory
from mmrl.trainer.local import build_trainer
from mmrl.trainer.logprobs import token_logprobs
from mmrl.trainer.rollout import batch_logprobs

with openrlhf_importable():
    import openrlhf.trainer.ray as openrlhf_ray
    from openrlhf.models.loss import PolicyLoss
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ray import create_vllm_engines

    from mmrl.openrlhf import driver, rollout, vllm_stand_in
    from mmrl.openrlhf.experience import MmrlExperienceMaker
    from mmrl.openrlhf.launch import resolve_launch
    from mmrl.openrlhf.loss import MicroBatch, MmrlPolicyLoss
    from mmrl.openrlhf.metrics import StepMetrics
    from mmrl.openrlhf.trainer import MmrlPPOTrainer

MODEL = "embedded:tiny-qwen2"
# log ρ = old - rollout of six tokens: ratios e^-2, e^-0.5, 1, e^0.5, e^1, e^2 (0.135 ... 7.39)
OLD = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0, -1.0]])
ROLLOUT = torch.tensor([[1.0, -0.5, -1.0, -1.5, -2.0, -3.0]])
MASK = torch.ones(1, 6)


def test_tis_truncates_the_ratio_from_above_only():
    w = RolloutCorrection("tis", cap=2.0).weights(OLD, ROLLOUT, MASK)
    ratio = (OLD - ROLLOUT).exp()
    assert torch.allclose(w, torch.minimum(ratio, torch.tensor(2.0)))
    assert w[0, 0] == pytest.approx(math.exp(-2))  # a small ratio stays: the paper's min(ρ, C)


def test_icepop_masks_tokens_outside_the_band_and_keeps_the_ratio_inside():
    w = RolloutCorrection("icepop", low=0.5, high=5.0).weights(OLD, ROLLOUT, MASK)
    ratio = (OLD - ROLLOUT).exp()
    keep = torch.tensor([[False, True, True, True, True, False]])  # e^-2 < 0.5 and e^2 > 5 are dropped
    assert torch.allclose(w, torch.where(keep, ratio, torch.zeros_like(ratio)))


def test_seq_mask_drops_whole_responses_by_their_geometric_mean_ratio():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    # row 0: log ρ = 0, 0, 0 (kept); row 1: log ρ = -3, 1, 1 (mean -1/3, kept though one token is e^-3);
    # row 2: log ρ = 2, 2, 0 with the last token padding (mean 2 over its 2 tokens: e^2 > 5, dropped)
    rollout = torch.tensor([[-1.0, -1.0, -1.0], [2.0, -2.0, -2.0], [-3.0, -3.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 1, 0]])
    w, masked, _ = RolloutCorrection("seq_mask", low=0.5, high=5.0).decide(old, rollout, mask)
    assert torch.allclose(w[0], torch.ones(3)) and torch.allclose(w[1], (old[1] - rollout[1]).exp())
    assert torch.equal(w[2], torch.tensor([0.0, 0.0, 1.0])) and masked[2, :2].all() and not masked[:2].any()


def test_unknown_sampler_logprobs_weigh_one_and_stay_out_of_the_metrics():
    rollout = ROLLOUT.clone()
    rollout[0, :3] = float("nan")  # a replayed response's tokens: its sampler is an older policy
    c = RolloutCorrection("icepop")
    assert torch.equal(c.weights(OLD, rollout, MASK)[0, :3], torch.ones(3))
    m = c.metrics(OLD, rollout, MASK)
    assert m["rollout/logprob_gap_max"] == pytest.approx(2.0)
    assert m["rollout/logprob_gap_mean"] == pytest.approx(3.5 / 3)  # log ρ 0.5, 1, 2 of the known tokens
    assert m["rollout/masked_fraction"] == pytest.approx(1 / 3)
    assert c.metrics(OLD, None, MASK) == {} and c.metrics(OLD, torch.full_like(OLD, float("nan")), MASK) == {}


def test_bad_settings_fail_with_one_line():
    for kwargs, field in (({"method": "tsi"}, "rollout_correction"), ({"cap": 0.0}, "rollout_is_cap"),
                          ({"low": 5.0, "high": 0.5}, "rollout_mask_low")):
        with pytest.raises(UserError, match=field):
            RolloutCorrection(**kwargs)


def loss_inputs(seed: int = 0, batch: int = 8, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, width, generator=g) < 0.8).float()
    mask[:, 0] = 1
    logp = (-torch.rand(batch, width, generator=g) * 2).requires_grad_()
    old = (logp.detach() + 0.1 * torch.randn(batch, width, generator=g)).clamp(max=0)
    rollout = old - 1.2 * torch.randn(batch, width, generator=g)  # ratios from ~e^-3 to ~e^3: every branch taken
    return logp, old, rollout, mask, torch.arange(batch) // 4, torch.rand(batch, generator=g).round()


@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"])
@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_every_objective_takes_each_tokens_gradient_times_its_weight(name, method):
    """The contract for any objective: the corrected loss has the same value and, token by token, w times the
    gradient with respect to the log-probs."""
    logp, old, rollout, mask, group_ids, rewards = loss_inputs()
    algo = algos.get(name)
    adv = algo.advantages(rewards, group_ids)
    stats = algo.batch_stats(rewards, group_ids, adv, old, mask)
    ref = (old - 0.1) if algo.uses_reference() else None
    correction = RolloutCorrection(method)
    w = correction.weights(old, rollout, mask)
    assert (w != 1).logical_and(mask > 0).any()

    def loss_and_grad(lp_view):
        loss, _ = algo.policy_loss(logprobs=lp_view, old_logprobs=old, advantages=adv, mask=mask,
                                   group_ids=group_ids, ref_logprobs=ref, stats=stats)
        return loss, torch.autograd.grad(loss, logp)[0]

    plain, plain_grad = loss_and_grad(logp)
    corrected, grad = loss_and_grad(correction.apply(logp, old, rollout, mask))
    assert torch.equal(corrected.detach(), plain.detach())
    torch.testing.assert_close(grad, w * plain_grad, rtol=1e-5, atol=1e-8)
    if method != "tis":
        assert (grad[w == 0] == 0).all() and (plain_grad[(w == 0) & (mask > 0)] != 0).any()


def test_weighted_gradient_keeps_values_exactly():
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.rand(3, 5)
    y = weighted_gradient(x, w)
    assert torch.equal(y, x.detach())
    (g,) = torch.autograd.grad((y * torch.arange(15.0).view(3, 5)).sum(), x)
    assert torch.allclose(g, w * torch.arange(15.0).view(3, 5))


# --------------------------------------------------------------------------- against OpenRLHF's own correction

def mmrl_and_openrlhf_grads(correction: RolloutCorrection, **theirs):
    """Gradients of mmrl's GRPO (the paper's sequence mean) through MmrlPolicyLoss with ``correction``, and of
    OpenRLHF's PolicyLoss in its matching mode, on the same tensors; and both losses' filter metrics."""
    logp, old, rollout, mask, group_ids, rewards = loss_inputs(seed=2)
    algo = algos.get("grpo")
    adv = algo.advantages(rewards, group_ids)[:, None] * mask
    ours = MmrlPolicyLoss(algo, correction)
    ours.bind(MicroBatch(group_ids, {}, scale=1.0))
    loss = ours(logp, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]
    (grad,) = torch.autograd.grad(loss, logp)
    out = PolicyLoss(token_level_loss=False, is_correction_level=theirs.get("level", "token"),
                     is_correction_mode=theirs["mode"], is_correction_threshold=theirs["threshold"])(
        logp, old, adv, action_mask=mask, rollout_log_probs=rollout)
    (want,) = torch.autograd.grad(out[0], logp)
    return grad, want, correction.metrics(old, rollout, mask), out[3], out[4], (old - rollout).exp(), mask


def test_icepop_is_openrlhfs_token_mask():
    grad, want, metrics, vllm_kl, filtered, _, _ = mmrl_and_openrlhf_grads(
        RolloutCorrection("icepop", low=0.5, high=5.0), mode="mask", threshold=(0.5, 5.0))
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-8)
    assert metrics["rollout/masked_fraction"] == pytest.approx(float(filtered)) and float(filtered) > 0
    assert metrics["rollout/kl"] == pytest.approx(float(vllm_kl), rel=1e-5)


def test_seq_mask_is_openrlhfs_sequence_mask():
    grad, want, _, _, filtered, _, _ = mmrl_and_openrlhf_grads(
        RolloutCorrection("seq_mask", low=0.8, high=1.25), level="seq", mode="mask", threshold=(0.8, 1.25))
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-8)
    assert 0 < float(filtered) < 1  # some responses dropped, some kept


def test_tis_is_openrlhfs_token_clip_with_no_lower_bound_and_differs_where_it_has_one():
    """The paper truncates from above only (min(ρ, C)); OpenRLHF's clip mode also raises ratios below its low bound
    (0.5 by default). With low 0 the two agree; with 0.5 they differ exactly on the tokens below it."""
    grad, want, _, _, _, ratio, mask = mmrl_and_openrlhf_grads(RolloutCorrection("tis", cap=2.0), mode="clip",
                                                               threshold=(0.0, 2.0))
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-8)
    grad, want, _, _, _, ratio, mask = mmrl_and_openrlhf_grads(RolloutCorrection("tis", cap=2.0), mode="clip",
                                                               threshold=(0.5, 2.0))
    low = (ratio < 0.5) & (mask > 0)
    assert low.any()
    torch.testing.assert_close(grad[~low], want[~low], rtol=1e-5, atol=1e-8)
    assert not torch.allclose(grad[low], want[low])


# --------------------------------------------------------------------------- the local backend

def test_replayed_responses_reach_the_batch_without_sampler_logprobs():
    """GVPO's replayed responses were sampled by an older policy: the history keeps them without their sampler's
    log-probs, and the batch holds NaN (unknown: weight 1, out of the metrics) on their rows."""
    history = ReplayHistory(2)
    fresh = [Response([5, 6], logprobs=[-0.1, -0.2]), Response([7], logprobs=[-0.3])]
    history.add(0, fresh)
    replayed = history.take(0, 2)
    assert all(r.historical and r.logprobs is None for r in replayed) and fresh[0].logprobs == [-0.1, -0.2]
    batch = collate([Group(0, {}, [1, 2], [Response([8, 9], logprobs=[-0.5, -0.6]), *replayed])], pad_id=0)
    assert torch.equal(batch.rollout_logprobs[0], torch.tensor([-0.5, -0.6]))
    assert torch.isnan(batch.rollout_logprobs[1:]).all()
    with pytest.raises(ValueError, match="response 0 has 1 sampler log-probs for 2 tokens"):
        collate([Group(0, {}, [1], [Response([8, 9], logprobs=[-0.5])])], pad_id=0)


def test_local_gap_is_in_metrics_and_near_zero_when_the_sampler_is_the_trainer(tmp_path, embedded_model_dir,
                                                                                small_config):
    trainer = build_trainer(small_config(tmp_path, **{"run.steps": 1}))
    trainer.run()
    record = json.loads((trainer.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    # mmrl's own sampler at full top-p: the same distribution as the trainer's forward, up to float32 rounding
    assert record["rollout/logprob_gap_max"] < 1e-4 and abs(record["rollout/kl"]) < 1e-5
    assert record["rollout/is_weight_mean"] == 1.0 and record["rollout/masked_fraction"] == 0.0


def test_local_gap_shows_a_truncated_sampler_and_icepop_masks_it(tmp_path, embedded_model_dir, small_config):
    """top-p samples from a renormalised nucleus, so π_train/π_sampler = nucleus mass < 1 on every token."""
    trainer = build_trainer(small_config(tmp_path, **{"run.steps": 1, "rollout.top_p": 0.3,
                                                      "algo.rollout_correction": "icepop",
                                                      "algo.rollout_mask_low": 0.9}))
    trainer.run()
    record = json.loads((trainer.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["rollout/logprob_gap_max"] > 0.1 and record["rollout/kl"] > 0
    assert 0 < record["rollout/masked_fraction"] <= 1


@pytest.mark.parametrize("method,moves", [("none", True), ("icepop", False)])
def test_local_update_reads_the_correction(tmp_path, embedded_model_dir, small_config, method, moves):
    """The learner applies the configured weight: with every token's sampler log-prob far above the trainer's
    (ratio e^-5), IcePop drops every token and the policy gradient is zero; without a correction it is not."""
    trainer = build_trainer(small_config(tmp_path, **{"run.steps": 1, "algo.rollout_correction": method}))
    grads: list[torch.Tensor] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.extend(p.grad.abs().sum() for p in trainer.model.parameters()
                                               if p.grad is not None))
    batch, stats = trainer.prepare_batch(trainer.collect_rollouts()[0])
    assert batch.rollout_logprobs is not None and torch.isfinite(batch.rollout_logprobs[batch.response_mask > 0]).all()
    assert float(batch.rewards.std()) > 0, "the pinned seed must draw a batch with reward signal"
    rescored, _ = batch_logprobs(trainer.model, batch, trainer.cfg.rollout.temperature)
    batch.rollout_logprobs = rescored + 5.0
    trainer.update(batch, stats)
    assert (float(sum(grads)) > 0) == moves


# --------------------------------------------------------------------------- the openrlhf backend

def test_the_rehearsal_engine_returns_the_sampled_tokens_logprobs_as_vllm():
    """The rehearsal's HF engine answers ``SamplingParams(logprobs=1)`` as vLLM does (one {token: Logprob} per
    sampled token, of the processed distribution), and they are the trainer's log-probs of those tokens."""
    engine = rollout.HFRolloutActor.__new__(rollout.HFRolloutActor)  # no Ray actor: generation only
    engine.model, engine.processor, engine.tokenizer = load_model(MODEL).eval(), None, load_tokenizer(MODEL)
    prompt = encode_prompt(engine.tokenizer, [{"role": "user", "content": "3+4="}], 64)
    torch.manual_seed(0)
    out = engine._generate(prompt, vllm_stand_in.SamplingParams(temperature=1.0, max_tokens=8, logprobs=1), None)
    tokens = out.outputs[0].token_ids
    sampled = [step[t].logprob for step, t in zip(out.outputs[0].logprobs, tokens, strict=True)]
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = engine.model(ids).logits[:, len(prompt) - 1:-1]
    mine, _ = token_logprobs(logits, ids[:, len(prompt):], torch.ones(1, len(tokens), dtype=torch.bool), 1.0, False)
    assert torch.allclose(torch.tensor([sampled]), mine, atol=1e-4)


def test_openrlhf_step_logs_the_gap_between_vllm_and_pi_old(tmp_path, monkeypatch):
    """The launch asks vLLM for log-probs; the experience maker measures them against π_old over the step, and the
    step's line of metrics.jsonl carries it (as MmrlPPOTrainer's rollout statistics)."""
    cfg = parse_config(["--backend", "openrlhf", "--out", str(tmp_path / "run"), "--cluster.nodes", "1",
                        "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2", "--rollout.prompts_per_step",
                        "2", "--rollout.samples_per_prompt", "4", "--optim.micro_batch_size", "4",
                        "--algo.rollout_correction", "tis"])
    args = resolve_launch(cfg, write=True).args
    assert args.algo.advantage.is_correction_level == "token"  # OpenRLHF then asks vLLM for logprobs=1
    called = []  # vLLM engines are built with log-probs of the tempered, truncated distribution the tokens came from
    monkeypatch.setattr(openrlhf_ray, "create_vllm_engines", lambda *a, **k: called.append(
        inspect.signature(create_vllm_engines).bind(*a, **k).arguments))
    driver.create_engines(args, None)
    assert called[0]["logprobs_mode"] == "processed_logprobs"
    assert args.mmrl.rollout_correction["method"] == "tis"
    maker = MmrlExperienceMaker(None, None, None, None, None, type("S", (), {"args": args})(),
                                type("T", (), {"pad_token_id": 0})(), mmrl_spec=args.mmrl)
    rng = random.Random(0)
    samples = []
    for i in range(8):
        logp = -torch.rand(1, 4) * 3
        samples.append(Experience(
            sequences=torch.randint(5, 50, (1, 5)), attention_mask=torch.ones(1, 5, dtype=torch.long),
            action_mask=torch.ones(1, 4, dtype=torch.long), action_log_probs=logp,
            rollout_log_probs=logp + (0.0 if i else 3.0),  # one sample 3 nats apart: a gap of 3, a truncated weight
            rewards=torch.tensor([float(rng.random() > 0.5)]), response_length=torch.tensor([4]),
            truncated=torch.tensor([False]), total_length=torch.tensor([5.0]), prompts=["p"], labels=["{}"],
            info={"reward": torch.tensor([0.0])}))
    experiences = maker.compute_advantages_and_returns(maker.split_rollout_samples(samples))
    assert maker.rollout_gap["rollout/logprob_gap_max"] == pytest.approx(3.0, rel=1e-5)
    assert maker.rollout_gap["rollout/logprob_gap_mean"] == pytest.approx(3.0 / 8, rel=1e-5)
    assert maker.rollout_gap["rollout/truncated_fraction"] == pytest.approx(0.0)  # ratio e^-3: below the cap
    trainer = object.__new__(MmrlPPOTrainer)  # its rollout statistics only: no datasets, no engines
    trainer.experience_maker = maker
    trainer.metrics = StepMetrics(str(tmp_path / "metrics.jsonl"), resume=False)
    trainer.metrics.write(1, {"policy_loss": 0.1, **trainer._compute_rollout_stats(experiences)})
    trainer.metrics.flush()
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line["rollout/logprob_gap_max"] == pytest.approx(3.0, rel=1e-5) and "rollout/reward_mean" in line
