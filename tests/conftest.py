"""Shared test set-up: the embedded model is built once into the repo's .cache (git-ignored) and reused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MMRL_CACHE", str(REPO / ".cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded in tests
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    from mmrl.models import build_embedded

    return build_embedded()
