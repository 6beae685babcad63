"""mmrl/openrlhf/compat.py: OpenRLHF's ZeRO-3 loading fix in the generator form newer transformers need."""

from __future__ import annotations

import inspect

import pytest
import torch


class TwoLayers(torch.nn.Module):
    base_model_prefix = "model"

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(2, 2, bias=False)
        self.b = torch.nn.Linear(2, 2, bias=False)


def test_keys_the_model_has_survive_a_renaming(monkeypatch):
    """A checkpoint key the model already has, which a renaming would move away
    (https://github.com/OpenRLHF/OpenRLHF/issues/1232): transformers' own conversion drops it; with the fix it is
    loaded with the first converted state dict."""
    hf = pytest.importorskip("transformers.integrations.deepspeed")
    core = pytest.importorskip("transformers.core_model_loading")
    from mmrl.openrlhf.compat import PATCHED_MARK, install_zero3_loading_fix

    original = hf._apply_weight_conversions_to_state_dict
    if not inspect.isgeneratorfunction(original):
        pytest.skip("this transformers returns a dict (<= 5.15): OpenRLHF's own fix applies")
    monkeypatch.setattr(hf, "_apply_weight_conversions_to_state_dict", original)  # restored after the test
    model = TwoLayers()
    state = {k: torch.full_like(v, 7.0) for k, v in model.state_dict().items()}
    mapping = [core.WeightRenaming("a.weight", "c.weight")]
    assert [sorted(d) for d in original(model, dict(state), mapping)] == [["b.weight"]]  # the loss the fix prevents

    assert install_zero3_loading_fix()
    fixed = hf._apply_weight_conversions_to_state_dict
    assert getattr(fixed, PATCHED_MARK)  # OpenRLHF then keeps it instead of installing its own
    loaded = list(fixed(model, dict(state), mapping))
    assert [sorted(d) for d in loaded] == [["a.weight", "b.weight"]]
    assert torch.equal(loaded[0]["a.weight"], state["a.weight"])
    assert not install_zero3_loading_fix()  # once per process
