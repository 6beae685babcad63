"""Cost of each objective alone: advantages + batch statistics + loss + backward on a 64 x 1024-token batch.

The log-probs are a leaf tensor, so this measures the objective's own arithmetic, not a model. Every objective is
timed in the same process, interleaved round by round (in a new order each round), and reported as a ratio to GRPO
measured in the same run. ``--runs`` repeats the whole interleaved run, each on its own batch (seed = run index); the
summary holds one value per run. With ``--threads 1`` a pass's time is its thread CPU time, which leaves out the time
other processes held the core on a loaded machine (on an idle one it equals wall time); with more threads torch's pool
does part of the work, so it is wall time. The raw file in ``--out`` keeps both clocks.

    python benchmarks/objectives.py [--n 64] [--t 1024] [--group 8] [--repeats 30] [--runs 1] [--threads 2]

``--against-verl`` times, in the same interleaved rounds, verl's own implementation of each objective verl has
(``verl.trainer.ppo.core_algos``: the GRPO / Dr.GRPO / GPG advantage estimators, the vanilla, gpg, geo_mean, gspo,
cispo, sapo, clip_cov and kl_cov policy losses, its ``agg_loss`` modes) on the same tensors, and reports per
objective mmrl's milliseconds, verl's, and their ratio. Where both compute the same loss, it first checks that they
give the same loss and gradient, and refuses to time if not; benchmarks/verl_objectives.py lists the pairs, says
where they differ by design, and how to install verl outside the repository (it is not an mmrl dependency):

    python benchmarks/objectives.py --against-verl --verl-path /tmp/verl --threads 1 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import verl_objectives as vo
from summary import add_out_arguments, result_row, write_summary

import mmrl.algos as algos
from mmrl.errors import UserError

Compute = Callable[[vo.Batch, torch.Tensor], torch.Tensor]
CLOCKS = ("wall", "cpu")
CLOCK_NAMES = {"wall": "wall ms", "cpu": "CPU ms"}


def timed(compute: Compute, batch: vo.Batch) -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) of one pass: ``compute`` (advantages, statistics, loss) and
    backward, on a fresh leaf copy of the log-probs."""
    lp = batch.logprobs.detach().requires_grad_(True)
    wall, cpu = time.perf_counter(), time.thread_time()
    compute(batch, lp).backward()
    return time.perf_counter() - wall, time.thread_time() - cpu


def interleaved(passes: dict[str, Compute], batch: vo.Batch, repeats: int,
                seed: int) -> dict[str, dict[str, list[float]]]:
    """``repeats`` rounds of every pass once, after one warm-up pass each: ``{clock: {pass: seconds}}`` for the wall
    clock and the thread's CPU clock."""
    for compute in passes.values():
        timed(compute, batch)
    times: dict[str, dict[str, list[float]]] = {c: {k: [] for k in passes} for c in CLOCKS}
    order, rng = list(passes), random.Random(seed)
    for _ in range(repeats):
        # a new order each round: load drift hits every pass alike, and no pass always runs right after another
        rng.shuffle(order)
        for key in order:
            wall, cpu = timed(passes[key], batch)
            times["wall"][key].append(wall)
            times["cpu"][key].append(cpu)
    return times


def pick_clock(threads: int) -> str:
    """The thread's CPU time with one thread: every op and the backward run on the calling thread then, so it is the
    pass's cost without the time other processes held the core (on an idle machine it equals wall time). With more
    threads the work is spread over torch's pool, which the calling thread's clock does not see: wall time."""
    return "cpu" if threads == 1 else "wall"


def mmrl_compute(algo: algos.Algorithm) -> Compute:
    return lambda batch, lp: vo.mmrl_loss(algo, batch, lp)


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def alone(args: argparse.Namespace, clock: str) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Every mmrl objective, as a ratio to mmrl's GRPO."""
    names = sorted(algos.ALGORITHMS, key=lambda n: (n != "grpo", n))
    passes = {n: mmrl_compute(algos.get(n)) for n in names}
    runs = []
    for run in range(args.runs):
        batch = vo.make_batch(args.n, args.t, args.group, seed=run)
        runs.append(interleaved(passes, batch, args.repeats, seed=run))
    medians = [{n: statistics.median(times[clock][n]) for n in names} for times in runs]
    print(f"{'algorithm':10s} {'median ms':>10s} {'p90 ms':>8s} {'x GRPO':>7s}   ({CLOCK_NAMES[clock]}, run 0)")
    for n in names:
        print(f"{n:10s} {1e3 * medians[0][n]:10.2f} {1e3 * p90(runs[0][clock][n]):8.2f} "
              f"{medians[0][n] / medians[0]['grpo']:7.2f}")
    rows = [result_row(n, f"time ÷ GRPO's, median of {args.repeats} interleaved repeats",
                       {run: m[n] / m["grpo"] for run, m in enumerate(medians)}, unit="×") for n in names]
    rows += [result_row(n, f"{CLOCK_NAMES[clock]} per pass (N={args.n}, T={args.t}, {args.threads} threads)",
                        {run: 1e3 * m[n] for run, m in enumerate(medians)}, unit="ms") for n in names]
    return "Cost of each objective alone (advantages, statistics, loss, backward)", rows, {"times_s": runs}


