"""A user's data file read exactly as written: jsonl, json, csv and parquet, or a hub dataset id.

No value is converted on the way in: an answer ``"0.10"`` stays ``"0.10"`` and ``"12"`` stays ``"12"`` (a dataframe
library would make them ``0.1`` and ``12.0``, and a missing cell ``nan``, which then passes for an answer). A missing
cell is ``None``, so a task's check of its required columns sees it. In detail:

* jsonl / json: strings stay strings; a JSON number keeps the text it was written with (:class:`WrittenNumber`, a
  float whose ``str`` is ``0.10``, not ``0.1``; :class:`WrittenInteger`, an int whose ``str`` is ``-0``, not ``0``);
  ``null`` and an absent key are ``None``. An integer longer than Python reads (``sys.get_int_max_str_digits()``,
  4300 digits) is refused naming its line and column.
* csv: every cell is the string in the file; an empty cell is ``None`` (csv cannot tell "" from missing).
* parquet: the column types of the file (an int column with nulls stays ints and ``None``, not floats); a float
  cell's text is its shortest decimal without an exponent (``0.00001``, where Python would print ``1e-05``).

A line that is not JSON or not UTF-8 stops the run with one line naming the file and the line number. Every reader
returns :class:`Rows`, which keeps where each row was written, so a task's check of a row names the file's line (jsonl,
csv) or item (json list), not its count among the rows (blank lines and multi-line CSV cells make the two differ).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from mmrl.errors import UserError
from mmrl.paths import expand_path

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


class _Written:
    """A number that remembers how it was written: ``str`` gives the text; arithmetic and comparisons are the
    number's (the class after this one in a subclass's bases: float or int)."""

    text: str

    def __new__(cls, text: str):
        number = super().__new__(cls, text)
        number.text = str(text)
        return number

    def __str__(self) -> str:
        return self.text

    def __reduce__(self):
        return type(self), (self.text,)


class WrittenNumber(_Written, float):
    """A JSON number with a fraction or exponent: ``str(WrittenNumber("0.10")) == "0.10"``."""


class WrittenInteger(_Written, int):
    """A JSON integer: ``str(WrittenInteger("-0")) == "-0"``."""


class Rows(list):
    """A list of rows that keeps, for each, where the file wrote it (``"line 7"``, ``"item 3"``); a slice keeps its
    rows' places. ``field`` is the option that named the file, for a task's check of a row to name it."""

    def __init__(self, rows: list[dict[str, Any]], places: list[str], field: str = "task.path") -> None:
        if len(rows) != len(places):
            raise UserError(f"Rows: {len(rows)} rows but {len(places)} places")
        super().__init__(rows)
        self.places = list(places)
        self.field = field

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Rows(list.__getitem__(self, index), self.places[index], self.field)
        return list.__getitem__(self, index)


def row_place(rows: list[dict[str, Any]], i: int) -> str:
    """Where row ``i`` of ``rows`` is in its file: ``"line 7"`` (jsonl, csv), ``"item 3"`` (a json list); a table
    with no lines (parquet, a hub dataset, json columns, rows a task built) names the row's count from 0."""
    return rows.places[i] if isinstance(rows, Rows) else _counted_place(i)


def _counted_place(i: int) -> str:
    return f"row {i} (rows count from 0)"


def _counted(rows: list[dict[str, Any]]) -> Rows:
    return Rows(rows, [_counted_place(i) for i in range(len(rows))])


