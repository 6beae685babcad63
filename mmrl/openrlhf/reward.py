"""mmrl's rewards behind OpenRLHF's ``reward_func`` file mechanism (``--reward.remote_url path/reward_func.py``).

OpenRLHF's ``SingleTurnAgentExecutor`` (inside every vLLM engine actor) loads the file and calls
``reward_func(queries, prompts, labels)`` once per response: ``queries`` is prompt + response decoded with the special
tokens kept, ``prompts`` the chat-templated prompt, ``labels`` what mmrl exported as the row's label: the task sample
(everything but the chat) as JSON. The function rebuilds the task's `Reward` once per process and returns OpenRLHF's
``{"rewards", "scores", "extra_logs"}`` dict. A malformed completion or label scores the reward's floor with a reason
(mmrl's reward contract); it never raises into the vLLM actor.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("mmrl.openrlhf")


def collapse_expanded_placeholders(query: str, prompt: str, special_tokens: Sequence[str]) -> str:
    """``query`` with each run of a special token that ``prompt`` holds singly (an image's ``<|image_pad|>``) cut to
    one. OpenRLHF expands a vision prompt's placeholder into one copy per image token before generating
    (``process_prompt_with_images``), so the decoded query holds hundreds where the prompt's text holds one. A run
    inside the response is cut too, which changes nothing: special tokens are dropped from the completion."""
    for token in special_tokens:
        if token in prompt and token + token not in prompt:
            query = re.sub(f"(?:{re.escape(token)}){{2,}}", lambda _, t=token: t, query)
    return query


def completion_text(query: str, prompt: str, special_tokens: Sequence[str] = ()) -> str:
    """The response part of ``query`` (= prompt + response), with special tokens removed as the local trainer's
    ``decode(skip_special_tokens=True)`` would."""
    if not query.startswith(prompt):
        query = collapse_expanded_placeholders(query, prompt, special_tokens)
    if query.startswith(prompt):
        text = query[len(prompt):]
    else:  # the tokenizer round trip changed the prompt's text: cut at the longest common prefix
        text = query[len(os.path.commonprefix([query, prompt])):]
    for token in sorted(special_tokens, key=len, reverse=True):
        text = text.replace(token, "")
    return text


def _build_reward(spec: dict[str, Any]):
    from mmrl.run.build import build_task
    from mmrl.run.config import TrainConfig, apply_overrides

    cfg = TrainConfig()
    apply_overrides(cfg, {"task": {"name": spec["task"], **spec.get("options", {}),
                                   "reward_model": spec.get("reward_model", ""),
                                   "reward_model_weight": spec.get("reward_model_weight", 1.0)}}, "reward_func")
    task = build_task(cfg)
    return task.reward, task.accuracy_key, task.format_key


def _special_tokens(tokenizer_path: str) -> list[str]:
    if not tokenizer_path:
        return []
    from transformers import AutoTokenizer

    try:
        return list(AutoTokenizer.from_pretrained(tokenizer_path).all_special_tokens)
    except OSError as exc:  # the reward still works; completions then keep their special-token text
        log.warning("reward_func: cannot load the tokenizer %s (%s); special tokens stay in completions",
                    tokenizer_path, exc)
        return []


def make_reward_func(spec: dict[str, Any]) -> Callable[[list[str], list[str], list[str]], dict[str, Any]]:
    """``reward_func`` for task ``spec`` = {"task", "options", "reward_model", "reward_model_weight", "tokenizer"}."""
    state: dict[str, Any] = {}
    building = threading.Lock()

    def built() -> dict[str, Any]:
        # Built on first call, once per vLLM actor process. OpenRLHF calls reward_func from several threads at once
        # (asyncio.to_thread per sample), so the first calls wait for one build: without the lock a second thread saw
        # a half-filled state and raised KeyError('special'), and the step failed for want of rewards.
        with building:
            if not state:
                reward, accuracy_key, format_key = _build_reward(spec)
                special = _special_tokens(spec.get("tokenizer", ""))
                state.update(reward=reward, accuracy_key=accuracy_key, format_key=format_key, special=special)
        return state

    def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
        scoring = built()
        reward = scoring["reward"]
        samples, texts = [], []
        for query, prompt, label in zip(queries, prompts, labels, strict=True):
            texts.append(completion_text(query, prompt, scoring["special"]))
            try:
                sample = json.loads(label) if isinstance(label, str) else dict(label)
            except (ValueError, TypeError):
                sample = {}  # the reward scores its floor with a reason naming the missing answer
            samples.append(sample)
        results = reward(texts, samples)
        scores = torch.tensor([r.score for r in results], dtype=torch.float32)
        logs = {"mmrl/accuracy": [float(r.components.get(scoring["accuracy_key"], 0.0) >= 1.0) for r in results]}
        if scoring["format_key"]:
            logs["mmrl/format"] = [float(r.components.get(scoring["format_key"], 0.0) >= 1.0) for r in results]
        return {"rewards": scores, "scores": scores,
                "extra_logs": {k: torch.tensor(v, dtype=torch.float32) for k, v in logs.items()}}

    return reward_func


REWARD_FILE = '''"""Generated by mmrl: OpenRLHF's reward_func file (--reward.remote_url), calling mmrl's rewards."""

from mmrl.openrlhf.reward import make_reward_func

reward_func = make_reward_func({spec})
'''


def reward_file_text(spec: dict[str, Any]) -> str:
    return REWARD_FILE.format(spec=repr(json.loads(json.dumps(spec))))
