"""Text rewards: answer extraction, math accuracy through math-verify, and the think/answer format."""

from __future__ import annotations

import logging
import re
import threading
from decimal import Decimal

from mmrl.rewards.base import Sample, reward
from mmrl.rewards.verifier_process import IsolatedVerifier

THINK_ANSWER = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
THINK_CLOSE = "\n</think>\n"  # Open-RS's format check: the closing tag on a line of its own
VERIFY_SECONDS = 5  # math-verify's own bound on parsing and on verifying
MAX_ANSWER_CHARS = 1000  # math-verify is super-linear on long inputs; a longer "answer" is not an answer


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def final_answer(text: str) -> tuple[str | None, str | None]:
    """(the final answer of a completion, why there is none): the ``<answer>`` block's content (its ``\\boxed{}``
    if it holds one), else the last ``\\boxed{}`` of the text (verl's and OpenRLHF's rule for free-form reasoning).

    Two ``<answer>`` blocks, or two ``\\boxed{}`` in the one block, give no answer: a completion that lists several
    answers would otherwise be paid whenever one of them (the last, or the first) is right, a reward a policy learns
    to exploit by listing candidates."""
    tags = ANSWER_TAG.findall(text)
    if len(tags) > 1:
        return None, f"{len(tags)} <answer> tags: one answer is scored"
    if tags:
        inner = tags[0].strip()
        if inner.count("\\boxed") > 1:
            return None, "several \\boxed{} in the <answer>: one answer is scored"
        answer = extract_boxed(inner) or inner
    else:
        answer = extract_boxed(text)
    if answer is None or not answer.strip():
        return None, "no <answer> or \\boxed{} in completion"
    return answer, None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion (:func:`final_answer`), or None."""
    return final_answer(text)[0]


# A plain decimal number with an exponent, alone (``1e3``, ``-1.5E-2``, ``$1e-05$``; a parquet or JSON float prints
# so). math-verify reads the e as Euler's number (``1e3`` is 3·e, so ``1000`` scored 0 and ``3e`` scored 1), so both
# sides are rewritten as the decimal they write before verifying. ``2e``, ``e^{2}``, ``3e-x`` are not such numbers.
E_NUMBER = re.compile(r"\s*\$?\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)[eE][+-]?\d{1,6})\s*\$?\s*")
MAX_PLAIN_DIGITS = 100  # beyond this many digits an e-number is written as m \times 10^{k} instead


def plain_number(text: str) -> str:
    """``"1e3"`` -> ``"1000"``, ``"1e-05"`` -> ``"0.00001"``, ``"$1.5E+2$"`` -> ``"150"``; ``"1e400"`` ->
    ``"$1\\times10^{400}$"``; any other text unchanged."""
    match = E_NUMBER.fullmatch(text)
    if not match:
        return text
    value = Decimal(match.group(1))
    if abs(value.adjusted()) > MAX_PLAIN_DIGITS:
        mantissa, exponent = f"{value:e}".split("e")
        return f"${mantissa}\\times10^{{{int(exponent)}}}$"
    return f"{value.normalize():f}"


def _normalise(s: str) -> str:
    return re.sub(r"\s+", "", s).rstrip(".").strip("$").lower()


def answers_match(predicted: str, gold: str) -> tuple[bool, str | None]:
    """math-verify equivalence with an exact-match fast path, numbers in e-notation read as the decimals they write
    (:func:`plain_number`). Never raises; returns (match, reason if not)."""
    if len(predicted) <= MAX_ANSWER_CHARS:
        predicted, gold = plain_number(predicted), plain_number(gold)
    if _normalise(predicted) == _normalise(gold):
        return True, None
    if len(predicted) > MAX_ANSWER_CHARS:
        return False, f"answer longer than {MAX_ANSWER_CHARS} characters"
    if threading.current_thread() is threading.main_thread():
        return math_verify_match(predicted, gold)
    return _off_main_thread_verifier()(predicted, gold)


_VERIFIER_LOCK = threading.Lock()
_VERIFIERS: list[IsolatedVerifier] = []  # at most one per process, started on the first call off the main thread


def _off_main_thread_verifier() -> IsolatedVerifier:
    # math-verify's timeouts use signal.alarm, which works only on the main thread: elsewhere it runs in a child
    # process that is killed when it overruns (mmrl/rewards/verifier_process.py). The bound covers its three timed
    # steps (two parses, the verify) and the child's start on the first call.
    with _VERIFIER_LOCK:
        if not _VERIFIERS:
            _VERIFIERS.append(IsolatedVerifier(math_verify_match, timeout=3 * VERIFY_SECONDS + 15))
        return _VERIFIERS[0]


class _Timeouts(logging.Handler):
    """Counts math-verify's own reports of a timed-out parse or comparison, which it ends as a no-match (a parse as
    [], a comparison as False) and says so only in a log warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Timeout during"):
            self.count += 1


