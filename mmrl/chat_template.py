"""A model folder's chat template, rendered once in a child process under a time and memory bound before it is used.

A chat template is a program that comes with the model (Jinja, run in transformers' sandbox). The sandbox refuses
attribute escapes and caps ``range()`` at 100,000 items, but it bounds neither time nor memory: two nested loops
under the cap ran for minutes, and a refused escape or an oversized ``range()`` surfaced as a ``SecurityError`` or
``OverflowError`` traceback wherever the template was first rendered. So the template of every model mmrl does not
ship is first rendered on a one-turn chat by ``python -m mmrl.chat_template``, a fresh interpreter (not a
``multiprocessing`` child, which would re-run the caller's script), with at most `SECONDS` of rendering and
`MEMORY_BYTES` more memory than its imports took; a template that fails there, or runs out of either, is refused in
one line naming its file. The same template renders in the run for every prompt, so a template that passes here
renders the run's chats in the time such a chat takes.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from mmrl.errors import UserError

SECONDS = 10  # a real template renders a chat in milliseconds
MEMORY_BYTES = 1 << 30
PROBE = [{"role": "user", "content": "What is 2 + 3?"}]
# where transformers reads a template from, in its order of preference
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def template_file(where: str) -> str:
    """The file of a model folder that holds its chat template, for an error to name (a hub id: the id)."""
    folder = Path(where)
    for name in TEMPLATE_FILES:
        if (folder / name).is_file():
            return str(folder / name)
    return f"the chat template of {where}"


def check_tokenizer_template(tokenizer: Any, where: str) -> None:
    """Refuse, in one line naming the file, a chat template of ``tokenizer`` (loaded from ``where``) that does not
    render a one-turn chat within the bounds (the module's docstring)."""
    templates = getattr(tokenizer, "chat_template", None)
    if not templates:
        return
    named = templates if isinstance(templates, dict) else {"": templates}
    special = {key: value for key, value in getattr(tokenizer, "special_tokens_map", {}).items()
               if isinstance(value, str)}
    for name, template in named.items():
        problem = _probe(template, json.dumps(special, sort_keys=True), SECONDS)
        if problem:
            which = f" (template {name!r})" if name else ""
            raise UserError(f"model: {template_file(where)}{which}: its chat template is refused: {problem}")


@functools.lru_cache(maxsize=16)
def _probe(template: str, special: str, seconds: int) -> str:
    """"" if ``template`` renders `PROBE` in a child within ``seconds`` and `MEMORY_BYTES`, else why not (one line)."""
    request = json.dumps({"template": template, "special": json.loads(special), "seconds": seconds})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:  # the child's own alarm bounds the rendering; this bounds its start and a render stuck in native code
        done = subprocess.run([sys.executable, "-m", "mmrl.chat_template"], input=request, env=env,
                              capture_output=True, text=True, encoding="utf-8", timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        return f"it did not finish rendering a one-turn chat in {seconds + 120} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"rendering it stopped the process that tried ({last[:200]})"
    return json.loads(lines[-1])["problem"]


def _render(template: str, special: dict[str, str], seconds: int) -> str:
    """The child's side: render ``template`` on `PROBE`; "" or the reason it failed."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        usage = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        usage = None
    if usage is not None:  # the imports' memory and no more than MEMORY_BYTES on top
        resource.setrlimit(resource.RLIMIT_AS, (usage + MEMORY_BYTES, resource.RLIM_INFINITY))

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        render_jinja_template(conversations=[PROBE], chat_template=template, add_generation_prompt=True, **special)
    except TimeoutError:
        return f"it did not finish rendering a one-turn chat in {seconds} s"
    except MemoryError:
        return f"rendering a one-turn chat took more than {MEMORY_BYTES >> 20} MiB"
    except RecursionError:
        return "rendering a one-turn chat recursed too deeply"
    except Exception as exc:  # noqa: BLE001 -- whatever the template raised is its failure, reported in one line
        text = " ".join(str(exc).split())[:200]
        return f"rendering a one-turn chat failed: {type(exc).__name__}: {text}"
    finally:
        signal.alarm(0)
    return ""


def _main() -> None:
    request = json.loads(sys.stdin.read())
    answer, sys.stdout = sys.stdout, sys.stderr  # what the template or transformers prints is not the answer
    problem = _render(request["template"], request["special"], int(request["seconds"]))
    answer.write(json.dumps({"problem": problem}) + "\n")
    answer.flush()


if __name__ == "__main__":
    _main()
