"""The recipes of the embedded models: tiny Qwen2 / Qwen3-MoE with a byte-level BPE tokenizer, pre-trained here.

The models ship with the package as files (`mmrl.models.shipped`: ``mmrl/models/weights/``, each checked against the
sha256 in its manifest) and are never built at run time. The recipes below are how they were built, and
``python -m mmrl.models.recipes.build NAME --out DIR`` (`mmrl.models.recipes.build`) runs one again.

A rebuild is a new model, not a copy of the shipped one. Pre-training a tiny model from scratch is chaotic: a matmul
that rounds one last bit differently grows, over hundreds of steps, into a different model, and PyTorch and MKL pick
their kernels by the CPU's instruction set and their own version. The build therefore runs in a child process whose
x86-64 kernels are capped at AVX2 (`mmrl.models.recipes.registry`), with one thread and fixed seeds, which makes it
repeatable on one machine; other machines and library versions built other weights from the same recipe (with another
skill), so the shipped files and their measured skill (in the manifest) are the reference, and `benchmarks/rebuild.py`
compares a rebuild's skill with theirs.

``embedded:tiny-qwen2`` (the default):

1. A byte-level BPE tokenizer (Qwen-style: digits split one per token, ChatML special tokens) is trained by
   ``tokenizers`` on text generated from the bundled task templates (~0.5 s).
2. A Qwen2ForCausalLM (hidden 64, 2 layers, ~0.15 M parameters) is initialised with a fixed seed.
3. It is pre-trained for ~10 s (200 steps) on the bundled arithmetic task, answers in ``<answer>N</answer>``
   format. That is deliberately too short: the result is a weak base model that answers in the right format most of
   the time and is right a bit under half of the time (the manifest records its held-out pass@1). That is the regime
   RL with verifiable rewards works in on real LLMs (it sharpens what the base model can sometimes do), so a few CPU
   minutes of RL show the objectives doing their job rather than a blind search from chance.

``embedded:tiny-qwen3-moe``: the same recipe with a Qwen3-MoE (8 experts, 2 active per token, ~0.25 M parameters)
pre-trained on the bundled CountDown task (two numbers, + - *) with the load-balancing loss on, as MoE pre-training
does (training split only); its tokenizer also sees CountDown prompts.

``embedded:tiny-qwen2-agent`` (the default of ``--task alfworld``): a Qwen2 (hidden 128, 4 layers, ~1.1 M parameters)
with a long context (4096 positions) and a 1024-token BPE trained on ALFWorld's vocabulary (the engine's object and
receptacle names, its observation and action phrasing, the agent prompt), so that an observation costs about one
token per word rather than one per byte. It is not pre-trained: the ``--sft-warmup`` on the explorer's demonstrations
(mmrl/envs/alfworld/explorer.py) is its pre-training. ``embedded:tiny-qwen2-agent-sft`` is that model after such a
warm start (benchmarks/alfworld.py; the manifest holds its command), and ``embedded:tiny-qwen2-agent-sft-turn`` is
it warm-started again on the same demonstrations in the turn layout (``rollout.agent_layout turn``), whose prompts
differ from the episode layout's.

``embedded:tiny-qwen2.5-vl`` (the default of tasks with images) and ``embedded:tiny-qwen3-vl`` (the default of
``--task grounding``, whose ViT knows absolute positions) are built by `mmrl.models.recipes.embedded_vl`.

Names and recipe versions live in the leaf module `mmrl.cache`.
"""

from __future__ import annotations

import random

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# The agent model's template: ``CHAT_TEMPLATE`` for plain messages (byte-identical: mmrl's own multi-turn rendering is
# unchanged), plus tool calling in the ChatML/Hermes layout, so that TRL's ``GRPOTrainer(environment_factory=...)``
# accepts the model: the tools' JSON schemas in a system turn, an assistant's calls as
# ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``, tool results as ``tool`` turns. Every message
# renders the same whatever follows it (TRL requires a prefix-preserving template for multi-turn training).
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "You can call these tools, one call per <tool_call></tool_call> block, as "
    "<tool_call>\n{\"name\": <tool name>, \"arguments\": <arguments object>}\n</tool_call>:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{% if loop.first and message['content'] %}\n{% endif %}"
    "<tool_call>\n{\"name\": {{ function['name'] | tojson }}, \"arguments\": "
    "{% if function['arguments'] is string %}{{ function['arguments'] }}{% else %}{{ function['arguments'] | tojson }}"
    "{% endif %}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# How transformers' ``tokenizer.parse_response`` (and so TRL) reads a generated assistant turn of that template back
