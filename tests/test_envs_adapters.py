"""Round trips through the adapters other trainers use: gymnasium, TRL's environment_factory, OpenRLHF's agent file.

Each plays a real generated ALFWorld game on the real engine to a win with the expert's commands (and checks the
losing/invalid paths). The OpenRLHF test drives OpenRLHF's own MultiTurnAgentExecutor; vLLM cannot run on a CPU, so
the test stubs `vllm` and `flash_attn` in sys.modules (as OpenRLHF's own tests do) and plays the generation side
with the expert's commands written through a real tokenizer.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import types

import pytest

pytest.importorskip("alfworld")

from mmrl.envs.actions import format_action  # noqa: E402
from mmrl.envs.alfworld import AlfWorldEnv, list_games  # noqa: E402


def game_of(root, task_type):
    return next(g for g in list_games(root, "train") if g.task_type == task_type)


def test_envs_import_without_torch_or_trainer():
    code = ("import sys; import mmrl.envs, mmrl.envs.alfworld, mmrl.envs.pool, mmrl.envs.episode, "
            "mmrl.envs.adapters.trl, mmrl.envs.adapters.gymnasium_env, mmrl.envs.alfworld.generate; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('mmrl.trainer')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gymnasium_round_trip(alfworld_games):
    gymnasium = pytest.importorskip("gymnasium")
    from gymnasium.utils.env_checker import check_env

    from mmrl.envs.adapters.gymnasium_env import AlfWorldGymEnv, register

    game = game_of(alfworld_games, "look_at_obj_in_light")
    env = gymnasium.make(register(), game_path=str(game.path), render_mode="ansi", max_steps=20)
    check_env(env.unwrapped, skip_render_check=True)  # gymnasium's own API checks (spaces, seeding, determinism)

    obs, info = env.reset(seed=1)
    assert env.observation_space.contains(obs) and info["task_type"] == "look_at_obj_in_light"
    for command in env.unwrapped.env.walkthrough:
        obs, reward, terminated, truncated, info = env.step(format_action(command))
    assert (reward, terminated, truncated, info["won"]) == (10.0, True, False, True)
    assert env.render() == obs

    env.reset(seed=1)
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step("no idea")
    assert (terminated, truncated, reward) == (False, True, -0.1)
    env.close()
    assert isinstance(env.unwrapped, AlfWorldGymEnv)


def test_trl_environment_round_trip(alfworld_games):
    from transformers.utils import get_json_schema

    from mmrl.envs.adapters.trl import alfworld_environment, dataset_rows, env_reward, env_success

    rows = dataset_rows(list_games(alfworld_games, "train"))
    row = next(r for r in rows if r["task_type"] == "pick_clean_then_place_in_recep")
    Env = alfworld_environment(max_steps=30)
    # TRL exposes every public method other than reset as a tool: there must be exactly one, with a usable schema.
    tools = [n for n, _ in inspect.getmembers(Env, inspect.isfunction) if not n.startswith("_") and n != "reset"]
    assert tools == ["act"]
    schema = get_json_schema(Env.act)
    assert schema["function"]["name"] == "act" and schema["function"]["parameters"]["required"] == ["action"]

    env = Env()  # TRL builds instances with no arguments
    first = env.reset(**row)
    # TRL appends the first observation to the prompt's last message: it must start on a line of its own
    assert first.startswith("\n\nYour task is to: ") and "Admissible actions:" in first and "<action>" not in first
    walkthrough = AlfWorldEnv(row["game_path"]).walkthrough
    for command in walkthrough:
        text = env.act(command)
    assert "The task is done." in text
    with pytest.raises(ValueError, match="episode is over"):
        env.act("look")
    loser = Env()
    loser.reset(**row)
    assert "Nothing happens." in loser.act("dance")
    assert env_reward([env, loser]) == [10.0, 0.0] and env_success([env, loser]) == [1.0, 0.0]
    assert env.steps == len(walkthrough) and env.won
    env.reset(**row)  # a new episode on the same instance starts clean
    assert (env.reward, env.done, env.steps) == (0.0, False, 0)
    with pytest.raises(KeyError, match="game_path"):
        Env().reset(prompt="x")


@pytest.fixture
def openrlhf_agent_module(monkeypatch):
    pytest.importorskip("openrlhf")
    # vLLM and flash-attn are CUDA-only and cannot be installed here; OpenRLHF's own tests stub them the same way.
    for name in ("vllm", "flash_attn"):
        if name not in sys.modules:
            try:
                __import__(name)
            except ImportError:
                monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    import importlib.util

    from mmrl.envs.adapters import openrlhf_agent

    # Load it the way OpenRLHF does (vllm_engine._load_agent_executor): by file path, as "agent_module".
    spec = importlib.util.spec_from_file_location("agent_module", openrlhf_agent.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExpertEngine:
    """The generation side (vLLM's engine cannot run on a CPU): answers each request with the next expert command,
    tokenized with the real tokenizer, ending in <|im_end|> as a chat model does."""

    def __init__(self, tokenizer, commands):
        self.tokenizer, self.commands, self.prompts = tokenizer, list(commands), []

    async def generate(self, token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(token_ids))
        text = format_action(self.commands.pop(0), "next step of the plan") + "<|im_end|>"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        output = types.SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=None)
        return types.SimpleNamespace(outputs=[output])


@pytest.mark.parametrize("env_workers", [0, 1], ids=["threads", "pool"])
def test_openrlhf_agent_round_trip(openrlhf_agent_module, alfworld_games, embedded_model_dir, tmp_path, env_workers):
    from openrlhf.utils.agent import AgentExecutorBase, MultiTurnAgentExecutor
    from transformers import AutoTokenizer

    from mmrl.envs.adapters.openrlhf_agent import write_dataset

    AgentExecutor = openrlhf_agent_module.AgentExecutor
    assert issubclass(AgentExecutor, MultiTurnAgentExecutor) and issubclass(AgentExecutor, AgentExecutorBase)
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    game = game_of(alfworld_games, "pick_cool_then_place_in_recep")
    dataset = write_dataset([game], tmp_path / "alfworld.jsonl", max_steps=20)
    row = json.loads(dataset.read_text().splitlines()[0])
    walkthrough = AlfWorldEnv(game.path).walkthrough
    engine = ExpertEngine(tokenizer, walkthrough)
    params = types.SimpleNamespace(max_tokens=None, logprobs=None)

    executor = AgentExecutor(env_workers)
    result = asyncio.run(executor.execute(row["prompt"], row["label"], params, 100_000, tokenizer, engine))
    assert result["reward"] == pytest.approx(10.0) and result["scores"] == 1.0
    assert result["extra_logs"]["won"] == 1.0 and result["extra_logs"]["turns"] == len(walkthrough)
    assert len(result["action_ranges"]) == len(walkthrough)
    text = tokenizer.decode(result["observation_tokens"])
    assert text.startswith("<|im_start|>user\nYou are an expert agent") and "Your task is to:" in text
    assert text.count("<|im_start|>assistant\n") == len(walkthrough)
    for (start, end), command in zip(result["action_ranges"], walkthrough, strict=True):
        assert command in tokenizer.decode(result["observation_tokens"][start:end])

    # a failing env (its game file is gone) ends the episode with no reward instead of raising into the actor
    broken = json.loads(row["label"])
    broken["game_path"] = str(tmp_path / "missing" / "game.tw-pddl")
    engine = ExpertEngine(tokenizer, ["look"])
    failed = asyncio.run(executor.execute("", json.dumps(broken), params, 100_000, tokenizer, engine))
    assert failed["reward"] == 0.0 and failed["extra_logs"]["env_failed"] == 1.0
    assert "not found" in tokenizer.decode(failed["observation_tokens"])
    if executor.pool is not None:  # finished episodes free their envs in the workers
        assert executor.pool.stats()["envs_per_worker"] == [0]
    executor.close()
