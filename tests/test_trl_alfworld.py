"""mmrl's ALFWorld env inside a real TRL ``GRPOTrainer`` (TRL 1.16, the ``bench`` extra): two training steps on CPU.

The shipped ALFWorld warm start plays in mmrl's own prompt layout, so it would never write a tool call by itself. The
test first teaches it, with a few dozen supervised steps, to play one generated game's walkthrough in the
tool-calling chat format TRL renders (tools in the system turn, ``<tool_call>`` blocks, ``tool`` turns); then TRL's
own trainer plays that game through ``environment_factory``, and the env's rewards (10 on a win) must be what TRL
trains on.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("alfworld")
trl = pytest.importorskip("trl")

from mmrl.cache import EMBEDDED_AGENT_SFT_NAME  # noqa: E402
from mmrl.envs.adapters.trl import alfworld_environment, dataset_rows, env_reward  # noqa: E402
from mmrl.envs.alfworld import AlfWorldEnv, list_games  # noqa: E402
from mmrl.models import load_model, load_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow


def walkthrough_conversation(env_class, row: dict, commands: list[str]) -> list[dict]:
    """The messages TRL builds for an episode that plays ``commands``: the prompt with the first observation appended
    to its last message, then one assistant tool call and one tool result per command."""
    env = env_class()
    first = env.reset(**row)
    messages = [*row["prompt"][:-1], {**row["prompt"][-1], "content": row["prompt"][-1]["content"] + first}]
    for command in commands:
        call = {"type": "function", "function": {"name": "act", "arguments": {"action": command}}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "name": "act", "content": env.act(command)})
    assert env.won, "the walkthrough must win the game"
    return messages


def assistant_labels(tokenizer, messages: list[dict], tools: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of the whole conversation and labels that keep only the assistant turns' tokens (-100 elsewhere)."""

    def ids(upto: int, generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=False,
                                             add_generation_prompt=generation_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    full = ids(len(messages), False)
    labels = [-100] * len(full)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start, end = len(ids(i, True)), len(ids(i + 1, False))
            assert full[:end] == ids(i + 1, False), "the chat template must be prefix-preserving"
            labels[start:end] = full[start:end]
    return torch.tensor([full]), torch.tensor([labels])


def teach_walkthrough(model, input_ids: torch.Tensor, labels: torch.Tensor, target: float = 0.04,
                      max_steps: int = 150) -> float:
    """Supervised steps on the walkthrough until its loss is below ``target`` (the warm start gets there in ~60);
    returns the last loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < target:
            break
    return loss.item()


@pytest.fixture(scope="module")
def small_games():
    """Games in 3-receptacle rooms without distractors: short observations keep the conversation under 1,000 tokens."""
    from mmrl.envs.alfworld import ensure_games

    return ensure_games(n_per_type=1, n_eval_per_type=0, n_receptacles=3, n_distractors=0)


def test_grpo_trainer_trains_on_alfworld_env_rewards(small_games, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    game = next(g for g in list_games(small_games, "train") if g.task_type == "pick_and_place_simple")
    row = dataset_rows([game])[0]
    Env = alfworld_environment(max_steps=8)
    tokenizer = load_tokenizer(EMBEDDED_AGENT_SFT_NAME)
    model = load_model(EMBEDDED_AGENT_SFT_NAME)
    commands = AlfWorldEnv(game.path).walkthrough
    messages = walkthrough_conversation(Env, row, commands)
    input_ids, labels = assistant_labels(tokenizer, messages, [Env.act])
    assert teach_walkthrough(model, input_ids, labels) < 0.04

    rewards_seen: list[list[float]] = []

    def recorded_env_reward(environments, **kwargs) -> list[float]:
        rewards = env_reward(environments, **kwargs)
        assert rewards == [10.0 if env.won else 0.0 for env in environments]  # the env's own return, unchanged
        rewards_seen.append(rewards)
        return rewards

    args = GRPOConfig(output_dir=str(tmp_path / "trl"), report_to="none", save_strategy="no", logging_steps=1,
                      disable_tqdm=True, use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, max_steps=2,
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=512,
                      max_tool_calling_iterations=len(commands) + 2, learning_rate=1e-4, beta=0.0,
                      temperature=0.3)  # the memorised walkthrough, sampled: at 1.0 one slip in ~230 tokens loses
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=recorded_env_reward,
                          train_dataset=Dataset.from_list([row] * 8), args=args, environment_factory=Env)
    trainer.train()

    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(rewards_seen) == len(logged) == 2
    for entry, rewards in zip(logged, rewards_seen, strict=True):
        assert entry["reward"] == pytest.approx(sum(rewards) / len(rewards))  # TRL trains on the env's rewards
        assert math.isfinite(entry["loss"])
    wins = [r for rewards in rewards_seen for r in rewards if r > 0]
    assert wins, f"no episode won: {json.dumps(rewards_seen)}"