def _decode(data: bytes, path: Path, field: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UserError(f"{field}: {path} line {line} is not UTF-8 text (byte 0x{data[exc.start]:02x} at column "
                         f"{column}); re-save the file as UTF-8") from None


class _Unreadable(ValueError):
    """A JSON value this reader refuses: ``message`` says why, with ``{column}`` where it was written; ``token`` is a
    regular expression of its text, to find that column (json's hooks for constants and integers are not told it)."""

    def __init__(self, message: str, token: str) -> None:
        super().__init__(message)
        self.token = token


def _not_json(name: str) -> Any:
    raise _Unreadable(f"is not valid JSON ({name} is not a JSON value at column {{column}})", re.escape(name))


def _integer(text: str) -> WrittenInteger:
    try:
        return WrittenInteger(text)
    except ValueError:  # past sys.get_int_max_str_digits(): int() refuses to read it (quadratic time)
        digits = sys.get_int_max_str_digits()
        raise _Unreadable(f"column {{column}} holds an integer of {len(text.lstrip('-'))} digits, more than the "
                          f"{digits} an integer may have", rf"-?\d{{{digits + 1},}}(?![.\deE])") from None


def _where(text: str, token: str) -> tuple[int, int]:
    """(line from 0, column from 1) of the first ``token`` in JSON ``text`` outside its strings: the document parsed
    up to it, so the first one outside a string is the one refused."""
    for match in re.finditer(rf'"(?:[^"\\]|\\.)*"|({token})', text):
        if match.group(1) is not None:
            start = match.start(1)
            return text.count("\n", 0, start), start - (text.rfind("\n", 0, start) + 1) + 1
    return 0, 1


class _RepeatedKey(ValueError):
    """A JSON object that writes ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each written once: Python's json keeps the last of a repeated key without a word,
    so ``{"answer": "2", "answer": "3"}`` would train on the gold answer 3 whatever the writer meant."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen[key] = value
    return seen


def _second_key(text: str, key: str) -> tuple[int, int]:
    """(line from 0, column from 1) where an object of JSON ``text`` writes ``key`` a second time: its objects'
    keys followed through the text (the hook that finds the repeat is not told where it is)."""
    objects: list[set[str] | None] = []  # one entry per open object (its keys so far) or list (None)
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"(\s*:)?|[{}\[\]]', text):
        token = match.group()
        if token in "{[":
            objects.append(set() if token == "{" else None)
        elif token in "}]":
            if objects:
                objects.pop()
        elif match.group(1) and objects and objects[-1] is not None:
            name = json.loads(token[: len(token) - len(match.group(1))])
            if name == key and name in objects[-1]:
                start = match.start()
                return text.count("\n", 0, start), start - (text.rfind("\n", 0, start) + 1) + 1
            objects[-1].add(name)
    return 0, 1


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any, where: str = "") -> tuple[str, str] | None:
    """(the key path, the code point) of the first text in ``value`` holding a lone surrogate: JSON's ``\\ud800``
    escape decodes to half of a UTF-16 pair, which is no character, and a tokenizer fails on it with a TypeError."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return (where, f"\\u{ord(found.group()):04x}") if found else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        inner = _lone_surrogate(item, f"{where}.{key}" if where and isinstance(key, str) else
                                f"{where}[{key}]" if where else str(key))
        if inner is not None:
            return inner
    return None


def _json_value(text: str, path: Path, line: int, field: str) -> Any:
    value = _parsed_json(text, path, line, field)
    if "\\u" not in text:  # only an escape writes a lone surrogate in UTF-8 text
        return value
    items = enumerate(value) if isinstance(value, list) else [(None, value)]
    try:
        for item, row in items:
            lone = _lone_surrogate(row)
            if lone is not None:
                where, point = lone
                lines = text.count("\n", 0, max(text.lower().find(point), 0))
                place = "" if item is None else f" item {item} (items count from 0)"
                raise UserError(f"{field}: {path} line {line + lines}{place} field {where!r} holds {point}, half of "
                                "a UTF-16 surrogate pair and no character; write the whole pair or the character")
    except RecursionError:
        raise UserError(f"{field}: {path} line {line} nests JSON too deeply") from None
    return value


def _parsed_json(text: str, path: Path, line: int, field: str) -> Any:
    try:
        # Python's json reads the bare NaN / Infinity / -Infinity of no JSON standard: refused as what they are
        return json.loads(text, parse_float=WrittenNumber, parse_int=_integer, parse_constant=_not_json,
                          object_pairs_hook=_unique_keys)
    except _RepeatedKey as exc:
        lines, column = _second_key(text, exc.key)
        raise UserError(f"{field}: {path} line {line + lines} has the key {exc.key!r} twice in one object (again at "
                        f"column {column}); which one is meant is not known, so the file is refused") from None
    except _Unreadable as exc:
        lines, column = _where(text, exc.token)
        raise UserError(f"{field}: {path} line {line + lines} {str(exc).format(column=column)}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{field}: {path} line {line + exc.lineno - 1} is not valid JSON ({exc.msg} at column "
                         f"{exc.colno})") from None
    except RecursionError:
        raise UserError(f"{field}: {path} line {line} nests JSON too deeply") from None


