"""What mmrl's generator sends to vLLM (mmrl/openrlhf/sampling.py), and the rehearsal's engine applying a repetition
penalty as vLLM does (mmrl/openrlhf/rollout.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

from mmrl.models import load_model, load_tokenizer
from mmrl.openrlhf import vllm_stand_in
from mmrl.openrlhf.evaluation import set_generate_kwargs
from mmrl.run.prompts import encode_prompt

with openrlhf_importable():
    from openrlhf.trainer.ppo_utils import samples_generator

    from mmrl.openrlhf import rollout, sampling

MODEL = "embedded:tiny-qwen2"


class Engine:
    """A vLLM engine's Ray handle as the dispatch calls it: records each request."""

    def __init__(self, pending: int) -> None:
        self.pending, self.requests = pending, []
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: self.pending)
        self.generate_responses = SimpleNamespace(remote=lambda **request: self.requests.append(request) or request)


def dispatched(method, monkeypatch, **generate_kwargs) -> list[list[dict]]:
    """Each engine's requests when ``method`` (OpenRLHF's dispatch or mmrl's) sends three prompts to two engines."""
    # both dispatches build vLLM's SamplingParams in OpenRLHF's code (mmrl's adds the penalty on the way out)
    monkeypatch.setattr(samples_generator, "SamplingParams", vllm_stand_in.SamplingParams)
    monkeypatch.setattr(samples_generator.ray, "get", lambda refs: refs)
    engines = [Engine(3), Engine(0)]
    gen = SimpleNamespace(vllm_engines=engines, tokenizer="tok", args=SimpleNamespace(
        rollout=SimpleNamespace(n_samples_per_prompt=4), algo=SimpleNamespace(advantage=SimpleNamespace(
            is_correction_level="off"))))
    method(gen, ["a", "b", "c"], ["la", "lb", "lc"], images=None, **generate_kwargs)
    return [e.requests for e in engines]


def test_the_dispatch_is_openrlhfs_with_the_repetition_penalty(monkeypatch):
    """Same engines, same order, same requests as OpenRLHF's own dispatch; the sampling also carries the penalty,
    which OpenRLHF's leaves at vLLM's 1.0."""
    kwargs = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "max_new_tokens": 32, "max_len": 96,
              "n_samples_per_prompt": 2, "repetition_penalty": 1.05}
    theirs = dispatched(samples_generator.SamplesGenerator._dispatch_prompts_to_vllm, monkeypatch, **kwargs)
    ours = dispatched(sampling.EngineDispatch._dispatch_prompts_to_vllm, monkeypatch, **kwargs)
    assert [[r["prompt"] for r in e] for e in ours] == [["c"], ["a", "b"]]  # the idle engine first
    for mine, base in zip(sum(ours, []), sum(theirs, []), strict=True):
        params, expected = mine.pop("sampling_params"), base.pop("sampling_params")
        assert mine == base
        assert params.repetition_penalty == 1.05 and expected.repetition_penalty == 1.0
        assert {**vars(params), "repetition_penalty": 1.0} == vars(expected)


def test_evaluation_sets_sample_with_their_own_repetition_penalty():
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.2, "max_len": 64}
    spec = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 8, "samples": 1}
    assert set_generate_kwargs({**spec, "repetition_penalty": 1.05}, base)["repetition_penalty"] == 1.05
    assert set_generate_kwargs(spec, base)["repetition_penalty"] == 1.0  # not the rollout's


def vllm_greedy(model, prompt: list[int], steps: int, penalty: float) -> list[int]:
    """vLLM's repetition penalty (``apply_repetition_penalties_torch``): the logits of tokens in the prompt or the
    output so far divided by the penalty where positive, multiplied where not; then the argmax."""
    out: list[int] = []
    for _ in range(steps):
        logits = model(torch.tensor([prompt + out])).logits[0, -1].float()
        repeated = torch.zeros_like(logits, dtype=torch.bool)
        repeated[torch.tensor(prompt + out)] = True
        penalties = torch.where(repeated, torch.tensor(penalty), torch.tensor(1.0))
        out.append(int((logits * torch.where(logits > 0, 1.0 / penalties, penalties)).argmax()))
    return out


@pytest.mark.parametrize("penalty", [1.0, 0.3])
def test_the_rehearsal_engine_penalises_repeats_as_vllm(penalty):
    """Greedy decoding on the rehearsal's engine gives vLLM's tokens under its penalty rule (the tiny model's logits
    are so peaked that only a penalty below 1, which favours the prompt's and output's tokens, changes its choices;
    the rule is the same either side of 1)."""
    engine = rollout.HFRolloutActor.__new__(rollout.HFRolloutActor)  # no Ray actor, no run folder: generation only
    engine.model, engine.processor, engine.tokenizer = load_model(MODEL).eval(), None, load_tokenizer(MODEL)
    engine.model.generation_config.eos_token_id = None  # every step decoded, as the reference does
    prompt = encode_prompt(engine.tokenizer, [{"role": "user", "content": "Count: 1 2 3 1 2 3 1 2"}], 64)
    params = vllm_stand_in.SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=penalty)
    got = engine._generate(prompt, params, None).outputs[0].token_ids
    with torch.no_grad():
        assert got == vllm_greedy(engine.model, prompt, 12, penalty)
        if penalty != 1.0:
            assert got != vllm_greedy(engine.model, prompt, 12, 1.0)
