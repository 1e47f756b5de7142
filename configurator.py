"""
train.py's configurator, as nanoGPT's: config files (Python assignments; they may read the settings)
in argv's order, then --key=value overrides (Python literals; a bare word is a string).
"""

import ast
import difflib
import os
import sys
import traceback

from prepare.common import utf8


def configure(argv, defaults, doc=""):
    """(cfg, the keys argv set). A value takes its default's type (an int for a float is fine);
    an unknown key is an error naming the nearest; --help prints doc and every key."""
    cfg = dict(defaults)
    given = set()

    def set_key(key, val, where):
        if key not in defaults:
            near = difflib.get_close_matches(key, defaults, n=3)
            fix = f"did you mean {' or '.join(near)}?" if near else "--help lists the keys"
            sys.exit(f"error: unknown config key '{key}' ({where}); {fix}")
        want = type(defaults[key])
        if want is float and type(val) is int:
            val = float(val)
        if type(val) is not want:
            sys.exit(f"error: config key '{key}' ({where}) must be {want.__name__}, got {val!r}")
        cfg[key] = val
        given.add(key)

    for arg in sorted(argv, key=lambda a: a.startswith("--")):  # the config files first
        if arg in ("-h", "--help"):
            print(doc)
            print("settings (--key=value) and their defaults:")
            for k, v in defaults.items():
                print(f"  --{k}={v!r}")
            sys.exit(0)
        if arg.startswith("--"):
            key, eq, val = arg[2:].partition("=")
            if not eq:
                sys.exit(f"error: expected --key=value, got {arg}")
            try:
                val = ast.literal_eval(val)
            except (SyntaxError, ValueError):
                pass  # a bare string, e.g. --dataset=jsb
            set_key(key, val, arg)
        else:  # a config file
            if not os.path.isfile(arg):
                sys.exit(f"error: config file {arg} not found (configs live in config/)")
            with open(arg, "rb") as f:
                text = utf8(f.read(), arg)
            scope = dict(cfg)  # one namespace: comprehensions see the settings
            try:
                tree = ast.parse(text, arg)
                exec(compile(tree, arg, "exec"), scope)
            except Exception as e:  # a syntax error, or one the file raises: one line, where it is
                tb = traceback.extract_tb(e.__traceback__)
                lines = [t.lineno for t in tb if t.filename == arg]
                line = lines[-1] if lines else getattr(e, "lineno", "?")
                sys.exit(f"error: config file {arg}, line {line}: {type(e).__name__}: {e}; fix it")
            for node in ast.walk(tree):  # the names it assigns
                stored = isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
                if stored and node.id in scope and not node.id.startswith("_"):
                    set_key(node.id, scope[node.id], arg)
    return cfg, given
