"""mmrl's own text sampling loop (mmrl.trainer.text_sampler): exact log-probs, stops, truncation, shared pre-fill."""

import math

import pytest
import torch

from mmrl.batch import Group, collate
from mmrl.models import load_model, load_tokenizer
from mmrl.run.prompts import encode_prompt
from mmrl.trainer.rollout import batch_logprobs, eos_ids, generate
from mmrl.trainer.text_sampler import draw_tokens, sample_texts

MODELS = ["embedded:tiny-qwen2", "embedded:tiny-qwen3-moe"]


# prompts of different lengths on which the tiny models' responses end at different steps
CONTENTS = ["Compute 3+4. Answer in <answer></answer> tags.", "Hello there, how are you today?",
            "Use 3, 5 once each with + - * to make 8."]


def prompts_of(tok, *contents):
    return [encode_prompt(tok, [{"role": "user", "content": c}], 128) for c in contents]


@pytest.fixture(scope="module", params=MODELS)
def model_and_tokenizer(request):
    return load_model(request.param), load_tokenizer(request.param)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (0.0, 1.0)])
def test_recorded_logprobs_equal_rescoring_the_responses(model_and_tokenizer, temperature, top_p):
    """Prompts of different lengths (left padding), groups sharing one pre-fill, rows leaving the batch at different
    steps: each recorded log-prob is what a full-sequence forward of the finished response gives."""
    model, tok = model_and_tokenizer
    prompts = prompts_of(tok, *CONTENTS) * 4
    torch.manual_seed(0)
    # 16 tokens: a build of the tiny MoE with AVX-512 kernels ended every row at step 10 of a 10-token budget
    responses = generate(model, tok, prompts, 16, temperature, top_p, return_logprobs=True)
    assert len({len(r.token_ids) for r in responses}) > 1 or temperature == 0  # rows ended at different steps
    groups = [Group(i, {}, p, [r]) for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]
    rescored, _ = batch_logprobs(model, collate(groups, tok.pad_token_id), temperature)
    for i, r in enumerate(responses):
        torch.testing.assert_close(rescored[i, : len(r.token_ids)], torch.tensor(r.logprobs), atol=1e-5, rtol=1e-5)


def test_greedy_equals_transformers_generate(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = prompts_of(tok, *CONTENTS)
    own = generate(model, tok, prompts, 12, 0.0, 1.0, sampler="mmrl")
    hf = generate(model, tok, prompts, 12, 0.0, 1.0, sampler="hf")
    assert [r.token_ids for r in own] == [r.token_ids for r in hf]
    assert [r.truncated for r in own] == [r.truncated for r in hf]


def test_stop_token_ends_a_row_and_the_budget_truncates(model_and_tokenizer):
    model, tok = model_and_tokenizer
    stop = eos_ids(tok, model)
    prompts = prompts_of(tok, *CONTENTS) * 8
    torch.manual_seed(1)
    long_budget = sample_texts(model, prompts, 24, 1.0, 1.0, stop, tok.pad_token_id)
    for s in long_budget:
        ended = [i for i, t in enumerate(s.token_ids) if t in stop]
        assert ended == ([] if s.truncated else [len(s.token_ids) - 1])  # nothing after the stop token
        assert len(s.token_ids) == len(s.logprobs) and (not s.truncated or len(s.token_ids) == 24)
    assert any(not s.truncated for s in long_budget)
    short_budget = sample_texts(model, prompts, 2, 1.0, 1.0, stop, tok.pad_token_id)
    assert all(len(s.token_ids) <= 2 for s in short_budget)
    assert all(s.truncated == (s.token_ids[-1] not in stop) for s in short_budget)


def test_a_shared_prefill_gives_each_row_its_own_prompts_distribution(model_and_tokenizer):
    """Rows of interleaved prompts, pre-filled once per distinct prompt, get the first-token distribution of their own
    prompt: greedy first tokens equal those of each prompt sampled alone."""
    model, tok = model_and_tokenizer
    a, b = prompts_of(tok, CONTENTS[0], CONTENTS[2])
    stop = eos_ids(tok, model)
    mixed = sample_texts(model, [a, b, a, b, b], 1, 0.0, 1.0, stop, tok.pad_token_id)
    alone_a = sample_texts(model, [a], 1, 0.0, 1.0, stop, tok.pad_token_id)[0]
    alone_b = sample_texts(model, [b], 1, 0.0, 1.0, stop, tok.pad_token_id)[0]
    for s, alone in zip(mixed, [alone_a, alone_b, alone_a, alone_b, alone_b], strict=True):
        assert s.token_ids == alone.token_ids
        assert s.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_draw_tokens_nucleus_keeps_the_smallest_top_set():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    torch.manual_seed(0)
    drawn = {int(draw_tokens(logits, 1.0, 0.75)[0]) for _ in range(200)}
    assert drawn == {0, 1}  # 0.5 + 0.3 reaches 0.75; the others are never drawn
    token, logprob = draw_tokens(logits, 1.0, 0.75)
    assert float(logprob) == pytest.approx(torch.log(torch.tensor([0.5, 0.3]) / 0.8)[int(token)].item(), abs=1e-6)


def test_unknown_sampler_is_refused(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="rollout.sampler: must be one of mmrl, hf"):
        generate(model, tok, prompts_of(tok, CONTENTS[0]), 4, 1.0, 1.0, sampler="vllm")


@pytest.mark.parametrize("sampler", ["mmrl", "hf"])
def test_two_token_responses_follow_the_models_probabilities(sampler):
    """Goodness of fit: 12,000 two-token responses against p(t1) · p(t2 | t1) computed by plain forwards (chi-square
    over the cells expected >= 5 times, the rest pooled); a sampler that drew from any other distribution fails."""
    model, tok = load_model("embedded:tiny-qwen2"), load_tokenizer("embedded:tiny-qwen2")
    prompt = prompts_of(tok, CONTENTS[1])[0]
    stop = set(eos_ids(tok, model))
    n = 12_000
    torch.manual_seed(0)
    counts: dict[tuple[int, ...], int] = {}
    for r in generate(model, tok, [prompt] * n, 2, 1.0, 1.0, batch_size=2000, sampler=sampler):
        key = tuple(r.token_ids)
        counts[key] = counts.get(key, 0) + 1
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        going_on = [t for t in range(len(first)) if t not in stop]
        nxt = torch.softmax(model(torch.tensor([prompt + [t] for t in going_on])).logits[:, -1].double(), -1)
    expected: dict[tuple[int, ...], float] = {(t,): n * float(first[t]) for t in stop if t < len(first)}
    for row, t in enumerate(going_on):
        for u in range(nxt.shape[1]):
            expected[(t, u)] = n * float(first[t] * nxt[row, u])
    assert set(counts) <= set(expected)  # every response is a stop token, or two tokens
    big = [k for k, e in expected.items() if e >= 5]
    observed = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    wanted = [expected[k] for k in big] + [n - sum(expected[k] for k in big)]
    assert len(big) > 20
    statistic = sum((o - w) ** 2 / w for o, w in zip(observed, wanted, strict=True))
    assert chi_square_p_value(statistic, len(observed) - 1) > 1e-3, statistic


def chi_square_p_value(statistic: float, df: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty cube-root normal approximation; good for df > 20)."""
    z = ((statistic / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("top_k", [1, 3, 40])
def test_draw_tokens_top_k_is_transformers_top_k(top_k):
    """The distribution a token is drawn from under ``top_k`` (with temperature and top_p, in transformers' order) is
    the one transformers' own warpers give, ties at the k-th score kept; a token outside it is never drawn."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(64, 50)
    logits[:, 7] = logits[:, 8]  # a tie, to be kept together
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(top_k), TopPLogitsWarper(0.9)])
    expected = torch.log_softmax(warpers(None, logits.clone()), -1)
    tokens, logprobs = draw_tokens(logits, 0.7, 0.9, top_k)
    assert torch.isfinite(expected.gather(-1, tokens[:, None])).all()
    assert torch.allclose(logprobs, expected.gather(-1, tokens[:, None]).squeeze(-1), atol=1e-5)


