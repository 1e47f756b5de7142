"""Helpers the test files share (pytest puts tests/ on sys.path)."""
import contextlib
import io

import pytest


def rel_err(a, b):
    """||a - b|| / ||b||, in float64; NaN anywhere gives NaN, which no `< bound` passes."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run_exit(main, args):
    """main(args) of a script, which must exit: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main([str(a) for a in args])
    return e.value.code, out.getvalue(), err.getvalue()


def script_error(main, args):
    """The line 'error: ...' that main(args) ends with: prepare.common.die's, the last line on stderr (notes
    may come before it), with exit status 2 and no traceback (both asserted)."""
    code, _, err = run_exit(main, args)
    line = err.rstrip("\n").split("\n")[-1]
    assert code == 2 and line.startswith("error: ") and "Traceback" not in err, (code, err)
    return line


def script_help(main):
    """main(["--help"])'s text, with exit status 0 (asserted)."""
    code, out, _ = run_exit(main, ["--help"])
    assert code == 0, code
    return out
