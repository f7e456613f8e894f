"""The self-contained examples of docs/python.md run as printed."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def runnable_blocks():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    # Self-contained blocks set up their inputs from the fixtures.
    return [b for b in blocks if "FIX = " in b]


def test_doc_examples_run(qwen, monkeypatch):
    monkeypatch.setenv("REFIT_FIXTURES_DIR", str(qwen.parent))
    blocks = runnable_blocks()
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
