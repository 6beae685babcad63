"""Shared pieces of the benchmark scripts: run one configuration in-process, summarise and plot curves."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from mmrl.run.config import resolve_config
from mmrl.run.metrics import read_metrics
from mmrl.trainer.local import build_trainer

QUIET = {"run.progress": False, "run.plot": False, "run.checkpoint_every": 0, "run.overwrite": True}


def run_config(overrides: dict[str, Any], out_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """(per-step records, last record, wall seconds) of one run; SIGINT/SIGTERM stop the whole benchmark."""
    cfg = resolve_config([({**QUIET, **overrides, "run.out_dir": str(out_dir)}, "benchmark")])
    start = time.perf_counter()
    trainer = build_trainer(cfg)
    last = trainer.run()
    if trainer.stop_signal is not None:  # the trainer finished its step on the signal; stop the sweep too
        raise SystemExit(128 + trainer.stop_signal)
    return read_metrics(trainer.run_dir / "metrics.jsonl"), last, time.perf_counter() - start


def head_tail(values: list[float], head: int = 5, tail: int = 20) -> tuple[float, float]:
    return statistics.mean(values[:head]), statistics.mean(values[-tail:])


def smooth(values: list[float], window: int = 20) -> list[float]:
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
