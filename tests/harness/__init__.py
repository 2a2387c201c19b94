"""Test harnesses shared by tests/ and bench/: `from tests.harness import crash`.

The repository root must be on sys.path (pytest's `pythonpath` setting puts it there;
`python -m bench ...` runs from it).
"""
