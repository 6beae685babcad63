"""LoRA adapters through peft: wrapping a policy, its frozen base as the reference, and adapter-only checkpoints.

* :func:`add_lora` wraps a loaded model in peft LoRA adapters (rank, alpha, target module names); only the adapters
  train. Targets are checked first: a name that matches no module fails with one line naming what was looked for and
  the module names the model has (peft alone would ignore a partly wrong list).
* :class:`FrozenBase` is the reference model of a LoRA run: the *same* model with its adapters disabled, so a run
  holds one copy of the base weights, not two (the base never trains, so it is exactly the initial policy).
* :func:`adapter_state` / :func:`load_adapter_state`: the trainable (adapter) weights by their parameter names, which
  is all a checkpoint needs besides the LoRA settings; the base comes from the model spec again.

Dropout inside the adapters is 0: the training forward must be the function π_old was computed with.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import torch

from mmrl.errors import UserError

ALL_LINEAR = "all-linear"  # peft's keyword: every linear layer except the output head


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: int
    targets: tuple[str, ...]  # module names (suffixes), or (ALL_LINEAR,)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraSettings:
        return cls(int(data["rank"]), int(data["alpha"]), tuple(data["targets"]))


def parse_targets(text: str) -> tuple[str, ...]:
    """``"q_proj,v_proj"`` or ``"all-linear"`` as a tuple of names; fails on an empty list."""
    names = tuple(t.strip() for t in re.split(r"[,\s]+", text) if t.strip())
    if not names:
        raise UserError("config: model.lora_targets names no module (use all-linear or e.g. q_proj,v_proj)")
    if ALL_LINEAR in names and len(names) > 1:
        raise UserError(f"config: model.lora_targets: {ALL_LINEAR} cannot be combined with names, got {text!r}")
    return names


def _module_names(model: torch.nn.Module) -> list[str]:
    """Distinct last components of the names of the model's linear-like leaf modules (what LoRA can wrap)."""
    supported = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if name and isinstance(module, supported)})


def check_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> None:
    """Every target must match a module (by its full name or its last components, as peft matches them)."""
    if targets == (ALL_LINEAR,):
        if not any(isinstance(m, torch.nn.Linear) for m in model.modules()):
            raise UserError(f"config: model.lora_targets {ALL_LINEAR}: the model has no linear layer; its modules "
                             f"are named: {', '.join(_module_names(model)) or 'none'}")
        return
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise UserError(f"config: model.lora_targets: no module named {', '.join(missing)} (looked for "
                         f"{', '.join(targets)}); the model's linear-like modules are named: "
                         f"{', '.join(_module_names(model))}")


def add_lora(model: torch.nn.Module, settings: LoraSettings, gradient_checkpointing: bool = False) -> torch.nn.Module:
    """``model`` wrapped in LoRA adapters (a peft model); its base weights are frozen. ``gradient_checkpointing``:
    the model has it on (then the frozen embeddings' output is made to require grad, as checkpointing needs)."""
    from peft import LoraConfig, get_peft_model

    if settings.rank < 1:
        raise UserError(f"config: model.lora_rank must be >= 1 to add adapters, got {settings.rank}")
    if settings.alpha < 1:
        raise UserError(f"config: model.lora_alpha must be >= 1, got {settings.alpha}")
    check_targets(model, settings.targets)
    targets: str | list[str] = ALL_LINEAR if settings.targets == (ALL_LINEAR,) else list(settings.targets)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=targets, lora_dropout=0.0,
                        bias="none")
    with warnings.catch_warnings():
        # PEFT asks transformers by a name that transformers 5.24 deprecated: a warning no user can act on
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = get_peft_model(model, config)
    if gradient_checkpointing:  # checkpointed blocks whose inputs need no grad would pass no grad to the adapters
        wrapped.enable_input_require_grads()
    return wrapped


def is_lora(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


class FrozenBase(torch.nn.Module):
    """The reference policy of a LoRA run: ``policy`` called with its adapters disabled (no second copy)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy
        self.training = policy.training

    def forward(self, *args: Any, **kwargs: Any):
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable weights (the adapters) by parameter name."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put :func:`adapter_state` back; the names must be exactly the model's adapter parameters."""
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != expected:
        extra, missing = sorted(set(state) - expected), sorted(expected - set(state))
        raise UserError(f"checkpoint: its adapters do not fit this model (unexpected {extra[:3]}, missing "
                         f"{missing[:3]}); was it written with other model.lora_* settings?")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in state.items():
            params[name].copy_(value)


def policy_weights(model: torch.nn.Module, settings: LoraSettings | None) -> dict[str, Any]:
    """What a checkpoint keeps of the policy: every weight, or with LoRA only the adapters and their settings."""
    if settings is None:
        return {"model": model.state_dict()}
    return {"model": adapter_state(model), "lora": settings.to_dict()}


def load_policy_weights(model: torch.nn.Module, state: dict[str, Any], where: Any = "") -> torch.nn.Module:
    """``model`` with the weights of :func:`policy_weights` (a checkpoint's state) put back. A LoRA checkpoint on a
    plain base model (``mmrl.eval`` of a LoRA run) first adds the adapters its settings describe. ``where``: the
    checkpoint's folder, for the errors to name."""
    if not state.get("lora"):
        # a weight of another shape or name is one line (torch's own error lists every mismatch over many lines)
        expected, given = model.state_dict(), state["model"]
        named = f"checkpoint {where}" if where else "checkpoint"
        for name, tensor in given.items():
            if name not in expected:
                raise UserError(f"{named}: its weight {name} is not a weight of this model; was it written for "
                                 "another model?")
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise UserError(f"{named}: its weight {name} has shape {list(tensor.shape)}, the model's "
                                 f"{list(expected[name].shape)}; was it written for another model?")
        missing = [name for name in expected if name not in given]
        if missing:
            raise UserError(f"{named}: it has no weight {missing[0]} of this model ({len(missing)} missing)")
        model.load_state_dict(given)
        return model
    if not is_lora(model):
        model = add_lora(model, LoraSettings.from_dict(state["lora"]))
    load_adapter_state(model, state["model"])
    return model
