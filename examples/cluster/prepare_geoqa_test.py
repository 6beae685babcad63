#!/usr/bin/env python
"""The 754-problem GeoQA test set as the GPG authors evaluate it (AMAP-ML/GPG R1-V/src/eval), the GPG GeoQA recipe's
evaluation set geoqa_test.

    python examples/cluster/prepare_geoqa_test.py --source geoqa_test_prompts.jsonl --images DIR

The prompts file is AMAP-ML/GPG's R1-V/src/eval/prompts/geoqa_test_prompts.jsonl (rows image_path, question,
ground_truth; image_path reads "./Geo170K/images/test/<n>.png"). The images are the test diagrams of the hub dataset
Luckyjhg/Geo170K (hf download --repo-type dataset Luckyjhg/Geo170K, then unzip its images.zip into a folder DIR
named Geo170K's parent, so that DIR/Geo170K/images/test/0.png exists: R1-V's README, "GEOQA"). --images is that DIR,
the folder image_path is relative to. The prompts file is written unchanged and every image it names is copied
beside it under the same relative path, which is where the recipe reads them.
"""

from __future__ import annotations

import os
from pathlib import Path

from prepare_common import ANSWER, TEXT, Dataset, check_rows, help_text, output_for, parser, read_rows, run

from mmrl.errors import UserError
from mmrl.tasks.vision_data import ImageRoot, image_value

DATASET = Dataset(
    name="geoqa_test", hub="AMAP-ML/GPG R1-V/src/eval/prompts/geoqa_test_prompts.jsonl", split="test", rows=754,
    fields={"image_path": TEXT, "question": TEXT, "ground_truth": ANSWER},
    out="/data/geoqa/R1-V-eval/geoqa_test_prompts.jsonl",
    recipes="gpg_geoqa_qwen2.5-vl-3b.yaml, grpo_geoqa_qwen2.5-vl-3b.yaml (evaluation set geoqa_test)",
    layout="the prompts file from the AMAP-ML/GPG repository (--source) and Luckyjhg/Geo170K's images.zip unzipped "
           "so that DIR/Geo170K/images/test/<n>.png exists (--images DIR)",
    counted="count and columns from the file itself: AMAP-ML/GPG's R1-V/src/eval/prompts/"
            "geoqa_test_prompts.jsonl (the same as Deep-Agent/R1-V's) has 754 rows of image_path, question, "
            "ground_truth (R1-V's README names the set \"GeoQA-Test-Direct-Answer-735\", but its file has 754); "
            "the images from R1-V's README, section GEOQA")


def main(argv: list[str] | None) -> int:
    p = parser(help_text(DATASET), DATASET.out)
    p.add_argument("--images", required=True, help="the folder the prompts' image_path values are relative to "
                                                   "(the one holding Geo170K/)")
    args = p.parse_args(argv)
    source = Path(args.source).expanduser().absolute()
    if not source.is_file():
        raise UserError(f"--source: no such file {str(source)!r} (the geoqa_test_prompts.jsonl)")
    root = Path(args.images).expanduser().absolute()
    if not root.is_dir():
        raise UserError(f"--images: no such folder {str(root)!r}")
    images: dict[str, Path] = {}

    def check_image(file: Path, place: str, row: dict) -> None:
        where = f"{file} {place} field 'image_path'"
        name = row["image_path"]
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise UserError(f"{where}: {name!r} is not a path inside --images")
        images[name] = Path(image_value(name, ImageRoot(root), where))  # exists, stays in root, decodes

    rows = read_rows([source])
    check_rows(DATASET, rows, args.expect_rows if args.expect_rows is not None else DATASET.rows, check_image)
    output, path = output_for(args.out, args.force, Path(__file__).name)
    targets = {name: Path(os.path.normpath(path.parent / name)) for name in images}
    output.claim_all([path, *targets.values()])
    for name, image in images.items():
        output.write(targets[name], image.read_bytes(), str(image))
    output.write(path, source.read_bytes(), str(source))
    output.save_record()
    print(f"{DATASET.name}: {len(rows):,} rows and {len(images):,} images checked, written to {path.parent}")
    return 0


if __name__ == "__main__":
    run(main)
