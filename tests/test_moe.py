"""Mixture-of-Experts: routing metrics on hand-made routing, the Switch loss against transformers', routing replay,
router controls in the trainer, and every objective on the embedded tiny Qwen3-MoE."""

from __future__ import annotations

import pytest
import torch

import mmrl.algos as algos
from mmrl import moe
from mmrl.batch import Group, Response, collate
from mmrl.models import load_model, load_tokenizer
from mmrl.run.prompts import encode_prompt
from mmrl.trainer.local import build_trainer
from mmrl.trainer.rollout import response_logprobs

MOE = "embedded:tiny-qwen3-moe"


@pytest.fixture(scope="module")
def tiny_moe():
    return load_model(MOE), load_tokenizer(MOE)


def test_expert_load_and_imbalance_on_hand_made_routing():
    # one layer, 2 sequences x 3 tokens, top-2 of 4 experts; the last token of sequence 1 is padding
    routing = [torch.tensor([[[0, 1], [0, 2], [0, 3]], [[1, 2], [0, 1], [3, 3]]])]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    load = moe.expert_load(routing, 4, mask)
    torch.testing.assert_close(load, torch.tensor([[4, 3, 2, 1]]) / 10.0)
    m = moe.load_metrics(load)
    assert m["moe/load_imbalance"] == pytest.approx(0.4 / 0.25)
    uniform = moe.load_metrics(torch.full((2, 4), 0.25))
    assert uniform["moe/load_imbalance"] == pytest.approx(1.0) and uniform["moe/load_entropy"] == pytest.approx(1.0)
    collapsed = moe.load_metrics(torch.tensor([[1.0, 0, 0, 0]]))
    assert collapsed["moe/load_imbalance"] == pytest.approx(4.0) and collapsed["moe/load_entropy"] == pytest.approx(0)


def test_routing_mismatch_compares_expert_sets_on_real_tokens():
    a = [torch.tensor([[[0, 1], [2, 3], [1, 2]]])]
    b = [torch.tensor([[[1, 0], [2, 1], [0, 0]]])]  # same set, different set, (padding)
    assert moe.routing_mismatch(a, b, torch.tensor([[1, 1, 0]])) == pytest.approx(0.5)


def test_load_balancing_loss_matches_transformers():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    torch.manual_seed(0)
    logits = [torch.randn(2 * 5, 8) for _ in range(3)]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    ours = moe.load_balancing_loss(logits, 2, mask)
    theirs = load_balancing_loss_func(tuple(logits), 8, 2, mask)
    torch.testing.assert_close(ours, theirs)
    assert float(moe.z_loss([torch.zeros(4, 8)], torch.ones(2, 2))) == pytest.approx(torch.log(torch.tensor(8.)) ** 2)


def _batch(tok):
    questions = ["Use 3, 5 once each with + - * to make 8.", "Use 9, 4 once each with + - * to make 36. Quick!"]
    prompts = [encode_prompt(tok, [{"role": "user", "content": q}], 128) for q in questions]
    answers = [tok("<answer>3+5</answer><|im_end|>", add_special_tokens=False)["input_ids"],
               tok("<answer>9*4</answer>", add_special_tokens=False)["input_ids"]]
    groups = [Group(i, {}, p, [Response(a)]) for i, (p, a) in enumerate(zip(prompts, answers, strict=True))]
    return collate(groups, tok.pad_token_id)


def _fresh_recorded(tiny_moe):
    """(a private copy of the tiny MoE, a batch, its shape, the recorded rollout routing, the rollout log-probs)."""
    model, tok = tiny_moe
    model = type(model)(model.config).eval()
    model.load_state_dict(load_model(MOE).state_dict())
    batch = _batch(tok)
    shape = tuple(batch.input_ids.shape)
    record = moe.RouterHooks(model, shape)
    with torch.no_grad(), record.active():
        rollout_logp, _ = response_logprobs(model, batch, 1.0)
    return model, batch, shape, record, rollout_logp


def _drift_routers(model, scale: float = 0.2) -> None:
    """The training-side router drifts away from the rollout's."""
    torch.manual_seed(1)
    with torch.no_grad():
        for _, router in moe.find_routers(model):
            router.weight.add_(scale * router.weight.std() * torch.randn_like(router.weight))


