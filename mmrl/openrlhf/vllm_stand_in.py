"""The names OpenRLHF 0.11.2 imports from ``vllm`` and ``flash_attn``, for the CPU rehearsal only.

vLLM and flash-attn are CUDA builds; they cannot be installed on a CPU machine, yet OpenRLHF imports them at module
level (``trainer/ray/vllm_engine.py``, ``trainer/ppo_utils/samples_generator.py``, ``models/ring_attn_utils.py``)
and, for weight sync, calls vLLM's ``StatelessProcessGroup`` and ``PyNcclCommunicator`` by name
(``utils/distributed_util.py``). :func:`modules` builds real module objects holding only what those call sites use:

* ``SamplingParams``, ``TokensPrompt``, ``random_uuid``, and the request output types that
  :class:`mmrl.openrlhf.rollout.HFRolloutActor` returns (the shapes OpenRLHF's agent executors read);
* ``StatelessProcessGroup`` / ``PyNcclCommunicator``: a gloo group on its own ``TCPStore`` between policy rank 0 and
  the rollout actors, so that it is independent of the default process group DeepSpeed owns (Ray's collective gloo
  group reuses that default world and fails; see docs/cluster.md);
* ``flash_attn``: empty modules (only packing and ring attention call into them; the rehearsal turns both off).

:func:`mmrl.openrlhf.rehearsal.install_worker_shims` puts them into ``sys.modules`` in the rehearsal's driver and
Ray workers; nothing installs them on a GPU run.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.machinery
import socket
import types
import uuid
from typing import Any

import torch
import torch.distributed as dist

from mmrl.openrlhf.network import bound_listener

VERSION = "0+mmrl.rehearsal"  # not a vLLM release: OpenRLHF only compares versions on its nccl path, unused here
SYNC_TIMEOUT = datetime.timedelta(minutes=10)


@dataclasses.dataclass
class SamplingParams:
    """The fields OpenRLHF's samples generator sets and its executors read (vLLM's own class has many more)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0  # vLLM's rule: over the prompt's and the output's tokens, greedy included
    max_tokens: int | None = 16
    min_tokens: int = 0
    skip_special_tokens: bool = True
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    stop: list[str] | None = None
    n: int = 1
    seed: int | None = None


def TokensPrompt(prompt_token_ids: list[int]) -> dict[str, Any]:  # noqa: N802 -- vLLM's name (a TypedDict there)
    return {"prompt_token_ids": list(prompt_token_ids)}


def random_uuid() -> str:
    return uuid.uuid4().hex


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (end-of-sequence token) or "length", as vLLM reports them
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclasses.dataclass
class StatelessProcessGroup:
    """A rendezvous of its own: a ``TCPStore`` that rank 0 (the policy) hosts, outside DeepSpeed's default group.
    As vLLM's own class, rank 0 listens on ``host`` only (the node address Ray gave it), not on every interface."""

    store: Any
    rank: int
    world_size: int
    host: str = ""  # the address rank 0 is reached at; the gloo group's own sockets listen there too
    listener: socket.socket | None = None  # rank 0's listening socket, owned here for the store's lifetime

    @staticmethod
    def create(host: str, port: int, rank: int, world_size: int) -> StatelessProcessGroup:
        listener = bound_listener(host, port) if rank == 0 else None
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=SYNC_TIMEOUT,
                              wait_for_workers=False, master_listen_fd=listener.fileno() if listener else None)
        return StatelessProcessGroup(store, rank, world_size, host, listener)


class PyNcclCommunicator:
    """vLLM's name for the weight-sync communicator; here a gloo process group over the stateless group's store."""

    def __init__(self, group: StatelessProcessGroup, device: Any = None) -> None:
        self.rank, self.world_size = group.rank, group.world_size
        self.stateless_group = group  # holds rank 0's listening socket: the store serves as long as the group lives
        options = dist.ProcessGroupGloo._Options()
        options._timeout = SYNC_TIMEOUT
        # gloo's sockets on the group's own address, not on whatever the machine's host name resolves to
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=group.host)]
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("mmrl-weight-sync", group.store), group.rank,
                                           group.world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.broadcast([tensor], options).wait()


def _gpu_only(name: str):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{name} is flash-attn (CUDA only): the rehearsal runs without packing and ring attention")

    return refuse


def modules() -> dict[str, types.ModuleType]:
    """``{module name: module}`` for ``sys.modules``: the vLLM and flash-attn names OpenRLHF imports."""

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name, f"rehearsal stand-in for {name} (mmrl.openrlhf.vllm_stand_in)")
        m.__dict__.update(attrs)
        m.__path__ = []  # a package, so that its submodules import
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)  # find_spec() reads it
        return m

    return {
        "vllm": module("vllm", __version__=VERSION, SamplingParams=SamplingParams, RequestOutput=RequestOutput,
                       CompletionOutput=CompletionOutput),
        "vllm.inputs": module("vllm.inputs", TokensPrompt=TokensPrompt),
        "vllm.utils": module("vllm.utils", random_uuid=random_uuid),
        "vllm.distributed": module("vllm.distributed"),
        "vllm.distributed.utils": module("vllm.distributed.utils", StatelessProcessGroup=StatelessProcessGroup),
        "vllm.distributed.device_communicators": module("vllm.distributed.device_communicators"),
        "vllm.distributed.device_communicators.pynccl": module("vllm.distributed.device_communicators.pynccl",
                                                               PyNcclCommunicator=PyNcclCommunicator),
        "flash_attn": module("flash_attn"),
        "flash_attn.bert_padding": module("flash_attn.bert_padding", **{
            f: _gpu_only(f"flash_attn.bert_padding.{f}") for f in ("index_first_axis", "pad_input", "rearrange",
                                                                   "unpad_input")}),
        "flash_attn.utils": module("flash_attn.utils"),
        "flash_attn.utils.distributed": module("flash_attn.utils.distributed",
                                                 all_gather=_gpu_only("flash_attn.utils.distributed.all_gather")),
    }
