"""Data is read as written: answers keep their text in jsonl, csv and parquet; a
missing field, a bad JSON line or bad bytes stop the run at start with one line naming the file and the line/row."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmrl.errors import UserError
from mmrl.tasks import get_task
from mmrl.tasks.tables import load_rows, row_place

NUMERIC = ["0.10", "12", "007", "1e3", "-0", "5"]  # a dataframe library turns this column into floats
MIXED = NUMERIC + ["3/4", "\\frac{1}{2}"]


def write(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        keys = list(rows[0])
        path.write_text(",".join(keys) + "\n" + "".join(",".join(str(r.get(k, "")) for k in keys) + "\n"
                                                         for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize("answers", [NUMERIC, MIXED], ids=["numeric", "mixed"])
@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_answers_are_strings_exactly_as_written(tmp_path, suffix, answers):
    rows = [{"problem": f"p{i}", "answer": a} for i, a in enumerate(answers)]
    path = tmp_path / f"d{suffix}"
    write(path, rows)
    task = get_task("math", path=str(path), eval_fraction=0)
    got = {s["problem"]: s["answer"] for s in task.train}
    assert got == {r["problem"]: r["answer"] for r in rows}


def test_json_numbers_keep_the_text_they_were_written_with(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "a", "answer": 0.10}\n{"problem": "b", "answer": 12}\n'
                    '{"problem": "c", "answer": 1.5e3}\n{"problem": "d", "answer": -0}\n')
    answers = sorted(s["answer"] for s in get_task("math", path=str(path), eval_fraction=0).train)
    assert answers == ["-0", "0.10", "1.5e3", "12"]


@pytest.mark.parametrize("suffix,place", [(".jsonl", "line 3 "), (".csv", "line 4 "),
                                          (".parquet", "row 2 (rows count from 0)")])
def test_a_missing_answer_stops_the_run_naming_file_row_and_column(tmp_path, suffix, place):
    path = tmp_path / f"d{suffix}"
    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": "4"}, {"problem": "3+3"}]
    if suffix == ".parquet":
        rows[2]["answer"] = None  # a null cell: parquet columns exist in every row
    write(path, rows)
    with pytest.raises(ValueError) as err:
        get_task("math", path=str(path))
    message = str(err.value)
    assert str(path) in message and place in message and "'answer'" in message and "\n" not in message


def refused(tmp_path, text: str, pattern: str) -> None:
    """The math task refuses ``data.jsonl`` holding ``text`` with one line matching ``pattern``."""
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=pattern):
        get_task("math", path=str(path))


def test_a_bad_json_line_is_named_by_its_line_number(tmp_path):
    refused(tmp_path, '{"problem": "a", "answer": "1"}\n\n{"problem": "b" "answer": "2"}\n',
            r"d.jsonl line 3 is not valid JSON")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_bare_nan_and_infinity_are_not_json(tmp_path, constant):
    """Python's json module reads them; no JSON standard has them, and a gold answer "nan" would be invented."""
    refused(tmp_path, '{"problem": "1+1", "answer": "2"}\n{"problem": "NaN", "answer": ' + constant + '}\n',
            f"line 2 is not valid JSON \\({constant} is not a JSON value at column 30\\)$")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_an_integer_longer_than_python_reads_is_refused_naming_its_line_and_column(tmp_path, suffix):
    """int() refuses more than sys.get_int_max_str_digits() digits; that is a line about the file, not a traceback."""
    path = tmp_path / f"d{suffix}"
    rows = '{"problem": "1+1", "answer": "2"},\n{"problem": "big", "answer": ' + "9" * 5000 + "}"
    path.write_text(rows.replace(",\n", "\n") if suffix == ".jsonl" else f"[{rows}]")
    with pytest.raises(UserError, match=r"d\.json.? line 2 column 30 holds an integer of 5000 digits, more than the "
                                        r"4300 an integer may have$"):
        get_task("math", path=str(path))


