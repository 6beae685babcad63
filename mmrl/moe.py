"""Mixture-of-Experts support for any Hugging Face MoE whose router is a ``*TopKRouter`` module (transformers 5:
Qwen3-MoE, Qwen2-MoE, Mixtral, ...): routing capture and replay, expert-load metrics, router losses and freezing.

A router's forward returns ``(router_logits [tokens, E], top_k_weights [tokens, k], top_k_index [tokens, k])`` for
the flattened batch. :class:`RouterHooks` wraps every router of a model for one forward pass and can

* **record** the experts each token was sent to (``routing[layer] -> [B, L, k]``);
* **replay** recorded experts (the R3 idea: routing chosen at rollout is reused in the training forward, so the
  training forward runs the same experts as the rollout). The mixing weights are re-computed from the *current*
  router probabilities of the replayed experts, so the router still receives gradient;
* **capture** router logits for the load-balancing (Switch Transformer) and z (ST-MoE) losses and for metrics.

Nothing here imports a trainer.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from mmrl.errors import UserError

Tensor = torch.Tensor


def find_routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's MoE routers in forward order (module names)."""
    return [(name, m) for name, m in model.named_modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def is_moe(model: torch.nn.Module) -> bool:
    return bool(find_routers(model))


def freeze_routers(model: torch.nn.Module) -> int:
    """Stop gradient to every router weight; returns how many parameters were frozen."""
    frozen = 0
    for _, router in find_routers(model):
        for p in router.parameters():
            p.requires_grad_(False)
            frozen += 1
    return frozen


# Routers whose mixing weights are "softmax over all experts, gathered at the top-k, optionally renormalised": for
# these replay can recompute the weights of forced experts exactly. Other routers (sigmoid scores, softmax over the
# top-k logits only, sparsemixer, ...) can be recorded and measured but not replayed.
REPLAYABLE = {"Qwen3MoeTopKRouter": "norm_topk_prob", "Qwen2MoeTopKRouter": "norm_topk_prob",
              "MixtralTopKRouter": True}


def check_replayable(model: torch.nn.Module) -> None:
    for name, router in find_routers(model):
        if type(router).__name__ not in REPLAYABLE:
            raise UserError(f"moe.routing_replay: router {name} ({type(router).__name__}) computes its mixing "
                             f"weights in a way replay does not reproduce; replay supports {sorted(REPLAYABLE)}")


def _normalises(router: torch.nn.Module) -> bool:
    rule = REPLAYABLE[type(router).__name__]
    return rule is True or bool(getattr(router, rule))


@dataclasses.dataclass
class RouterHooks:
    """Forward hooks on every router for the duration of a ``with`` block.

    ``batch_shape`` is the (B, L) of the forward, needed to give recorded routing its batch layout.
    ``replay`` maps router index -> ``[B, L, k]`` experts to force. Routing is kept as int16 on the model's device
    (one copy to the CPU per forward is the caller's, via :meth:`routing_cpu`).

    Replay must not be combined with activation checkpointing: the backward pass re-runs the layers after the hooks
    are gone, which would recompute with the router's own choices.
    """

    model: torch.nn.Module
    batch_shape: tuple[int, int]
    replay: list[Tensor] | None = None
    capture_logits: bool = False
    routing: list[Tensor] = dataclasses.field(default_factory=list)  # chosen experts, [B, L, k] per router
    natural: list[Tensor] = dataclasses.field(default_factory=list)  # what routers would have chosen (replay on)
    logits: list[Tensor] = dataclasses.field(default_factory=list)  # router logits [B*L, E] per router

    def routing_cpu(self) -> list[Tensor]:
        return [r.cpu() for r in self.routing]

    @contextlib.contextmanager
    def active(self):
        routers = [m for _, m in find_routers(self.model)]
        if self.replay is not None:
            check_replayable(self.model)
        if self.replay is not None and len(self.replay) != len(routers):
            raise ValueError(f"routing replay has {len(self.replay)} layers, the model has {len(routers)} routers")
        handles = [router.register_forward_hook(self._hook(i)) for i, router in enumerate(routers)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _hook(self, layer: int):
        b, length = self.batch_shape

        def hook(module, args, output):
            logits, weights, index = output
            if self.capture_logits:
                self.logits.append(logits)
            if self.replay is None:
                self.routing.append(index.detach().reshape(b, length, -1).to(torch.int16))
                return output
            forced = self.replay[layer].reshape(b * length, -1).to(index.device, torch.long)
            self.natural.append(index.detach().reshape(b, length, -1).to(torch.int16))
            self.routing.append(forced.reshape(b, length, -1).to(torch.int16))
            probs = torch.softmax(logits.float(), dim=-1).gather(-1, forced)
            if _normalises(module):
                probs = probs / probs.sum(-1, keepdim=True)
            return logits, probs.to(weights.dtype), forced

        return hook


def expert_load(routing: list[Tensor], num_experts: int, mask: Tensor) -> Tensor:
    """``[layers, E]`` fraction of the (token, slot) assignments each expert received; ``mask [B, L]`` drops padding."""
    keep = mask.bool().to(routing[0].device)
    loads = []
    for layer in routing:
        chosen = layer[keep].long()  # [tokens, k]
        counts = torch.bincount(chosen.reshape(-1), minlength=num_experts).float()[:num_experts]
        loads.append(counts / counts.sum().clamp(min=1))
    return torch.stack(loads)


def load_metrics(load: Tensor) -> dict[str, float]:
    """Imbalance (max/mean load, 1 = perfectly balanced) and normalised entropy (1 = uniform), mean over layers."""
    num_experts = load.shape[1]
    imbalance = load.max(1).values / load.mean(1).clamp(min=1e-12)
    p = load.clamp(min=1e-12)
    entropy = -(load * p.log()).sum(1) / torch.log(torch.tensor(float(num_experts)))
    return {"moe/load_imbalance": float(imbalance.mean()), "moe/load_entropy": float(entropy.mean()),
            "moe/load_imbalance_max_layer": float(imbalance.max())}


def routing_mismatch(a: list[Tensor], b: list[Tensor], mask: Tensor) -> float:
    """Fraction of (layer, token) pairs whose *set* of top-k experts differs between two routings."""
    keep = mask.bool().to(a[0].device) if a else mask.bool()
    differ = total = 0
    for x, y in zip(a, b, strict=True):
        xs, _ = x[keep].long().sort(-1)
        ys, _ = y.to(x.device)[keep].long().sort(-1)
        differ += int((xs != ys).any(-1).sum())
        total += int(keep.sum())
    return differ / max(total, 1)


def load_balancing_loss(logits: list[Tensor], top_k: int, mask: Tensor) -> Tensor:
    """Switch Transformer auxiliary loss (Fedus et al. 2021, Eq. 4-6), padding masked, averaged like transformers':
    ``E · Σ_e f_e · P_e`` with f the fraction of assignments and P the mean router probability, over all layers."""
    flat = mask.reshape(-1).to(logits[0].device).float()
    num_experts = logits[0].shape[-1]
    tokens = torch.zeros(num_experts, device=flat.device)
    probs_sum = torch.zeros(num_experts, device=flat.device)
    rows = flat.sum() * len(logits)
    for layer in logits:
        probs = torch.softmax(layer.float(), dim=-1)
        chosen = probs.topk(top_k, dim=-1).indices
        tokens = tokens.scatter_add(0, chosen.reshape(-1), flat.repeat_interleave(top_k))
        probs_sum = probs_sum + (probs * flat[:, None]).sum(0)
    return num_experts * ((tokens / rows.clamp(min=1)) * (probs_sum / rows.clamp(min=1))).sum()


def z_loss(logits: list[Tensor], mask: Tensor) -> Tensor:
    """ST-MoE router z-loss (Zoph et al. 2022, Eq. 5): mean over tokens of logsumexp(router logits)², padding masked."""
    flat = mask.reshape(-1).to(logits[0].device).float()
    total = sum((torch.logsumexp(layer.float(), dim=-1) ** 2 * flat).sum() for layer in logits)
    return total / (flat.sum() * len(logits)).clamp(min=1)