def math_verify_match(predicted: str, gold: str) -> tuple[bool, str | None]:
    """math-verify's parse and verify, each bounded by ``VERIFY_SECONDS``; call it on a main thread. A step that
    runs out of time scores 0 with a reason that says so, not as a wrong answer."""
    from math_verify import parse, verify  # imported lazily: it pulls sympy and antlr

    timeout = VERIFY_SECONDS
    timeouts, logger = _Timeouts(), logging.getLogger("math_verify")
    logger.addHandler(timeouts)
    try:
        gold_parsed = parse(gold if "$" in gold or "\\" in gold else f"${gold}$", parsing_timeout=timeout)
        pred_parsed = parse(predicted if "$" in predicted or "\\" in predicted else f"${predicted}$",
                            parsing_timeout=timeout)
        ok = bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    finally:
        logger.removeHandler(timeouts)
    if ok:
        return True, None
    if timeouts.count:
        return False, f"math-verify timed out ({timeout} s per step), so the answer was not judged"
    if not gold_parsed:
        return False, f"gold answer {gold!r} could not be parsed"
    if not pred_parsed:
        return False, f"answer {predicted[:60]!r} could not be parsed"
    return False, "answer is wrong"


def _answer_and_gold(completion: str, sample: Sample) -> tuple[str | None, str]:
    return extract_answer(completion), str(sample.get("answer", "")).strip()


@reward("math_accuracy", 0.0, 1.0, same_score=_answer_and_gold)
def math_accuracy(completion: str, sample: Sample) -> tuple[float, str | None]:
    """1 if the completion's final answer is mathematically equal to ``sample['answer']`` (math-verify), else 0."""
    gold = str(sample.get("answer", "")).strip()
    if not gold:
        return 0.0, "sample has no answer"
    predicted, why = final_answer(completion)
    if predicted is None:
        return 0.0, why
    ok, why = answers_match(predicted.strip(), gold)
    return (1.0, None) if ok else (0.0, why)


@reward("think_answer_format", 0.0, 1.0)
def think_answer_format(completion: str, sample: Sample) -> tuple[float, str | None]:
    """1 if the completion is exactly ``<think>…</think><answer>…</answer>`` (R1 format), else 0."""
    m = THINK_ANSWER.match(completion)
    if not m:
        return 0.0, "not <think>...</think><answer>...</answer>"
    if "<think>" in m.group(2) or "<answer>" in m.group(2):
        return 0.0, "nested tags"
    return 1.0, None


@reward("think_close_format", 0.0, 1.0)
def think_close_format(completion: str, sample: Sample) -> tuple[float, str | None]:
    """1 if the completion closes its reasoning with exactly one ``\\n</think>\\n``, else 0.

    The format reward of Open-RS (``src/open_r1/rewards.py``, ``format_reward``) that CW-GRPO's App. C uses ("1.0
    when the output contains properly matched <think> tags"): DeepSeek-R1-Distill's chat template pre-fills
    ``<think>\\n`` after the assistant marker, so the completion holds only the closing tag, and a check for the whole
    ``<think>…</think><answer>…</answer>`` shape would score 0 on every completion of such a model.
    """
    found = completion.count(THINK_CLOSE)
    if found == 1:
        return 1.0, None
    return 0.0, f"expected one '\\n</think>\\n', found {found}"


@reward("answer_format", 0.0, 1.0)
def answer_format(completion: str, sample: Sample) -> tuple[float, str | None]:
    """1 if the completion holds exactly one non-empty ``<answer>…</answer>`` and nothing after it."""
    tags = ANSWER_TAG.findall(completion)
    if len(tags) != 1 or not tags[0].strip():
        return 0.0, f"expected one non-empty <answer> tag, found {len(tags)}"
    if "<answer>" in tags[0]:
        return 0.0, "nested tags"
    if completion.rstrip().endswith("</answer>"):
        return 1.0, None
    return 0.0, "text after </answer>"
