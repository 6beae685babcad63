"""The rehearsal's rollout engine: OpenRLHF's ``RolloutRayActor`` with Hugging Face ``generate`` in place of vLLM.

:class:`HFRolloutActor` subclasses the plain class behind OpenRLHF's rollout actor and keeps its executor plumbing
(``generate_responses`` runs OpenRLHF's ``SingleTurnAgentExecutor`` with mmrl's reward file, or the task's agent
executor) unchanged. It replaces what talks to vLLM, with the same signatures:

* ``generate(prompt_token_ids, sampling_params, multi_modal_data)``: one sampled completion from the fp32 HF model
  (temperature, top-p, top-k, repetition penalty, min/max tokens; images through the model's processor), returned as
  vLLM's ``RequestOutput`` shape. One unpadded prompt per call, so transformers' repetition penalty counts exactly
  the tokens vLLM's does: the prompt's and the output's, each once, greedy or sampled;
* ``init_process_group`` / ``update_weight``: the receiving end of the gloo weight sync; each received tensor is
  copied into the HF model's parameter of the same name, and after the last one of a sync the actor appends the
  weights' digest to ``<run>/rehearsal/rollout_weights.jsonl`` (the policy writes its own beside it);
* ``sleep`` / ``wake_up`` (generating while asleep is an error, as in vLLM), ``get_num_unfinished_requests``,
  ``reset_prefix_cache``, ``pause_generation`` / ``resume_generation``.

:func:`create_rollout_actors` places them as OpenRLHF's ``create_vllm_engines`` places vLLM engines (a bundle of the
shared placement group each when colocated, their own placement group otherwise).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
import torch
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor, _load_agent_executor
from openrlhf.utils.agent import SingleTurnAgentExecutor
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from mmrl.errors import UserError
from mmrl.openrlhf.rehearsal import append_record, weights_digest
from mmrl.openrlhf.vllm_stand_in import (
    CompletionOutput,
    Logprob,
    PyNcclCommunicator,
    RequestOutput,
    SamplingParams,
    StatelessProcessGroup,
    random_uuid,
)

log = logging.getLogger("mmrl.openrlhf")
SHARED_GPU_FRACTION = 0.2  # OpenRLHF's share of a colocated GPU bundle per engine


def load_generation_model(path: str, trust_remote_code: bool = False):
    """(model in fp32 eval mode, processor or None): a vision-language checkpoint gets its processor for images.
    ``trust_remote_code``: the run's ``model.trust_remote_code``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    trust = {"trust_remote_code": trust_remote_code}
    config = AutoConfig.from_pretrained(path, **trust)
    if getattr(config, "vision_config", None) is not None:
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa",
                                                            **trust)
        return model.eval(), AutoProcessor.from_pretrained(path, **trust)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa", **trust)
    return model.eval(), None


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


