"""End to end: OpenRLHF 0.11.2's real pipeline on this CPU (``--cluster.rehearsal true``), one Ray cluster shared by
every run.

Each run is ``python -m mmrl.train --backend openrlhf --cluster.rehearsal true`` joining the module's Ray cluster:
Ray actor groups, OpenRLHF's PPO trainer, policy (and reference) actors, experience maker, replay buffer, DeepSpeed
ZeRO-2 on gloo, checkpoints and ``--resume``; rollouts come from the HF rollout actor behind the vLLM interface
(mmrl/openrlhf/rollout.py). For each run the test checks:

* one ``metrics.jsonl`` line per step with a finite loss and reward;
* the policy's weights changed after step 1, and after every sync the rollout actors' weights equal the policy's
  (digests of the bf16 weights both sides write under ``<run>/rehearsal/``);
* a DeepSpeed checkpoint of the last step;
* the statistics each policy rank trains with (GPG's α, CW-GRPO's covariance moments, every objective's advantages)
  equal what ``mmrl.algos`` -- the local trainer's code -- computes on the whole step that rank's share came from,
  and GVPO's groups arrive whole on one rank (its group moments are then the whole group's).

One test of two runs, because each run costs a Ray job's start-up (every actor imports torch, DeepSpeed and
OpenRLHF; ~20 s on 2 cores): GVPO on the embedded text model with 2 policy ranks (placed one per declared GPU of the
colocation group; its groups must arrive whole on one rank) and historical replay for 2 steps, resumed to step 3.
GRPO with its reference model, GPG (with its resampling rule), the vision task (GeoQA, the embedded Qwen2.5-VL),
ALFWorld in the turn layout on 2 policy ranks with the env pool (GiGPO for 2 steps), CW-GRPO and GMPO run in
tests/test_recipes.py, as one step of each paper recipe and of each paper's GRPO baseline (the same checks, plus the
recipe's own objective, schedule and evaluation sets). Dr.GRPO differs from GRPO only inside the loss, which
tests/test_openrlhf_slow.py checks in OpenRLHF's actor under DeepSpeed. GSPO, CISPO and SAPO, which have no paper
recipe here, run one step each on the arithmetic task (the same checks).
"""

from __future__ import annotations

import json
import math
import re

import pytest
from rehearsal_run import check_run, check_statistics, rehearse, step_items, step_records

from mmrl.openrlhf.checkpoint import read_replay_store

pytestmark = pytest.mark.slow
SMALL = ["--rollout.prompts_per_step", "2", "--rollout.samples_per_prompt", "8", "--rollout.max_new_tokens", "8",
         "--run.eval_samples", "1", "--model.threads", "1"]


def response_row(sequence, attention, action, reward) -> tuple[tuple, tuple, float]:
    """(prompt tokens, response tokens, reward) of one row of a sample's tensors."""
    prompt_end = int(action.nonzero()[0]) + 1
    return (tuple(sequence[:prompt_end].tolist()), tuple(sequence[prompt_end:][attention[prompt_end:] > 0].tolist()),
            float(reward))


def test_rehearsal_of_gvpo_replays_each_prompts_latest_responses_across_a_resume(ray_address, tmp_path):
    """``--rollout.replay_historical 2`` on 2 policy ranks for 2 steps, then ``--resume`` to step 3. The split keeps
    3 problems for training, so every step trains the same 2 prompts: from step 2 on each group holds 6 fresh
    responses and, after them, the 2 most recent fresh responses of its prompt from earlier steps, with their
    rewards. The store saved with the step-2 checkpoint holds each prompt's 8 most recent fresh responses with their
    behaviour log-probs, and step 3 of the resumed run replays the last 2 of them."""
    out, k = tmp_path / "gvpo_replay", 2
    done = rehearse(ray_address, out, "--algo", "gvpo", "--task", "arithmetic", "--task.max_operand", "1", "--steps",
                    "2", "--rollout.replay_historical", str(k), "--cluster.gpus_per_node", "2",
                    "--cluster.vllm_engines", "2", *SMALL)
    # Ray placed the two policy ranks (OpenRLHF's RayActorGroup) in the colocation group, one declared GPU each
    placed = re.findall(r"policy rank (\d)/(\d) on \S+ GPUs \['(\d)'\]", done.stdout + done.stderr)
    assert sorted(p[:2] for p in placed) == [("0", "2"), ("1", "2")] and len({p[2] for p in placed}) == 2, placed
    check_run(out, 2)
    store = read_replay_store(out / "checkpoints" / "_actor" / "global_step2")  # read before step 3 may prune it
    record = json.loads((out / ".mmrl-run.json").read_text())["files"]
    assert any("checkpoints/_actor/global_step2/mmrl_replay".startswith(f + "/") for f in record)
    rehearse(ray_address, out, "--resume", "--steps", "3")
    check_run(out, 3)
    check_statistics(out, "gvpo", 3, 8)

    saved: dict[tuple, list[tuple[tuple, float]]] = {}  # each prompt's stored responses (tokens, reward), in order
    for entry in store["prompts"]:
        rows = [response_row(s["sequences"][0], s["attention_mask"][0], s["action_mask"][0], s["rewards"][0])
                for s in entry["samples"]]
        assert len({r[0] for r in rows}) == 1 and len(rows) == 8
        assert all(s["action_log_probs"] is not None for s in entry["samples"])  # their behaviour log-probs
        saved[rows[0][0]] = [(r[1], r[2]) for r in rows]
    history: dict[tuple, list[tuple[tuple, float]]] = {}  # each prompt's fresh responses (tokens, reward), in order
    for step in (1, 2, 3):
        groups = [response_row(it["sequences"][i], it["attention_mask"][i], it["action_mask"][i], it["rewards"][i])
                  for share in step_items(out, step).values() for it in share for i in range(len(it["rewards"]))]
        assert len(groups) == 16
        for start in range(0, 16, 8):
            rows = groups[start:start + 8]
            prompt = rows[0][0]
            assert all(r[0] == prompt for r in rows)  # one prompt per group
            past = history.get(prompt, [])
            replayed = [(r[1], r[2]) for r in rows[8 - k:]] if step > 1 else []
            assert replayed == past[-k:] if step > 1 else not past
            if step == 3:  # the resumed run replays from the store the checkpoint saved
                assert past[-8:] == saved[prompt] and replayed == saved[prompt][-k:]
            history.setdefault(prompt, []).extend((r[1], r[2]) for r in rows[:8 - k if step > 1 else 8])
    records = step_records(out)
    assert [r["replay/responses"] for r in records] == [0, 2 * k, 2 * k]
    assert all(math.isfinite(r["replay/logprob_shift"]) for r in records[1:])  # step 3's: the restored behaviour


@pytest.mark.parametrize("name", ["gspo", "cispo", "sapo"])
def test_rehearsal_step_of_each_sequence_ratio_objective(name, ray_address, tmp_path):
    """One step of ``--algo NAME`` through OpenRLHF's pipeline, at the objective's paper defaults."""
    out = tmp_path / name
    rehearse(ray_address, out, "--algo", name, "--task", "arithmetic", "--task.max_operand", "1", "--steps", "1",
             *SMALL)
    check_run(out, 1)
    check_statistics(out, name, 1, 8)
