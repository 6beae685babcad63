"""LoRA through peft: only adapters train, the frozen base is the reference, adapter-only checkpoints, bad targets."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from mmrl.models import load_model
from mmrl.models.lora import (
    FrozenBase,
    LoraSettings,
    adapter_state,
    add_lora,
    is_lora,
    load_adapter_state,
    load_policy_weights,
    parse_targets,
)


@pytest.fixture
def tiny(embedded_model_dir):
    torch.manual_seed(0)
    return load_model(str(embedded_model_dir))


def _inputs(model):
    return {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}


def test_only_adapters_train_and_the_frozen_base_is_the_initial_model(tiny):
    base = copy.deepcopy(tiny)
    model = add_lora(tiny, LoraSettings(4, 8, ("q_proj", "v_proj")))
    assert is_lora(model) and not is_lora(base)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "v_proj"}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()  # the adapters now change the function
        reference = FrozenBase(model)
        want = base(**_inputs(base)).logits
        torch.testing.assert_close(reference(**_inputs(model)).logits, want, rtol=0, atol=0)
        assert not torch.allclose(model(**_inputs(model)).logits, want)


def test_adapter_state_round_trips_and_refuses_other_settings(tiny, embedded_model_dir):
    model = add_lora(tiny, LoraSettings(4, 8, ("all-linear",)))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    state = adapter_state(model)
    assert all("lora_" in n for n in state)
    torch.manual_seed(1)
    fresh = add_lora(load_model(str(embedded_model_dir)), LoraSettings(4, 8, ("all-linear",)))
    load_adapter_state(fresh, state)
    with torch.no_grad():
        torch.testing.assert_close(fresh(**_inputs(fresh)).logits, model(**_inputs(model)).logits, rtol=0, atol=0)
    other = add_lora(load_model(str(embedded_model_dir)), LoraSettings(4, 8, ("q_proj",)))
    with pytest.raises(ValueError, match="do not fit this model"):
        load_adapter_state(other, state)


def test_targets_that_match_nothing_fail_with_one_line_naming_both_sides(tiny):
    with pytest.raises(ValueError) as err:
        add_lora(tiny, LoraSettings(4, 8, ("q_proj", "query_key_value")))
    message = str(err.value)
    assert "\n" not in message and "model.lora_targets" in message
    assert "query_key_value" in message and "looked for q_proj, query_key_value" in message
    assert "k_proj" in message and "o_proj" in message  # the names the model does have
    assert parse_targets("q_proj, v_proj") == ("q_proj", "v_proj")
    for bad in ("", "all-linear,q_proj"):
        with pytest.raises(ValueError, match="model.lora_targets"):
            parse_targets(bad)


# ---------------------------------------------------------------------------------------------- in the local trainer

LORA = {"model.lora_rank": 4, "model.lora_alpha": 8, "optim.lr": 1e-2}


def test_a_lora_step_changes_only_adapters_and_rescoring_equals_the_sampler(tmp_path, embedded_model_dir,
                                                                            small_config):
    from mmrl.batch import Group, collate
    from mmrl.trainer.local import build_trainer
    from mmrl.trainer.rollout import batch_logprobs, generate

    trainer = build_trainer(small_config(tmp_path, **LORA, **{"run.steps": 1, "algo.kl_coef": 0.04}))
    model = trainer.model
    assert is_lora(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # the reference is the same model with its adapters off, not a copy of it
    assert isinstance(trainer.learner.ref_model, FrozenBase) and trainer.learner.ref_model.policy is model
    trainer.run()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)  # B starts at 0: after a step the adapters change the function

    prompts = [trainer.rollouts.prompt_ids(i) for i in range(3)]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        # the sampler hands the KV cache through PEFT's wrapper under the name the wrapped model takes
        warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
        responses = generate(model, trainer.tokenizer, prompts, 8, 1.0, 1.0, return_logprobs=True)
    groups = [Group(i, {}, p, [r]) for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]
    rescored, _ = batch_logprobs(model, collate(groups, trainer.tokenizer.pad_token_id), 1.0)
    for i, r in enumerate(responses):
        torch.testing.assert_close(rescored[i, : len(r.token_ids)], torch.tensor(r.logprobs), atol=1e-5, rtol=1e-5)


def test_lora_checkpoints_hold_only_adapters_and_resume_bit_identically(tmp_path, embedded_model_dir,
                                                                        small_config):
    from mmrl.run.checkpoint import latest_checkpoint, load_checkpoint
    from mmrl.trainer.local import build_trainer

    straight = build_trainer(small_config(tmp_path / "a", **LORA, **{"run.steps": 2}))
    straight.run()
    state = load_checkpoint(latest_checkpoint(straight.run_dir))
    assert state["lora"] == {"rank": 4, "alpha": 8, "targets": ["all-linear"]}
    assert set(state["model"]) == {n for n, p in straight.model.named_parameters() if p.requires_grad}

    build_trainer(small_config(tmp_path / "b", **LORA, **{"run.steps": 1, "run.checkpoint_every": 1})).run()
    resumed = build_trainer(small_config(tmp_path / "b", **LORA, **{"run.steps": 2, "run.resume": True}))
    assert resumed.step == 1
    resumed.run()
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_lora_targets_matching_nothing_stop_the_run_at_start(tmp_path, embedded_model_dir, small_config):
    from mmrl.trainer.local import build_trainer

    with pytest.raises(ValueError, match="no module named c_attn .*k_proj"):
        build_trainer(small_config(tmp_path, **LORA, **{"model.lora_targets": "c_attn"}))


def test_eval_loads_a_lora_runs_adapters_and_saves_every_completion(tmp_path, embedded_model_dir, small_config):
    import json

    from mmrl.eval import main as eval_main
    from mmrl.run.checkpoint import latest_checkpoint, load_checkpoint
    from mmrl.trainer.local import build_trainer

    trainer = build_trainer(small_config(tmp_path, **LORA, **{"run.steps": 1}))
    trainer.run()
    # what mmrl.eval does with the checkpoint: the base model plus the adapters is the trained policy
    state = load_checkpoint(latest_checkpoint(trainer.run_dir))
    loaded = load_policy_weights(load_model(str(embedded_model_dir)), state)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**_inputs(loaded)).logits, trainer.model(**_inputs(trainer.model)).logits,
                                   rtol=0, atol=0)

    samples = tmp_path / "eval_samples.jsonl"
    argv = ["--model", str(trainer.run_dir), "--k", "2", "--max-problems", "3", "--rollout.max_new_tokens", "8",
            "--save-samples", str(samples)]
    assert eval_main(argv) == 0
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(records) == 3 * 2 and {r["problem"] for r in records} == {0, 1, 2}
    assert all("completion" in r and "parts" in r for r in records)
    assert eval_main(argv) == 2  # an existing file is refused ...
    assert len(samples.read_text().splitlines()) == 6
    assert eval_main(argv + ["--overwrite-samples"]) == 0  # ... unless asked
