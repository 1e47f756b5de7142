"""Helpers the test files share (pytest puts tests/ on sys.path)."""


def rel_err(a, b):
    """||a - b|| / ||b||, in float64; NaN anywhere gives NaN, which no `< bound` passes."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()
