"""Where the embedded text model starts on arithmetic_stream, by operand range: held-out pass@1 greedy and sampled.

A difficulty RL can work on needs a start above 0 with a gap between greedy and sampled accuracy (there is a right
answer to sharpen). One evaluation per operand range, before any update: every held-out problem (at most 100),
greedy and ``--k`` samples at temperature 1, 12 new tokens as in benchmarks/learning.py.

    python benchmarks/stream_start.py [--max-operands 9,12,14,19,49,99] [--k 8]
"""

from __future__ import annotations

import argparse

import torch
from summary import add_out_arguments, result_row, write_summary

from mmrl.cache import EMBEDDED_NAME
from mmrl.models import load_model, load_tokenizer
from mmrl.tasks import get_task
from mmrl.trainer.evaluate import evaluate_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-operands", default="9,12,14,19,49,99")
    parser.add_argument("--k", type=int, default=8)
    add_out_arguments(parser, "stream_start")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model(EMBEDDED_NAME), load_tokenizer(EMBEDDED_NAME)
    rows = []
    for m in (int(x) for x in args.max_operands.split(",")):
        task = get_task("arithmetic_stream", max_operand=m)
        greedy, _ = evaluate_groups(model, tokenizer, task, k=1, temperature=0.0, max_new_tokens=12)
        sampled, _ = evaluate_groups(model, tokenizer, task, k=args.k, temperature=1.0, max_new_tokens=12)
        label = f"operands 0..{m} ({len(task.eval)} held-out problems)"
        print(label, greedy["pass@1"], sampled["pass@1"], sampled.get("format_rate"))
        rows += [result_row(label, "held-out pass@1, greedy", {0: greedy["pass@1"]}),
                 result_row(label, f"held-out pass@1, sampled (k = {args.k}, T = 1)", {0: sampled["pass@1"]}),
                 result_row(label, "held-out format rate, sampled", {0: sampled["format_rate"]})]
    write_summary(args.out, "Where the embedded text model starts on arithmetic_stream, by operand range", rows,
                  seeds=[0], notes="One evaluation of the shipped model before any update (no seeds to average: "
                  "greedy decoding and a fixed sampling seed). The model was pre-trained on one-digit sums only.")


if __name__ == "__main__":
    main()
