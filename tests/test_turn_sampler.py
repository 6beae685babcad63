"""The KV cache carried across turns (mmrl/trainer/turn_sampler.py) samples exactly what re-reading does.

Real engine, real embedded agent model (untrained: its greedy turns are deterministic text). Greedy episodes played with
the cache and without it (every turn re-reads the whole episode through ``generate``) must be token for token the same,
with the same log-probs, while episodes end at different turns (different step limits), turns stop at different
lengths (an extra stop token), and running episodes are split over several cache row groups (``batch_size`` 2).
``tests/test_alfworld_rl.py`` checks that re-scoring finished episodes reproduces the cached sampler's log-probs.
"""

from __future__ import annotations

import collections

import pytest
import torch

pytest.importorskip("alfworld")

from mmrl.envs.alfworld import AlfWorldEnv  # noqa: E402
from mmrl.envs.episode import TurnRenderer  # noqa: E402
from mmrl.models import load_model, load_tokenizer  # noqa: E402
from mmrl.tasks import get_task  # noqa: E402
from mmrl.trainer.episodes import Episode, model_policy, run_episodes  # noqa: E402
from mmrl.trainer.turn_sampler import CachedTurnSampler  # noqa: E402

AGENT = "embedded:tiny-qwen2-agent"


@pytest.fixture(scope="module")
def setup():
    task = get_task("alfworld", n_per_type=1, n_eval_per_type=1, max_steps=3)
    return task, load_model(AGENT), load_tokenizer(AGENT)


def play(task, model, tok, kv_cache: bool, temperature: float = 0.0, batch_size: int = 2) -> list[Episode]:
    games = [row["game"] for row in task.train[:3]]
    episodes = [Episode(AlfWorldEnv(game, max_steps=steps), seed=0) for game, steps in zip(games, (2, 4, 3),
                                                                                           strict=True)]
    torch.manual_seed(0)
    policy = model_policy(model, tok, 20, temperature, batch_size=batch_size, with_logprobs=True, kv_cache=kv_cache)
    assert isinstance(policy, CachedTurnSampler) == kv_cache
    return run_episodes(episodes, TurnRenderer(tok, task.system_prompt), policy, 3072)


def test_cached_turns_equal_rereading_the_episode(setup):
    task, model, tok = setup
    plain = play(task, model, tok, kv_cache=False)
    # a token the model emits in some turns but not at once: as a stop token, turns end at different lengths
    counts = collections.Counter(t for ep in plain for t, m in zip(ep.token_ids, ep.loss_mask, strict=True) if m)
    extra_stop = counts.most_common(2)[1][0]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, extra_stop]
    try:
        cached, reread = play(task, model, tok, kv_cache=True), play(task, model, tok, kv_cache=False)
    finally:
        model.generation_config.eos_token_id = saved
    assert [ep.steps for ep in cached] == [2, 4, 3]  # episodes leave the batch at different turns
    turn_lengths = {len(a) for ep in cached for a in ep.actions}
    assert len(turn_lengths) > 1  # some turns stopped early, others ran to the budget
    for a, b in zip(cached, reread, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        logprobs = torch.tensor([x if x is not None else 0.0 for x in a.sampler_logprobs])
        expected = torch.tensor([x if x is not None else 0.0 for x in b.sampler_logprobs])
        torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_sampled_turns_follow_the_seed(setup):
    task, model, tok = setup
    first, again = play(task, model, tok, True, temperature=1.0), play(task, model, tok, True, temperature=1.0)
    assert [ep.token_ids for ep in first] == [ep.token_ids for ep in again]  # the torch seed decides the samples
    model_logprobs = [lp for ep in first for lp in ep.sampler_logprobs if lp is not None]
    assert all(lp <= 0 for lp in model_logprobs) and min(model_logprobs) < -1  # sampled, not the argmax each time


def test_a_context_that_does_not_grow_is_refused(setup):
    task, model, tok = setup
    sampler = CachedTurnSampler(model, tok, 4, 0.0)
    episode = Episode(None, prompt_ids=tok("hello there", add_special_tokens=False)["input_ids"])
    sampler([episode])
    episode.token_ids = [episode.prompt_ids[0]]  # rewritten instead of extended
    episode.prompt_ids = episode.prompt_ids[1:]
    with pytest.raises(RuntimeError, match="no longer extends"):
        sampler([episode])