def _record(value: Any, path: Path, where: str, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"{field}: {path} {where} is a JSON {type(value).__name__}, not an object of fields")
    return value


def read_jsonl(path: Path, field: str = "task.path") -> Rows:
    """Read line by line: the memory a file takes is its rows', not its text's three times over (bytes, text, lines)."""
    _check_size(path, field)
    rows, places = [], []
    with open(path, "rb") as handle:
        for number, data in enumerate(handle, start=1):  # each line without its newline, as a split reads it
            line = _decode_line(data[:-1] if data.endswith(b"\n") else data, path, number, field)
            if line.strip():
                rows.append(_record(_json_value(line, path, number, field), path, f"line {number}", field))
                places.append(f"line {number}")
    return Rows(rows, places)


def _decode_line(data: bytes, path: Path, number: int, field: str) -> str:
    bom = b"\xef\xbb\xbf" if number == 1 and data.startswith(b"\xef\xbb\xbf") else b""
    try:
        return data[len(bom):].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{field}: {path} line {number} is not UTF-8 text (byte 0x{data[len(bom) + exc.start]:02x} "
                         f"at column {exc.start + 1}); re-save the file as UTF-8") from None


# Rows are held in memory (a run draws from all of them), about five times a file's size for short rows (a 256 MiB
# jsonl of 440-byte rows peaked at 1.3 GB read line by line): a data file past this many MiB is refused before it is
# read. MMRL_MAX_DATA_MB raises or lowers it.
DEFAULT_MAX_DATA_MB = 256


def max_data_bytes() -> int:
    text = os.environ.get("MMRL_MAX_DATA_MB", "").strip()
    if not text:
        return DEFAULT_MAX_DATA_MB << 20
    if not text.isdigit() or int(text) == 0:
        raise UserError(f"MMRL_MAX_DATA_MB must be a whole number of MiB > 0, got {text!r}")
    return int(text) << 20


def _check_size(path: Path, field: str) -> None:
    size, limit = path.stat().st_size, max_data_bytes()
    if size > limit:
        raise UserError(f"{field}: {path} is {size / 2**20:.0f} MiB, more than the {limit >> 20} MiB a data file may "
                         f"be (its rows are held in memory, which takes up to about five times the file's size); keep "
                         f"the rows the run needs in a smaller file, or raise MMRL_MAX_DATA_MB")


def read_json(path: Path, field: str = "task.path") -> Rows:
    """A list of objects, or an object of equal-length columns."""
    _check_size(path, field)
    data = _json_value(_decode(path.read_bytes(), path, field), path, 1, field)
    if isinstance(data, list):
        places = [f"item {i} (items count from 0)" for i in range(len(data))]
        return Rows([_record(row, path, place, field) for row, place in zip(data, places, strict=True)], places)
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise UserError(f"{field}: {path} holds columns of different lengths {sorted(lengths)}")
        return _counted([dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)])
    raise UserError(f"{field}: {path} must hold a JSON list of objects or an object of columns")