def test_routing_replay_forces_the_rollout_experts(tiny_moe):
    """R3: the training forward runs exactly the rollout's experts, whatever the router does meanwhile.

    Without drift, replay reproduces the rollout's log-probs bit for bit. After the router drifts, the experts it
    would choose differ from the rollout's; with replay the routing used equals the rollout's exactly, and only the
    mixing weights (the current router's probabilities of those experts, which carry the router's gradient) move.
    """
    model, batch, shape, record, rollout_logp = _fresh_recorded(tiny_moe)
    assert len(record.routing) == 2 and record.routing[0].shape == (*shape, 2)
    same = moe.RouterHooks(model, shape, replay=record.routing)
    with torch.no_grad(), same.active():
        replay_logp, _ = response_logprobs(model, batch, 1.0)
    assert torch.equal(replay_logp, rollout_logp)

    _drift_routers(model)
    free = moe.RouterHooks(model, shape)
    with torch.no_grad(), free.active():
        response_logprobs(model, batch, 1.0)
    replay = moe.RouterHooks(model, shape, replay=record.routing)
    with torch.no_grad(), replay.active():
        response_logprobs(model, batch, 1.0)
    mask = batch.attention_mask
    assert moe.routing_mismatch(free.routing, record.routing, mask) > 0.05  # the drift changed expert choices
    assert moe.routing_mismatch(replay.natural, record.routing, mask) > 0.05  # ... and replay saw that

    # What the experts actually ran, read at the experts module's input (not from our own bookkeeping):
    ran: list[torch.Tensor] = []
    experts = [m for n, m in model.named_modules() if n.endswith("mlp.experts")]
    handles = [m.register_forward_pre_hook(lambda mod, args: ran.append(args[1].reshape(*shape, -1).clone()))
               for m in experts]
    try:
        with torch.no_grad(), moe.RouterHooks(model, shape, replay=record.routing).active():
            response_logprobs(model, batch, 1.0)
    finally:
        for h in handles:
            h.remove()
    assert len(ran) == 2
    assert all(torch.equal(a, b.long()) for a, b in zip(ran, record.routing, strict=True))


def test_replay_keeps_router_gradient_through_the_replayed_experts(tiny_moe):
    """After drift, the router still gets gradient under replay, and it differs from the free-routing gradient."""
    model, batch, shape, record, _ = _fresh_recorded(tiny_moe)
    _drift_routers(model)

    def router_grads(replay):
        model.zero_grad()
        with moe.RouterHooks(model, shape, replay=replay).active():
            logp, _ = response_logprobs(model, batch, 1.0)
        logp.sum().backward()
        return [r.weight.grad.clone() for _, r in moe.find_routers(model)]

    with_replay, without = router_grads(record.routing), router_grads(None)
    assert all(g.abs().sum() > 0 for g in with_replay)
    assert any(not torch.allclose(a, b) for a, b in zip(with_replay, without, strict=True))


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_every_algorithm_trains_the_tiny_moe(tmp_path, small_config, name):
    params = {"algo.valid_threshold": 0.0} if name == "gpg" else {}
    cfg = small_config(tmp_path, **{"model.name": MOE, "task.name": "countdown", "algo.name": name,
                                    "moe.routing_replay": True, "optim.minibatches": 2, **params})
    trainer = build_trainer(cfg)
    last = trainer.run()
    assert trainer.policy.is_moe and last["updates"] == 2 and last["skipped_updates"] == 0
    # π_old, π_θ and the reference score the batch routing was recorded on
    assert trainer.learner.row_by_row_min_width == 0
    for key in ("moe/routing_mismatch", "moe/load_imbalance", "moe/load_entropy", "rollout_load_imbalance"):
        assert key in last
    assert len(last["moe/expert_load"]) == 2 and len(last["moe/expert_load"][0]) == 8
    assert sum(last["moe/expert_load"][0]) == pytest.approx(1.0, abs=1e-3)


def test_aux_loss_coefficient_adds_the_switch_loss(tmp_path, small_config):
    def router_loss(coef: float, where: str):
        trainer = build_trainer(small_config(tmp_path / where, **{"model.name": MOE, "task.name": "countdown",
                                                                  "moe.aux_loss_coef": coef}))
        batch, _ = trainer.prepare_batch(trainer.collect_rollouts()[0])
        rows = torch.arange(batch.size)
        _, _, extra, metrics = trainer.learner.moe_forward(batch, rows, batch.select(rows))
        return float(extra), metrics

    zero, m0 = router_loss(0.0, "a")
    half, m1 = router_loss(0.5, "b")
    assert zero == 0.0 and "moe/aux_loss" not in m0
    assert half == pytest.approx(0.5 * m1["moe/aux_loss"], rel=1e-5)
    # The same batch through transformers' own MoE forward gives the same Switch loss.
    trainer = build_trainer(small_config(tmp_path / "c", **{"model.name": MOE, "task.name": "countdown"}))
    batch, _ = trainer.prepare_batch(trainer.collect_rollouts()[0])
    out = trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids, output_router_logits=True)
    assert m1["moe/aux_loss"] == pytest.approx(float(out.aux_loss), rel=1e-4)