def test_top_k_one_is_greedy_on_both_samplers(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = prompts_of(tok, *CONTENTS)
    greedy = [r.token_ids for r in generate(model, tok, prompts, 8, 0.0, 1.0)]
    for sampler in ("mmrl", "hf"):
        torch.manual_seed(1)
        assert [r.token_ids for r in generate(model, tok, prompts, 8, 1.0, 1.0, sampler=sampler, top_k=1)] == greedy


def test_sampling_passes_the_cache_under_the_models_own_argument_name(model_and_tokenizer):
    """transformers warns (FutureWarning) on every run that passes a KV cache under a deprecated name."""
    import warnings

    model, tok = model_and_tokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = sample_texts(model, prompts_of(tok, *CONTENTS), 4, 1.0, 1.0, eos_ids(tok, model), tok.pad_token_id)
    assert len(out) == len(CONTENTS)


def repeated_ids(rows: int, vocab: int, length: int) -> torch.Tensor:
    """Each row's prompt and response so far: tokens drawn with repeats, so that some are counted more than once."""
    return torch.randint(0, vocab // 3, (rows, length))


@pytest.mark.parametrize(("temperature", "top_k", "penalty"), [(0.7, 0, 1.3), (1.0, 5, 0.8), (0.0, 0, 1.05)])
def test_repetition_penalty_is_transformers_processor(temperature, top_k, penalty):
    """The distribution a token is drawn from with a repetition penalty is the one transformers' processors give: the
    penalty on the row's tokens (each once) first, then temperature, top-k and top-p; greedy takes its argmax."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3  # positive and negative logits, both penalised
    ids = repeated_ids(64, 50, 12)
    seen = torch.zeros(64, 50, dtype=torch.bool).scatter_(1, ids, True)
    steps = [RepetitionPenaltyLogitsProcessor(penalty)]
    if temperature > 0:
        steps += [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k) if top_k else None,
                  TopPLogitsWarper(0.9)]
    expected = torch.log_softmax(LogitsProcessorList([s for s in steps if s])(ids, logits.clone()), -1)
    tokens, logprobs = draw_tokens(logits, temperature, 0.9 if temperature > 0 else 1.0, top_k, seen, penalty)
    if temperature == 0:
        assert torch.equal(tokens, expected.argmax(-1))
        assert not torch.equal(tokens, logits.argmax(-1))  # the penalty changed some choices
    assert torch.allclose(logprobs, expected.gather(-1, tokens[:, None]).squeeze(-1), atol=1e-5)


def test_repetition_penalty_decodes_as_transformers_generate(model_and_tokenizer):
    """Greedy decoding with a penalty gives transformers' tokens on mmrl's sampler (prompts of different lengths: the
    left padding is never penalised), and the penalty changes what is decoded."""
    model, tok = model_and_tokenizer
    prompts = prompts_of(tok, *CONTENTS)
    plain = [r.token_ids for r in generate(model, tok, prompts, 16, 0.0, 1.0)]
    own = [r.token_ids for r in generate(model, tok, prompts, 16, 0.0, 1.0, sampler="mmrl", repetition_penalty=2.0)]
    hf = [r.token_ids for r in generate(model, tok, prompts, 16, 0.0, 1.0, sampler="hf", repetition_penalty=2.0)]
    assert own == hf and own != plain