@pytest.mark.parametrize("answer", ["true", "[1, 2]", '{"a": 1}'])
def test_an_answer_that_is_not_text_or_a_number_is_refused(tmp_path, answer):
    refused(tmp_path, '{"problem": "1+1", "answer": ' + answer + '}\n',
            r"d.jsonl line 1 has an 'answer' that is not text or a number")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_bad_encoding_names_the_file_and_line(tmp_path, suffix):
    path = tmp_path / f"d{suffix}"
    good = b'{"problem": "a", "answer": "1"}\n' if suffix == ".jsonl" else b"problem,answer\na,1\n"
    bad = b'{"problem": "b\xff", "answer": "2"}\n' if suffix == ".jsonl" else b"b\xff,2\n"
    path.write_bytes(good + bad)
    line = 2 if suffix == ".jsonl" else 3
    with pytest.raises(ValueError, match=rf"d\{suffix} line {line} is not UTF-8 text \(byte 0xff"):
        get_task("math", path=str(path))


def test_a_bad_row_is_named_by_its_line_past_blank_lines(tmp_path):
    """Blank lines are skipped, so a row's count among the rows is not its line; the line is what an editor shows."""
    refused(tmp_path, '{"problem": "a", "answer": "1"}\n\n\n{"problem": "b", "answer": ""}\n',
            r"d.jsonl line 4 has an empty 'answer'$")


def test_a_csv_row_after_a_multi_line_cell_is_named_by_the_line_it_starts_on(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('problem,answer\n"two\nlines",1\n\nb,\n')
    with pytest.raises(ValueError, match=r"d.csv line 5 has no 'answer'$"):
        get_task("math", path=str(path))


def test_json_list_items_are_named_and_a_slice_keeps_its_places(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"},
                                {"problem": "c", "answer": None}]))
    with pytest.raises(ValueError, match=r"d.json item 2 \(items count from 0\) has no 'answer'$"):
        get_task("math", path=str(path))
    rows = load_rows(str(path))
    assert row_place(rows[1:], 1) == "item 2 (items count from 0)" and rows[1:][1] == {"problem": "c", "answer": None}
    assert row_place([{"a": 1}], 0) == "row 0 (rows count from 0)"  # rows a task built have no lines


def test_an_image_folder_row_is_named_by_its_file(tmp_path):
    from PIL import Image

    from mmrl.tasks.vision_data import image_folder_rows

    (tmp_path / "cat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "cat" / "a.png")
    (tmp_path / "cat" / "b.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"file cat/b.png column 'image'.*cannot be read"):
        get_task("classification", path=str(tmp_path))
    assert row_place(image_folder_rows(tmp_path), 0) == "file cat/a.png"


def test_csv_with_more_cells_than_the_header_is_refused(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("problem,answer\na,1\nb,2,3\n")
    with pytest.raises(ValueError, match="d.csv line 3 has 3 cells, the header 2"):
        get_task("math", path=str(path))
    path.write_text('problem,answer\n"a\nb",1,2\n')  # named by the line its record starts on
    with pytest.raises(ValueError, match="d.csv line 2 has 3 cells"):
        get_task("math", path=str(path))


def test_an_image_row_without_its_answer_is_named_by_its_row(tmp_path):
    """The answer column is settled from every row, so a first row that lacks it is named, not the column."""
    from PIL import Image

    Image.new("RGB", (28, 28)).save(tmp_path / "a.png")
    rows = [{"image": "a.png", "problem": "x?"}, {"image": "a.png", "problem": "y?", "answer": "3"}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"d.jsonl line 1 has no 'answer'"):
        get_task("geoqa", path=str(path))


def test_vision_labels_keep_their_text(tmp_path):
    """The vision tasks read through the same loader: a label column of digits stays text."""
    from PIL import Image

    rows = []
    for i, label in enumerate(["01", "1.0", "1"]):
        Image.new("RGB", (28, 28), (i * 40, 0, 0)).save(tmp_path / f"{i}.png")
        rows.append({"image": f"{i}.png", "label": label})
    path = tmp_path / "d.csv"
    write(path, rows)
    task = get_task("classification", path=str(path), eval_fraction=0)
    assert sorted(s["answer"] for s in task.train) == ["01", "1", "1.0"]


def test_a_huge_single_row_is_refused_in_seconds(tmp_path, embedded_model_dir):
    """Case 13: a 10 MB row; its prefix proves it too long (the whole took 125 s to tokenize)."""
    import time

    from mmrl.models import load_tokenizer
    from mmrl.run.prompts import encode_prompt

    tok = load_tokenizer("embedded:tiny-qwen2")
    huge = [{"role": "user", "content": "What is 2+3? " * 800_000}]
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"rollout.max_prompt_tokens: a prompt has more than \d+ tokens \(10400"):
        encode_prompt(tok, huge, 512)
    assert time.perf_counter() - start < 20
    short = [{"role": "user", "content": "What is 2+3? " * 30}]
    assert len(encode_prompt(tok, short, 512)) > 30  # a prompt under the cut is tokenized as before


def test_an_unreachable_hub_dataset_fails_in_seconds(monkeypatch):
    import time

    from mmrl import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)  # the offline machine, whatever this one is
    start = time.perf_counter()
    with pytest.raises(ValueError, match="task.path: 'someorg/nothing' is not a local file, and the Hugging Face hub"):
        get_task("math", path="someorg/nothing")
    assert time.perf_counter() - start < 10


def test_a_parquet_float_answer_is_its_decimal_without_an_exponent(tmp_path):
    path = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"problem": ["a", "b", "c", "d"], "answer": [0.00001, 1e16, 0.25, 3.0]}), path)
    task = get_task("math", path=str(path), eval_fraction=0)
    assert [s["answer"] for s in task.train] == ["0.00001", "10000000000000000", "0.25", "3.0"]
    assert [float(row["answer"]) for row in load_rows(str(path))] == [0.00001, 1e16, 0.25, 3.0]