# into ``{"role": "assistant", "content": ..., "tool_calls": [...]}``.
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def _corpus(rng: random.Random, countdown: bool = False, extra: list[str] | None = None) -> list[str]:
    from mmrl.tasks.arithmetic import arithmetic_prompt
    from mmrl.tasks.countdown import countdown_prompt
    from mmrl.tasks.math import R1_SYSTEM_PROMPT

    lines = [R1_SYSTEM_PROMPT, "<think> </think> <answer> </answer>"] + ["user", "assistant", "system"] * 50
    for _ in range(4000):
        a, b = rng.randrange(100), rng.randrange(100)
        op = rng.choice("+-*")
        lines.append(arithmetic_prompt(a, op, b))
        lines.append(f"<answer>{rng.randrange(200)}</answer>")
        lines.append(f"<think>{a}{op}{b}</think><answer>{rng.randrange(200)}</answer>")
    if countdown:
        for _ in range(4000):
            a, b = rng.randrange(1, 10), rng.randrange(1, 10)
            lines.append(countdown_prompt([a, b], rng.randrange(100)))
            lines.append(f"<answer>{a}{rng.choice('+-*')}{b}</answer>")
    return lines + list(extra or [])


def train_tokenizer(vocab_size: int = 384, seed: int = 0, countdown: bool = False, extra: list[str] | None = None,
                    corpus=None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # As Qwen2: every digit is its own token, then GPT-2 byte-level pre-tokenisation.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = corpus(random.Random(seed)) if corpus else _corpus(random.Random(seed), countdown, extra)
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def tiny_qwen2(tokenizer, hidden: int = 64, layers: int = 2, seed: int = 0, max_positions: int = 512):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def tiny_qwen3_moe(tokenizer, hidden: int = 64, layers: int = 2, experts: int = 8, active: int = 2, seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                            moe_intermediate_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=hidden // 4, num_experts=experts,
                            num_experts_per_tok=active, decoder_sparse_step=1, norm_topk_prob=True,
                            router_aux_loss_coef=0.01, output_router_logits=False, max_position_embeddings=512,
                            tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config)


def arithmetic_example(rng: random.Random) -> tuple[str, str]:
    from mmrl.tasks.arithmetic import arithmetic_prompt

    a, b = rng.randrange(10), rng.randrange(10)
    return arithmetic_prompt(a, "+", b), f"{a + b}"


def countdown_example(rng: random.Random, _rows: list = []) -> tuple[str, str]:  # noqa: B006 -- memo
    """A problem of the countdown task's *training* split (its held-out problems are never pre-trained on)."""
    from mmrl.tasks.countdown import countdown_task

    if not _rows:
        _rows.extend(countdown_task().train)
    row = rng.choice(_rows)
    return row["messages"][0]["content"], row["answer"]


def text_examples(tokenizer, example=arithmetic_example):
    """``draw(rng)`` for `mmrl.models.recipes.pretrain.pretrain`: a chat prompt of
    ``example(rng) -> (question, answer)`` and its target ``<answer>answer</answer>`` (end of turn included)."""
    from mmrl.models.recipes.pretrain import Example

    def draw(rng: random.Random) -> Example:
        question, solution = example(rng)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        return Example(tokenizer(prompt, add_special_tokens=False)["input_ids"],
                       tokenizer(f"<answer>{solution}</answer><|im_end|>", add_special_tokens=False)["input_ids"])

    return draw


def build_dense(steps: int | None = None):
    from mmrl.models.recipes.pretrain import pretrain

    tokenizer = train_tokenizer()
    model = tiny_qwen2(tokenizer)
    pretrain(model, text_examples(tokenizer), tokenizer.pad_token_id, steps=DENSE_PRETRAIN_STEPS if steps is None
             else steps, batch_size=64)
    return model, tokenizer


def build_moe(steps: int | None = None):
    from mmrl.models.recipes.pretrain import pretrain

    tokenizer = train_tokenizer(countdown=True)
    model = tiny_qwen3_moe(tokenizer)
    pretrain(model, text_examples(tokenizer, countdown_example), tokenizer.pad_token_id,
             steps=MOE_PRETRAIN_STEPS if steps is None else steps, batch_size=64)
    return model, tokenizer


def build_agent(steps: int | None = None):
    """The agent's recipe has no pre-training (see the module docstring): ``steps`` changes nothing."""
    from mmrl.models.recipes.agent_corpus import alfworld_corpus

    tokenizer = train_tokenizer(vocab_size=1024, corpus=alfworld_corpus)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE  # v3: tool calling (TRL); plain chats render as before
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    # hidden 128: v1 (hidden 64, 0.3 M) never learnt to copy admissible commands (docs/alfworld.md)
    return tiny_qwen2(tokenizer, hidden=128, layers=4, max_positions=4096), tokenizer


DENSE_PRETRAIN_STEPS = 200
MOE_PRETRAIN_STEPS = 150
