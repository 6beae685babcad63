"""OpenRLHF's own ``train_ppo_ray`` argument parser and checks, run on an argument list without starting anything.

OpenRLHF 0.11.2 builds its parser inside ``if __name__ == "__main__":`` of ``openrlhf/cli/train_ppo_ray.py``, then
hierarchises the namespace (``args.actor.model_name_or_path``) and validates it, and finally calls ``train(args)``.
We read that block from the installed file and execute everything but the final ``train(args)`` call, with the argument
list handed to ``parse_args``. The result is exactly the namespace OpenRLHF would train with, produced by its own code,
and an invalid combination fails with OpenRLHF's own message. Only ``argparse``/``datetime``/``os`` and
``openrlhf.utils.config`` are needed: no Ray, vLLM or CUDA.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
from pathlib import Path
from types import SimpleNamespace

from mmrl.errors import UserError

CLI_MODULE = "openrlhf.cli.train_ppo_ray"
STDLIB_IMPORTS = {"argparse", "datetime", "os"}  # the module's top-level imports the parser block uses


def cli_source() -> tuple[str, str]:
    spec = importlib.util.find_spec(CLI_MODULE) if importlib.util.find_spec("openrlhf") else None
    if spec is None or spec.origin is None:
        raise UserError("the openrlhf backend needs OpenRLHF 0.11.x: pip install openrlhf==0.11.2 (GPU) or "
                         "`make setup` (CPU tests); see docs/openrlhf.md")
    return Path(spec.origin).read_text(), spec.origin


def _main_block(tree: ast.Module, origin: str) -> list[ast.stmt]:
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__":
            return node.body
    raise UserError(f"{origin}: no `if __name__ == '__main__'` block; is this OpenRLHF 0.11.x?")


class _ArgvToParseArgs(ast.NodeTransformer):
    """``parser.parse_args()`` -> ``parser.parse_args(__argv__)``."""

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "parse_args" and not node.args:
            node.args = [ast.Name("__argv__", ast.Load())]
        return node


def parse_openrlhf_args(argv: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """(the hierarchical namespace OpenRLHF's ``train_ppo_ray`` builds and checks from ``argv``, the warnings it
    printed while checking).

    An argument OpenRLHF rejects (unknown flag, bad value, failed assertion) raises ValueError with its message.
    """
    source, origin = cli_source()
    body = _main_block(ast.parse(source, origin), origin)
    last = body[-1]
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and getattr(last.value.func, "id", None) == "train"):
        raise UserError(f"{origin}: the main block does not end with train(args); is this OpenRLHF 0.11.x?")
    tree = ast.parse(source, origin)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and {(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] for a in n.names}
               <= STDLIB_IMPORTS]
    module = ast.fix_missing_locations(_ArgvToParseArgs().visit(ast.Module(body=imports + body[:-1],
                                                                           type_ignores=[])))
    scope = {"__argv__": list(argv), "__name__": CLI_MODULE}
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            exec(compile(module, origin, "exec"), scope)  # noqa: S102 -- OpenRLHF's own, installed parser code
    except SystemExit as exc:  # argparse's error exit: keep its message
        lines = [x for x in printed.getvalue().splitlines() if x.strip()]
        raise UserError(f"OpenRLHF rejected the arguments: {lines[-1] if lines else exc}") from None
    except AssertionError as exc:
        raise UserError(f"OpenRLHF rejected the arguments: {exc}") from None
    return scope["args"], [x for x in printed.getvalue().splitlines() if x.strip()]


def check_supported(args) -> None:
    """OpenRLHF options mmrl's actor does not implement (it has its own loss and loop): refused at start."""
    if args.algo.advantage.is_correction_level != "token":
        raise UserError("--algo.advantage.is_correction_level: mmrl sets it to token so that vLLM returns its sampled "
                         "tokens' log-probs; the importance-sampling correction is mmrl's (--algo.rollout_correction)")
    if args.train.dynamic_batch_enable or args.ds.ring_attn_size > 1 or args.ds.tensor_parallel_size > 1:
        raise UserError("--train.dynamic_batch_enable / --ds.ring_attn_size / --ds.tensor_parallel_size change how "
                         "OpenRLHF forms micro-batches; mmrl's actor forms whole-group micro-batches: turn them off")
    if args.train.async_enable:
        raise UserError("--train.async_enable uses OpenRLHF's async trainer, which mmrl does not subclass")