def test_gold_answers_in_e_notation_warn_once_naming_the_file_and_are_scored_as_numbers(tmp_path, caplog):
    path = tmp_path / "sci.jsonl"
    path.write_text('{"problem": "a", "answer": 2}\n\n{"problem": "b", "answer": 1e3}\n'
                    '{"problem": "c", "answer": "1E-05"}\n{"problem": "d", "answer": "2e"}\n')
    with caplog.at_level("WARNING", logger="mmrl"):
        task = get_task("math", path=str(path), eval_fraction=0)
    warnings = [r.getMessage() for r in caplog.records if "e-notation" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"{path} has 2 gold answer(s) in e-notation (first: '1e3' at line 3)" in warnings[0]
    assert "scored as the number it writes (1000)" in warnings[0]
    completions = ["<answer>1000</answer>", "<answer>3e</answer>", "<answer>0.00001</answer>",
                   "<answer>2e</answer>"]
    samples = [task.train[1], task.train[1], task.train[2], task.train[3]]
    assert [r.score for r in task.reward(completions, samples)] == [1.0, 0.0, 1.0, 1.0]  # no <think>: format 0


def test_a_prompt_over_the_token_limit_is_named_by_its_line_in_the_file(tmp_path, embedded_model_dir):
    """The held-out split is drawn by a seeded shuffle, so "train row 12" no longer finds the row in the file."""
    from mmrl.models import load_tokenizer
    from mmrl.run.build import encode_all_prompts

    rows = [json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(30)]
    rows[20] = json.dumps({"problem": "What is 2+3? " * 200, "answer": "5"})
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(rows[:5]) + "\n\n" + "\n".join(rows[5:]) + "\n")  # a blank line: row 20 is line 22
    task = get_task("math", path=str(path), eval_fraction=0.1, seed=3)
    with pytest.raises(ValueError, match=rf"more than 256 \((train|eval) row \d+: {path} line 22\); raise it"):
        encode_all_prompts(task, load_tokenizer("embedded:tiny-qwen2"), 256)


def test_an_image_prompt_over_the_token_limit_is_named_by_its_line_in_the_file(tmp_path):
    from PIL import Image

    from mmrl.run.prompts import check_prompts

    Image.new("RGB", (16, 16), "white").save(tmp_path / "a.png")
    path = tmp_path / "shapes.jsonl"
    path.write_text("".join(json.dumps({"image": "a.png", "label": f"thing {i}"}) + "\n" for i in range(10)))
    task = get_task("classification", path=str(path), eval_fraction=0.2, seed=1)

    class Lengths:  # prompt lengths by label, as a processor would count them: one row is too long
        def prompt_length(self, row, where):
            return 9000 if row["answer"] == "thing 6" else 100

    with pytest.raises(ValueError, match=rf"classification (train|eval) row \d+: {path} line 7 has 9000 prompt"):
        check_prompts(task, Lengths(), 512)


def test_a_parquet_bytes_answer_is_refused_not_written_as_its_repr(tmp_path):
    """str(b"12") is "b'12'": a gold answer nobody wrote."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"problem": "1+11", "answer": b"12"}]), path)
    with pytest.raises(UserError, match=r"d.parquet row 0 \(rows count from 0\) has an 'answer' that is not text or "
                                        r"a number: b'12'$"):
        get_task("math", path=str(path))
