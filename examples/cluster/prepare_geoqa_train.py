#!/usr/bin/env python
"""R1-V's GeoQA training set (leonardPKU/GEOQA_R1V_Train_8K, about 8,000 GeoQA problems with their diagrams), as the
GPG GeoQA recipe and its GRPO baseline train on it.

    python examples/cluster/prepare_geoqa_train.py --source DIR      (--help: the download and the checks)

The shards are joined into one parquet file with their columns and schema unchanged (the image column stays the
hub's {bytes, path} image cells). The row count checked is the one the download's own dataset card (README.md)
states for the train split, so a shard missing from the download is caught; a copy without its card needs
--expect-rows.
"""

from __future__ import annotations

import io
from pathlib import Path

from prepare_common import TEXT, Dataset, check_rows, help_text, output_for, parser, read_rows, run, split_files

from mmrl.errors import UserError
from mmrl.tasks.vision_data import ImageRoot, image_value, strip_answer_tags
from mmrl.values import safe_yaml

DATASET = Dataset(
    name="geoqa_train", hub="leonardPKU/GEOQA_R1V_Train_8K", split="train", rows=None,
    fields={"problem": TEXT, "solution": TEXT}, out="/data/geoqa/train.parquet",
    recipes="gpg_geoqa_qwen2.5-vl-3b.yaml, grpo_geoqa_qwen2.5-vl-3b.yaml (task.path)",
    layout="hf download --repo-type dataset leonardPKU/GEOQA_R1V_Train_8K --local-dir DIR: DIR/data/train-*.parquet "
           "(columns image {bytes, path}, problem, solution \"<answer>...</answer>\") and DIR/README.md, the card "
           "whose dataset_info gives the train split's num_examples",
    counted="unverified: no source states the exact count (R1-V's README: \"GEOQA-8k\"; the GPG paper's "
            "§3: \"around 8,000 samples\"), so the count checked is the one the download's own card states; the "
            "columns are what R1-V's grpo.py reads (image, problem, solution)")


def card_rows(source: str, split: str) -> int | None:
    """The ``num_examples`` of ``split`` in the dataset card (README.md front matter) of a snapshot folder."""
    card = Path(source).expanduser() / "README.md"
    if not card.is_file():
        return None
    text = card.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return None
    header = safe_yaml(text.split("---", 2)[1]) or {}
    info = header.get("dataset_info") if isinstance(header, dict) else None
    splits = info.get("splits") if isinstance(info, dict) else None
    for entry in splits if isinstance(splits, list) else []:
        if isinstance(entry, dict) and entry.get("name") == split and isinstance(entry.get("num_examples"), int):
            return entry["num_examples"]
    return None


def check_geoqa_row(file: Path, place: str, row: dict) -> None:
    where = f"{file} {place} field 'image'"
    if row.get("image") is None:
        raise UserError(f"{file} {place} has no field 'image'")
    image_value(row["image"], ImageRoot(None), where)  # decodes it: a corrupt diagram fails here, not mid-run
    if not str(strip_answer_tags(row["solution"])).strip():
        raise UserError(f"{file} {place} field 'solution' has an empty <answer>")


def main(argv: list[str] | None) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    args = parser(help_text(DATASET), DATASET.out).parse_args(argv)
    files = split_files(args.source, DATASET.split)
    expected = args.expect_rows if args.expect_rows is not None else card_rows(args.source, DATASET.split)
    if expected is None:
        raise UserError(f"--source: {args.source} has no dataset card (README.md) giving the train split's "
                        f"num_examples; give the count with --expect-rows")
    check_rows(DATASET, read_rows(files), expected, check_geoqa_row)
    output, path = output_for(args.out, args.force, Path(__file__).name)
    output.claim(path)
    table = pa.concat_tables([pq.read_table(f) for f in files])
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    output.write(path, buffer.getvalue(), ", ".join(map(str, files)))
    output.save_record()
    print(f"{DATASET.name}: {table.num_rows:,} rows checked, written to {path}")
    return 0


if __name__ == "__main__":
    run(main)
