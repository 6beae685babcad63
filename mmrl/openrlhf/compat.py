"""OpenRLHF 0.11.2 on a transformers newer than its pin (5.15.0): loading a model under DeepSpeed ZeRO-3.

OpenRLHF's ``models/actor.py`` replaces transformers' ``integrations.deepspeed._apply_weight_conversions_to_state_dict``
with a fix of its own (https://github.com/OpenRLHF/OpenRLHF/issues/1232: keys that already match the model are set aside
before the checkpoint's renamings and put back after), which calls ``.update`` on what the original returns. From
transformers 5.2x that function is a generator of state dicts (loaded one at a time), so every ZeRO-3 model load fails
with ``AttributeError: 'generator' object has no attribute 'update'`` -- the CPU rehearsal of the ZeRO-3 paper recipes
found it (tests/test_recipes.py). With such a transformers, :func:`install_zero3_loading_fix` installs the same fix
written for the generator, marked as OpenRLHF marks its own, so OpenRLHF keeps it instead of installing the broken
one. With the pinned transformers (a dict is returned) it changes nothing.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

SETUP_HOOK = "mmrl.openrlhf.compat.install_zero3_loading_fix"  # Ray's worker_process_setup_hook of a real run
PATCHED_MARK = "_openrlhf_patched"  # the attribute OpenRLHF checks before installing its own fix


def install_zero3_loading_fix() -> bool:
    """Install the generator form of OpenRLHF's ZeRO-3 loading fix when transformers needs it; True if installed."""
    try:
        import transformers.integrations.deepspeed as hf_deepspeed
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # a transformers without weight conversions: OpenRLHF's fix does not apply either
        return False
    original = getattr(hf_deepspeed, "_apply_weight_conversions_to_state_dict", None)
    if original is None or getattr(original, PATCHED_MARK, False) or not inspect.isgeneratorfunction(original):
        return False

    def converted_state_dicts(model, state_dict, weight_mapping) -> Iterator[Any]:
        model_state_dict = model.state_dict()
        renamings = [m for m in weight_mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in weight_mapping if isinstance(m, WeightConverter)]
        metadata = getattr(state_dict, "_metadata", None)
        mapped = state_dict.copy()
        if metadata is not None:
            mapped._metadata = metadata
        exact: OrderedDict = OrderedDict()  # keys the model already has that a renaming would move away (the fix)
        if metadata is not None:
            exact._metadata = metadata  # type: ignore[attr-defined]
        for key in list(state_dict.keys()):
            renamed, _ = rename_source_key(key, renamings, converters, model.base_model_prefix, model_state_dict)
            if renamed not in model_state_dict and key in model_state_dict:
                exact[key] = mapped.pop(key)
        merged = False
        for converted in original(model, mapped, weight_mapping):
            if not merged:
                converted.update(exact)
                merged = True
            yield converted
        if not merged and exact:  # the conversion yielded nothing: the set-aside keys still load
            yield exact

    setattr(converted_state_dicts, PATCHED_MARK, True)
    hf_deepspeed._apply_weight_conversions_to_state_dict = converted_state_dicts
    return True
