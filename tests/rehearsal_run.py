"""Running ``python -m mmrl.train --backend openrlhf --cluster.rehearsal true`` from a test, and what every rehearsal
run is checked for (tests/test_openrlhf_rehearsal.py, tests/test_recipes.py); the runs join the module's Ray cluster
(the ``ray_address`` fixture of conftest.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch
from listeners import is_loopback, listeners

import mmrl.algos as algos

REPO = Path(__file__).resolve().parents[1]


# Processes whose listeners the check must have seen during every run (their command lines): the module's Ray (GCS,
# raylet with its object manager, the dashboard agent), the run's driver, its policy actors (which also host
# DeepSpeed's rendezvous store, the gloo sockets of their process group and the weight-sync store) and its rollout
# actors (the other end of the weight sync). Each entry names a process by any of its command lines: the dashboard
# agent listens before it retitles itself "ray::DashboardAgent", and under load it may stay untitled for a whole run.
MUST_SEE = (("gcs_server",), ("raylet",), ("DashboardAgent", "ray/dashboard/agent.py"), ("mmrl.train",),
            ("PolicyModelActor",), ("RolloutActor",))


def rehearse(address: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """Run the rehearsal; while it runs, every listener of this process's tree (the module's Ray, the run's driver,
    its actors and their torch-distributed stores and gloo sockets) must be on loopback (tests/listeners.py), and the
    tree walk must have reached each process of :data:`MUST_SEE`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "mmrl.train", "--backend", "openrlhf", "--cluster.rehearsal", "true",
           "--cluster.ray_address", address, "--out", str(out), *flags]
    seen: set[tuple[str, str, int]] = set()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        outputs: list[str] = []
        reader = threading.Thread(target=lambda: outputs.extend(proc.communicate(timeout=900)))
        reader.start()
        while reader.is_alive():
            seen.update((command, address, port) for _, command, address, port in listeners())
            reader.join(timeout=1.0)
    done = subprocess.CompletedProcess(cmd, proc.returncode, *outputs)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    exposed = sorted(f"{a}:{p} ({c})" for c, a, p in seen if not is_loopback(a))
    assert not exposed, "listening beyond loopback:\n" + "\n".join(exposed)
    missed = [names for names in MUST_SEE if not any(n in c for n in names for c, _, _ in seen)]
    assert not missed, f"no listener of {missed} was seen; seen: {sorted({c for c, _, _ in seen})}"
    return done


def step_records(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def digests_by_process(path: Path) -> list[list[str]]:
    """The weight digests each process (policy rank 0 or a rollout engine, of each run) wrote, sync 0 first."""
    lives: dict[int, list[dict]] = {}
    for record in map(json.loads, path.read_text().splitlines()):
        lives.setdefault(record["pid"], []).append(record)
    assert all([r["sync"] for r in life] == list(range(len(life))) for life in lives.values())
    return [[r["digest"] for r in life] for life in lives.values()]


def padded_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])


def step_items(out: Path, step: int) -> dict[str, list[dict]]:
    """What each policy rank received for ``step``: {file name: per-experience records} (rehearsal_policy.py)."""
    return {p.name: torch.load(p, weights_only=True) for p in sorted((out / "rehearsal").glob(f"rank*_step{step}.pt"))}


def any_group_varies(out: Path, step: int) -> bool:
    items = [it for share in step_items(out, step).values() for it in share]
    rewards = torch.cat([it["rewards"] for it in items]).tolist()
    groups = torch.cat([it["group_ids"] for it in items]).tolist()
    return any(len({r for r, g in zip(rewards, groups, strict=True) if g == gid}) > 1 for gid in set(groups))


def check_run(out: Path, steps: int, weights_show_step: bool = True) -> None:
    """Every step logged with a finite loss and reward, an evaluation after the last, the rollout engines holding the
    policy's weights after every sync, a checkpoint of the last step. ``weights_show_step``: step 1 changed the bf16
    weights exactly when some group's rewards differed (False for the paper recipes: at their learning rates, 1e-6 or
    a warm-up from 0, one step does not move a bf16 weight by one unit of its last place)."""
    records = step_records(out)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["reward"]) for r in records)
    # run.eval_every 0 (the default): one evaluation, after the last step
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if any(k.startswith("eval") for k in r)]
    assert evals and evals[-1]["step"] == steps
    policy = digests_by_process(out / "rehearsal" / "policy_weights.jsonl")
    rollout = digests_by_process(out / "rehearsal" / "rollout_weights.jsonl")
    if weights_show_step:  # all-equal groups carry no gradient
        assert (policy[0][1] != policy[0][0]) == any_group_varies(out, 1)
    # every engine of every run received exactly what policy rank 0 sent, sync after sync (sync 0 is each side's
    # load of the checkpoint: bf16 on the policy, fp32 on the engine)
    assert len(rollout) % len(policy) == 0
    assert all(engine[1:] in [life[1:] for life in policy] for engine in rollout)
    assert sorted(len(e) for e in rollout) == sorted(len(life) for life in policy for _ in
                                                     range(len(rollout) // len(policy)))
    assert (out / "checkpoints" / "_actor" / f"global_step{steps}").is_dir()


def check_statistics(out: Path, name: str, steps: int, group_size: int, params: dict | None = None) -> None:
    """Each rank's share against ``mmrl.algos`` (objective ``name`` with ``params``) on the whole step (what the
    local trainer computes)."""
    algo = algos.get(name, **(params or {}))
    for step in range(1, steps + 1):
        shares = step_items(out, step)
        items = [it for share in shares.values() for it in share]
        assert items, (out, step)
        rewards = torch.cat([it["rewards"] for it in items]).float()
        group_ids = torch.cat([it["group_ids"] for it in items]).long()
        old = padded_cat([it["old_logprobs"].float() for it in items])
        mask = padded_cat([it["action_mask"].float() for it in items])
        advantages = algo.advantages(rewards, group_ids)
        want = algo.batch_stats(rewards, group_ids, advantages, old, mask)
        got_adv = torch.cat([(it["advantages"] * it["action_mask"]).sum(1) / it["action_mask"].sum(1).clamp(min=1)
                             for it in items])
        assert torch.allclose(got_adv.float(), advantages.float(), atol=1e-5), (name, step)
        at = 0
        for share in shares.values():
            for it in share:
                n = it["rewards"].numel()
                for key, value in want.items():
                    if isinstance(value, (int, float)):
                        assert torch.allclose(it["stats"][key].double(), torch.tensor(float(value)).double(),
                                              rtol=1e-5, atol=1e-7), (name, step, key)
                    else:  # a row statistic (e.g. of the sample's group): the sample's own value
                        assert torch.allclose(it["row_stats"][key].double(), value[at:at + n].double(),
                                              rtol=1e-5, atol=1e-7), (name, step, key)
                at += n
        if name == "gvpo":  # whole groups, each on one rank
            owner = {}
            for rank, share in shares.items():
                ids = torch.cat([it["group_ids"] for it in share]).tolist()
                for gid in set(ids):
                    assert ids.count(gid) == group_size and owner.setdefault(gid, rank) == rank