class HFRolloutActor(RolloutRayActor.__ray_actor_class__):
    def __init__(self, *args: Any, model: str, seed: int, run_dir: str, agent_func_path: str | None = None,
                 remote_rm_url: str | None = None, mm_pad_token_ids: set | None = None,
                 enable_sleep_mode: bool = False, trust_remote_code: bool = False, **ignored: Any) -> None:
        # OpenRLHF's __init__ starts a vLLM engine; everything else it sets up is repeated here
        self.executor = _load_agent_executor(agent_func_path) if agent_func_path else \
            SingleTurnAgentExecutor(remote_rm_url)
        self._mm_pad_token_ids = mm_pad_token_ids
        torch.manual_seed(seed)
        self.model, self.processor = load_generation_model(model, trust_remote_code)
        self.tokenizer = (self.processor.tokenizer if self.processor is not None else
                          load_tokenizer(model, trust_remote_code))
        self.run_dir = run_dir
        self.sleeping = False
        self.unfinished = 0
        self.syncs = 0
        self.sync_group: PyNcclCommunicator | None = None
        self.received: list[str] = []
        append_record(run_dir, "rollout_weights.jsonl", {"sync": 0, "digest": weights_digest(self.model)})

    # --- vLLM engine interface -----------------------------------------------------------------------------------
    async def init_process_group(self, master_address, master_port, rank_offset, world_size, group_name, backend,
                                 use_ray):
        if use_ray or backend != "gloo":
            raise ValueError(f"the rehearsal syncs weights over its own gloo group, not {backend} (use_ray={use_ray})")
        self.sync_group = PyNcclCommunicator(StatelessProcessGroup.create(master_address, master_port, rank_offset,
                                                                          world_size))

    async def update_weight(self, name, dtype, shape, empty_cache=False):
        if self.sync_group is None:
            raise RuntimeError("update_weight before init_process_group")
        received = torch.empty(shape, dtype=dtype)
        self.sync_group.broadcast(received, src=0)
        params = dict(self.model.named_parameters())
        if name not in params:
            raise KeyError(f"weight sync: the policy sent {name!r}, which the rollout model does not have")
        with torch.no_grad():
            params[name].copy_(received)
        self.received.append(name)
        if empty_cache:  # OpenRLHF marks the last parameter of a sync this way
            self.syncs += 1
            append_record(self.run_dir, "rollout_weights.jsonl",
                          {"sync": self.syncs, "digest": weights_digest(self.model, self.received)})
            self.received = []

    async def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles, empty_cache=False):
        raise RuntimeError("CUDA IPC weight sync needs GPUs; the rehearsal uses --vllm.sync_backend gloo")

    async def reset_prefix_cache(self):
        return None  # HF generate keeps no cache between requests

    async def pause_generation(self):
        return None

    async def resume_generation(self):
        return None

    async def sleep(self, level=1):
        self.sleeping = True

    async def wake_up(self, tags=None):
        self.sleeping = False

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished

    async def generate(self, prompt_token_ids, sampling_params: SamplingParams, multi_modal_data=None):
        if self.sleeping:
            raise RuntimeError("generate on a sleeping rollout engine (OpenRLHF wakes engines before generating)")
        self.unfinished += 1
        try:
            return self._generate(list(prompt_token_ids), sampling_params, multi_modal_data)
        finally:
            self.unfinished -= 1

    # --- HF generate ---------------------------------------------------------------------------------------------
    def _image_inputs(self, multi_modal_data) -> dict[str, torch.Tensor]:
        images = (multi_modal_data or {}).get("image")
        if not images:
            return {}
        if self.processor is None:
            raise ValueError("the prompt has images but the rollout model has no image processor")
        images = images if isinstance(images, list) else [images]
        return dict(self.processor.image_processor(images=images, return_tensors="pt"))

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], params: SamplingParams, multi_modal_data) -> RequestOutput:
        config = self.model.generation_config
        eos = config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        sample = params.temperature > 0
        kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": int(params.max_tokens or 16),
                                  "min_new_tokens": int(params.min_tokens or 0), "return_dict_in_generate": True,
                                  "repetition_penalty": float(params.repetition_penalty),
                                  "output_scores": params.logprobs is not None,
                                  "pad_token_id": config.pad_token_id if config.pad_token_id is not None
                                  else next(iter(eos_ids), 0)}
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k if params.top_k and params.top_k > 0 else 0)
        input_ids = torch.tensor([prompt_ids])
        out = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                  **self._image_inputs(multi_modal_data), **kwargs)
        tokens = out.sequences[0, len(prompt_ids):].tolist()
        if eos_ids and any(t in eos_ids for t in tokens):  # vLLM stops at the first end token and keeps it
            tokens = tokens[:next(i for i, t in enumerate(tokens) if t in eos_ids) + 1]
        finish = "stop" if tokens and tokens[-1] in eos_ids else "length"
        logprobs = None
        if params.logprobs is not None:
            logprobs = [{t: Logprob(float(torch.log_softmax(score[0].float(), -1)[t]))}
                        for t, score in zip(tokens, out.scores, strict=False)]
        text = self.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens)
        return RequestOutput(random_uuid(), prompt_ids, [CompletionOutput(0, text, tokens, finish, logprobs)])


HFRolloutRayActor = ray.remote(HFRolloutActor)


def create_rollout_actors(args, shared_pg, run_dir: str) -> list:
    """The rehearsal's engines, placed as ``create_vllm_engines`` places vLLM's (TP 1: one bundle per engine)."""
    if args.vllm.tensor_parallel_size != 1:
        raise UserError("config: the rehearsal runs each rollout engine in one process: "
                         "cluster.vllm_tensor_parallel_size must be 1")
    shared = shared_pg is not None
    if not shared:
        shared_pg = placement_group([{"GPU": 1, "CPU": 1} for _ in range(args.vllm.num_engines)], strategy="PACK")
    fraction = SHARED_GPU_FRACTION if shared else 1
    trust = args.mmrl.trust_remote_code  # the run's model.trust_remote_code
    mm_pad: set = set()
    if args.data.max_images_per_prompt > 0:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(args.actor.model_name_or_path, trust_remote_code=trust)
        mm_pad = {t for t in (getattr(processor, "image_token_id", None), getattr(processor, "video_token_id", None))
                  if t is not None}
    engines = [HFRolloutRayActor.options(
        num_cpus=fraction, num_gpus=fraction,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=shared_pg,
                                                             placement_group_capture_child_tasks=True,
                                                             placement_group_bundle_index=i),
    ).remote(model=args.actor.model_name_or_path, seed=args.train.seed + i, run_dir=run_dir,
             agent_func_path=args.train.agent_func_path, remote_rm_url=args.reward.remote_url,
             mm_pad_token_ids=mm_pad, enable_sleep_mode=args.vllm.enable_sleep, trust_remote_code=trust)
        for i in range(args.vllm.num_engines)]
    if args.vllm.enable_sleep:
        ray.get([e.sleep.remote() for e in engines])
    return engines