def against_verl(args: argparse.Namespace, verl: vo.Verl,
                 clock: str) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Each pair of :data:`verl_objectives.PAIRS` this verl has: checked where the losses are the same, then timed."""
    pairs = [p for p in vo.PAIRS if verl.has(vo.VERL_PASSES[p.verl])]
    cases = [{"case": p.label, "what": vo.VERL_PASSES[p.verl].describe(), "outcome": "not timed",
              "detail": f"verl {verl.version} registers no such estimator or policy loss"}
             for p in vo.PAIRS if p not in pairs]
    mmrl_key = {p: f"mmrl {p.mmrl}{''.join(f' {k}={v}' for k, v in p.params)}" for p in pairs}
    verl_key = {p: f"verl {p.verl}" for p in pairs}
    runs, checked = [], []
    for run in range(args.runs):
        batch = vo.make_batch(args.n, args.t, args.group, seed=run)
        built = {p: (vo.build_mmrl(p), verl.bind(vo.VERL_PASSES[p.verl], batch)) for p in pairs}
        outcome = [vo.check(p, *built[p], batch) for p in pairs]
        wrong = [c for c in outcome if c["outcome"] == "DIFFERENT"]
        if wrong:
            raise vo.Mismatch(f"run {run}: {wrong[0]['case']}: {wrong[0]['what']} give different results "
                              f"({wrong[0]['detail']}); timing them would compare different computations")
        checked = checked or outcome
        passes: dict[str, Compute] = {}
        for p in pairs:
            passes[mmrl_key[p]] = mmrl_compute(built[p][0])
            passes[verl_key[p]] = built[p][1].loss
        runs.append(interleaved(passes, batch, args.repeats, seed=run))
    # per run: the median of each side's passes, and their ratio (both sides measured in the same rounds)
    ms = [{k: 1e3 * statistics.median(v) for k, v in times[clock].items()} for times in runs]

    rows = []
    unit = CLOCK_NAMES[clock]
    print(f"{'objective':30s} {'mmrl':>8s} {'verl':>8s} {'mmrl/verl':>9s}   ({unit}, median of {args.runs} runs)")
    for p in pairs:
        tags = {"algo": p.mmrl, "verl": p.verl, "same": p.kind}
        mmrl_ms = {run: m[mmrl_key[p]] for run, m in enumerate(ms)}
        verl_ms = {run: m[verl_key[p]] for run, m in enumerate(ms)}
        ratio = {run: mmrl_ms[run] / verl_ms[run] for run in mmrl_ms}
        rows += [result_row(p.label, f"mmrl {unit} per pass", mmrl_ms, unit="ms", **tags),
                 result_row(p.label, f"verl {unit} per pass", verl_ms, unit="ms", **tags),
                 result_row(p.label, "mmrl ÷ verl", ratio, unit="×", **tags)]
        print(f"{p.label:30s} {statistics.median(mmrl_ms.values()):8.2f} {statistics.median(verl_ms.values()):8.2f} "
              f"{statistics.median(ratio.values()):9.2f}")
    return ("Cost of each objective alone, mmrl against verl's core_algos", rows,
            {"times_s": runs, "cases": checked + cases, "verl": verl.version})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--t", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30, help="interleaved rounds per run")
    parser.add_argument("--runs", type=int, default=1, help="whole interleaved runs, each on its own batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--against-verl", action="store_true",
                        help="time verl's own implementation of each objective beside mmrl's")
    parser.add_argument("--verl-path", metavar="DIR",
                        help="folder verl is installed in (pip install --target DIR); implies --against-verl")
    add_out_arguments(parser, "objectives")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.repeats < 1:
        print("objectives: --runs and --repeats must be >= 1", file=sys.stderr)
        return 2
    try:
        verl = vo.load(args.verl_path) if args.against_verl or args.verl_path else None
    except UserError as exc:
        print(f"objectives: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    clock = pick_clock(args.threads)
    load_start = os.getloadavg()[0]
    print(f"advantages + stats + loss + backward, N={args.n} x T={args.t}, groups of {args.group}, "
          f"{args.repeats} interleaved repeats x {args.runs} runs, {args.threads} threads")
    try:
        title, rows, raw = alone(args, clock) if verl is None else against_verl(args, verl, clock)
    except vo.Mismatch as exc:
        print(f"objectives: {exc}", file=sys.stderr)
        return 1
    clock_name = "thread CPU time" if clock == "cpu" else "wall time"
    notes = (f"N={args.n} responses × T={args.t} tokens, groups of {args.group}, 0/1 rewards, lengths T/4…T; "
             f"{args.repeats} interleaved rounds per run, {args.runs} runs (one batch each, seed = run), "
             f"{args.threads} thread{'s' if args.threads > 1 else ''}; a figure is the median over a run's rounds "
             f"of a pass's {clock_name}. "
             f"1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.")
    if verl is not None:
        notes += (f" verl {verl.version}'s passes run on the same tensors in the same rounds. The cases say which "
                  "pairs compute the same loss: those were checked (loss and gradient) on every run's batch before "
                  "timing; the others say how they differ.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "objectives.json").write_text(json.dumps({"config": vars(args), "torch": torch.__version__,
                                                     "machine": platform.machine(), **raw}, indent=2))
    write_summary(out, title, rows, seeds=list(range(args.runs)), notes=notes, cases=raw.get("cases"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