def read_csv(path: Path, field: str = "task.path") -> Rows:
    _check_size(path, field)
    reader = csv.reader(io.StringIO(_decode(path.read_bytes(), path, field), newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return Rows([], [])
    except csv.Error as exc:
        raise UserError(f"{field}: {path} line 1 is not valid CSV ({exc})") from None
    if len(set(header)) != len(header) or any(not h.strip() for h in header):
        raise UserError(f"{field}: {path} line 1: the header has empty or repeated column names {header}")
    rows, places = [], []
    while True:
        first_line = reader.line_num + 1  # a quoted cell may span lines: the record starts after the last one read
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise UserError(f"{field}: {path} line {reader.line_num} is not valid CSV ({exc})") from None
        if not cells:
            continue
        if len(cells) > len(header):
            raise UserError(f"{field}: {path} line {first_line} has {len(cells)} cells, the header "
                             f"{len(header)}")
        cells += [""] * (len(header) - len(cells))
        rows.append({h: (c if c != "" else None) for h, c in zip(header, cells, strict=True)})
        places.append(f"line {first_line}")
    return Rows(rows, places)


def read_parquet(path: Path, field: str = "task.path") -> Rows:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_size(path, field)
    try:
        table = pq.read_table(path)
        rows = table.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{field}: {path} is not a readable parquet file ({str(exc).splitlines()[0]})") from None
    # a float32 cell comes out of arrow widened to a Python float (0.1 as 0.10000000149011612): read as its float32
    narrow = {f.name: f.type.to_pandas_dtype() for f in table.schema
              if pa.types.is_float32(f.type) or pa.types.is_float16(f.type)}
    return _counted([{key: _positional(value, narrow.get(key)) for key, value in row.items()} for row in rows])


def _positional(value: Any, narrow: Any = None) -> Any:
    """A parquet float as the shortest decimal that reads back as it (``narrow``: the numpy float32 or float16 type
    of its column, read back as that), without an exponent: Python prints 0.00001 as ``1e-05``, which a verifier of
    math answers reads as 1·e - 5. Anything else, and NaN or infinity, unchanged."""
    if type(value) is not float or not math.isfinite(value):
        return value
    if narrow is not None:
        text = str(narrow(value))  # numpy's shortest text that reads back as the same float32 / float16
        return WrittenNumber(f"{Decimal(text):f}" if "e" in text else text)
    if "e" not in repr(value):
        return value
    return WrittenNumber(f"{Decimal(repr(value)):f}")


READERS = {".jsonl": read_jsonl, ".json": read_json, ".csv": read_csv, ".parquet": read_parquet}


def check_sources(path: str, eval_path: str, max_samples: int) -> None:
    """The checks of a task's ``path``, ``eval_path`` and ``max_samples`` before any data is read. The held-out file
    must be another file than the training one (any spelling of it: ``../data/x.jsonl``): evaluating on the training
    rows would report memorisation as accuracy. A hub id may name itself twice, for its train and test splits."""
    if max_samples < 0:
        raise UserError(f"task.max_samples must be >= 0 (0 reads every row), got {max_samples}")
    if not eval_path:
        return
    train, held_out = (Path(expand_path(f, p)) for f, p in (("task.path", path), ("task.eval_path", eval_path)))
    if train.exists() and held_out.exists() and train.resolve() == held_out.resolve():
        raise UserError(f"task.eval_path: {eval_path!r} is the training file task.path {path!r}; a held-out set "
                         "must be other rows (or leave task.eval_path empty to hold out task.eval_fraction)")


def load_rows(source: str, split: str = "train", field: str = "task.path") -> Rows:
    """Rows of a local file (jsonl/json/parquet/csv) as written, or of a hub dataset ``split`` (needs network or a
    local cache). ``field`` is the option that named ``source`` (``task.eval_path``, ...); every error names it, so a
    bad held-out file is not reported as the training file."""
    path = Path(expand_path(field, source))
    if path.suffix in LOCAL_SUFFIXES or path.exists():
        if not path.exists():
            raise UserError(f"{field}: no such file {str(path)!r}")
        if path.suffix not in READERS:
            raise UserError(f"{field}: {str(path)!r} is not one of {', '.join(LOCAL_SUFFIXES)}")
        if not path.is_file():
            raise UserError(f"{field}: {str(path)!r} is not a file")
        rows = READERS[path.suffix](path, field)
        rows.field = field
        return rows
    import datasets

    from mmrl.hub import cached_snapshot, hub_reachable, offline_by_env

    if not offline_by_env() and not hub_reachable():  # offline: the cached copy or one line, not 30 s of retries
        snapshot = cached_snapshot(source, repo_type="dataset")
        if snapshot is None:
            raise UserError(f"{field}: {source!r} is not a local file, and the Hugging Face hub does not answer "
                             f"(offline?) and has no cached copy of it")
        source = snapshot
    try:
        rows = _counted(list(datasets.load_dataset(source, split=split)))
    except Exception as exc:  # noqa: BLE001 -- turned into one clear line naming the field
        raise UserError(f"{field}: cannot load dataset {source!r} split {split!r} "
                         f"(a hub id needs network access): {type(exc).__name__}: {exc}") from exc
    rows.field = field
    return rows
