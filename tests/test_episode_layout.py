"""Multi-turn layout pieces that need no engine: the per-token loss mask in `collate`, and the chat-template rendering
of an episode's turns (real embedded tokenizers)."""

from __future__ import annotations

import pytest
import torch

import mmrl.algos as algos
from mmrl.batch import Group, Response, collate
from mmrl.envs.episode import TurnRenderer
from mmrl.models import load_tokenizer
from mmrl.rewards.base import RewardResult


def test_collate_copies_the_loss_mask_and_keeps_env_tokens_in_context():
    episode = Response([5, 6, 7, 8, 9], reward=RewardResult(1.0), loss_mask=[1, 1, 0, 0, 1])
    plain = Response([5, 6], reward=RewardResult(0.0))
    batch = collate([Group(0, {}, [1, 2, 3], [episode, plain])], pad_id=0)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
    # env tokens are context (attended to), only the mask excludes them from the loss
    assert batch.attention_mask[0].tolist() == [1] * 8
    assert batch.input_ids[0, 3:].tolist() == [5, 6, 7, 8, 9]


def test_a_loss_mask_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="loss_mask has 2 entries for 3 tokens"):
        Response([1, 2, 3], loss_mask=[1, 0])


@pytest.mark.parametrize("spec", ["embedded:tiny-qwen2", "smollm2-135m-instruct"])
def test_turns_render_exactly_as_the_chat_template_renders_the_conversation(spec):
    tok = load_tokenizer(spec)
    renderer = TurnRenderer(tok, system_prompt="Act well." if spec.startswith("smollm2") else None)
    first, reply, feedback = "You see a fridge 1.", "<think>cold</think><action>go to fridge 1</action>", "Done."
    stop = tok.eos_token_id
    ids = renderer.prompt_ids(first) + tok(reply, add_special_tokens=False)["input_ids"] + [stop]
    ids += renderer.feedback_ids(feedback, tok.decode([stop]))
    messages = renderer.system + [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
                                  {"role": "user", "content": feedback}]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == expected
    # a turn cut short (no stop token) is closed by the template's own end-of-turn text
    cut = renderer.feedback_ids(feedback, None)
    assert tok.decode(cut).startswith(renderer.end_of_turn)


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_env_tokens_neither_change_the_loss_nor_get_gradient(name):
    """Every objective on an episode row (action tokens interleaved with masked env tokens) equals the objective on the
    same row with the env tokens cut out: GMPO's geometric mean and GRPO's token mean run over action tokens only,
    GVPO's sequence log-prob sums only the policy's own tokens, Dr.GRPO's normaliser is a constant."""
    gen = torch.Generator().manual_seed(0)
    n, t = 4, 12
    mask = (torch.rand(n, t, generator=gen) > 0.4).float()
    mask[:, 0] = 1
    old = -torch.rand(n, t, generator=gen) * 3
    new = (old + 0.2 * torch.randn(n, t, generator=gen)).requires_grad_(True)
    rewards, group_ids = torch.tensor([10.0, 0.0, -0.3, 9.9]), torch.tensor([0, 0, 1, 1])
    extra = {"max_tokens": 16} if "max_tokens" in algos.hyperparameters(name) else {}
    algo = algos.get(name, **extra)
    adv = algo.advantages(rewards, group_ids)
    ref = old.detach() + 0.1

    def loss_of(logprobs, old_lp, m, ref_lp):
        stats = algo.batch_stats(rewards, group_ids, adv, old_lp, m)
        return algo.policy_loss(logprobs, old_lp, adv, m, group_ids, ref_lp, stats)[0]

    loss = loss_of(new, old, mask, ref)
    loss.backward()
    assert (new.grad[mask == 0] == 0).all()  # env tokens get no gradient
    # compacted rows: only the action tokens, right-padded
    width = int(mask.sum(1).max())

    def compact(x):
        out = torch.zeros(n, width)
        for i in range(n):
            kept = x[i][mask[i] == 1]
            out[i, : len(kept)] = kept
        return out

    cmask = compact(mask)
    compacted = loss_of(compact(new.detach()), compact(old), cmask, compact(ref))
    torch.testing.assert_close(loss.detach(), compacted, atol=1e-5, rtol=1e-5)
    # and scrambling the env positions' log-probs changes nothing
    scrambled = torch.where(mask == 1, new.detach(), torch.full_like(new, -7.0))
    torch.testing.assert_close(loss_of(scrambled, torch.where(mask == 1, old, 3.0), mask, ref), loss.detach())


def test_a_task_brings_its_recommended_config_under_the_users_flags():
    from mmrl.train import parse_config

    cfg = parse_config(["--task", "alfworld"])
    assert cfg.model.name == "embedded:tiny-qwen2-agent" and cfg.rollout.max_new_tokens == 40
    assert cfg.rollout.max_episode_tokens == 3072 and cfg.sft.steps == 0 and cfg.optim.warmup_steps == 10
    assert cfg.optim.target_kl == 0.02  # the KL band of each optimizer step (docs/alfworld.md)
    cfg = parse_config(["--task", "alfworld", "--rollout.max_new_tokens", "12", "--sft-warmup", "5",
                        "--model", "embedded:tiny-qwen2"])
    assert (cfg.rollout.max_new_tokens, cfg.sft.steps, cfg.model.name) == (12, 5, "embedded:tiny-qwen2")
    plain = parse_config(["--task", "arithmetic"])
    assert plain.model.name == "embedded:tiny-qwen2" and plain.rollout.max_new_tokens == 16


def test_sft_warmup_on_a_single_turn_task_fails_at_start(tmp_path, small_config):
    from mmrl.trainer.local import build_trainer

    with pytest.raises(ValueError, match="sft.steps .* needs a multi-turn task"):
        build_trainer(small_config(tmp_path, **{"sft.steps": 3}))