def test_freeze_router_keeps_router_weights(tmp_path, small_config):
    trainer = build_trainer(small_config(tmp_path, **{"model.name": MOE, "task.name": "countdown",
                                                      "moe.freeze_router": True, "run.steps": 1,
                                                      "rollout.samples_per_prompt": 8, "rollout.temperature": 1.5}))
    routers = [r.weight.detach().clone() for _, r in moe.find_routers(trainer.model)]
    others = [p.detach().clone() for n, p in trainer.model.named_parameters() if "gate" not in n]
    last = trainer.run()
    assert last["grad_norm"] > 0  # the batch had signal, so something must move
    assert all(torch.equal(a, r.weight) for a, (_, r) in zip(routers, moe.find_routers(trainer.model), strict=True))
    after = [p for n, p in trainer.model.named_parameters() if "gate" not in n]
    assert any(not torch.equal(a, b) for a, b in zip(others, after, strict=True))


def test_moe_options_on_a_dense_model_fail_at_start(tmp_path, small_config):
    with pytest.raises(ValueError, match="has no MoE router"):
        build_trainer(small_config(tmp_path, **{"moe.routing_replay": True}))


def _tiny(kind: str, vocab: int):
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    common = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}
    if kind == "qwen2_moe":
        return Qwen2MoeForCausalLM(Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, shared_expert_intermediate_size=32))
    return MixtralForCausalLM(MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2))


@pytest.mark.parametrize("kind", ["qwen2_moe", "mixtral"])
def test_other_hf_moe_families_record_and_replay(tiny_moe, kind):
    _, tok = tiny_moe
    model = _tiny(kind, len(tok)).eval()
    assert len(moe.find_routers(model)) == 2
    batch = _batch(tok)
    shape = tuple(batch.input_ids.shape)
    record = moe.RouterHooks(model, shape)
    with torch.no_grad(), record.active():
        logp, _ = response_logprobs(model, batch, 1.0)
    replay = moe.RouterHooks(model, shape, replay=record.routing)
    with torch.no_grad(), replay.active():
        again, _ = response_logprobs(model, batch, 1.0)
    torch.testing.assert_close(again, logp, atol=1e-6, rtol=1e-5)
    load = moe.expert_load(record.routing, 4, batch.attention_mask)
    assert load.shape == (2, 4) and torch.allclose(load.sum(1), torch.ones(2))


def test_moe_generates_padded_batches(tiny_moe):
    from mmrl.trainer.rollout import generate

    model, tok = tiny_moe
    short = encode_prompt(tok, [{"role": "user", "content": "Use 3, 5 once each with + - * to make 8."}], 128)
    long_ = encode_prompt(tok, [{"role": "user", "content": "Use 9, 9 once each with + - * to make 81. " * 3}], 256)
    assert len(long_) > len(short)
    out = generate(model, tok, [short, long_, short], 12, temperature=1.0, top_p=1.0)
    assert len(out) == 3 and all(r.token_ids for r in out)


def test_unsafe_moe_combinations_fail_at_start(tmp_path, small_config):
    with pytest.raises(ValueError, match="cannot be combined with model.gradient_checkpointing"):
        build_trainer(small_config(tmp_path, **{"model.name": MOE, "moe.routing_replay": True,
                                                "model.gradient_checkpointing": True}))
    with pytest.raises(ValueError, match="freeze_router with a router loss"):
        build_trainer(small_config(tmp_path, **{"model.name": MOE, "moe.freeze_router": True,
                                                "moe.aux_loss_coef": 0.01}))


def test_replay_refuses_routers_whose_weights_it_cannot_reproduce(tiny_moe):
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    _, tok = tiny_moe
    model = GraniteMoeForCausalLM(GraniteMoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=32,
                                                   num_hidden_layers=1, num_attention_heads=4,
                                                   num_key_value_heads=2, num_local_experts=4,
                                                   num_experts_per_tok=2)).eval()
    batch = _batch(tok)
    record = moe.RouterHooks(model, tuple(batch.input_ids.shape))
    with torch.no_grad(), record.active():  # recording and metrics work for any *TopKRouter
        response_logprobs(model, batch, 1.0)
    assert len(record.routing) == 1
    with pytest.raises(ValueError, match="replay supports"):
        with moe.RouterHooks(model, tuple(batch.input_ids.shape), replay=record.routing).active():
            pass
