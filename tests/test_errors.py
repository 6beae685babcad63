"""Bad input is one line and exit code 2; a bug (any other exception, a plain ValueError included) keeps its traceback;
``MMRL_DEBUG=1`` shows the traceback of bad input too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import mmrl.train
from mmrl.errors import UserError


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_a_bad_flag_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("MMRL_DEBUG", raising=False)
    assert mmrl.train.main(["--rollout.temperature", "warm"]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "rollout.temperature" in err and "Traceback" not in err, err


def test_mmrl_debug_shows_the_traceback_of_a_user_error(capsys, monkeypatch):
    monkeypatch.setenv("MMRL_DEBUG", "1")
    assert mmrl.train.main(["--rollout.temperature", "warm"]) == 2  # the exit code does not change with the switch
    err = capsys.readouterr().err
    assert "Traceback" in err and "UserError" in err and len(error_lines(err)) == 1, err


def test_a_plain_value_error_during_a_run_is_not_taken_for_bad_input(monkeypatch, tmp_path):
    def broken(cfg):
        raise ValueError("math domain error")  # what a bug deep in a library looks like

    monkeypatch.setattr("mmrl.trainer.local.train", broken)
    with pytest.raises(ValueError, match="math domain error") as raised:
        mmrl.train.main(["--steps", "1", "--out", str(tmp_path / "run")])
    assert not isinstance(raised.value, UserError)


def test_a_value_error_in_a_user_task_plug_in_keeps_its_traceback(tmp_path):
    """A real process: a task registered by the user whose code raises ValueError ends with the traceback that
    points at the plug-in, exit code 1, and no one-line ``error:`` that would hide where it came from."""
    script = tmp_path / "run_with_plugin.py"
    script.write_text(textwrap.dedent("""
        import sys

        from mmrl.tasks import register_task
        from mmrl.train import main


        @register_task("broken_plugin")
        def broken_plugin():
            return int("not a number")  # a bug in the user's own code: ValueError


        sys.exit(main(sys.argv[1:]))
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MMRL_DEBUG", None)
    done = subprocess.run([sys.executable, str(script), "--task", "broken_plugin", "--steps", "1",
                           "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" in done.stderr and "broken_plugin" in done.stderr and "ValueError" in done.stderr, done.stderr
    assert not error_lines(done.stderr), done.stderr
