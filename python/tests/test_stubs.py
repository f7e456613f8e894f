"""The shipped type stubs name exactly what the extension module defines, and
every public name of the package resolves."""

import ast
import pathlib

import refit
from refit import _native

STUB = pathlib.Path(refit.__file__).with_name("_native.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and node.target.id != "Triple":
            top.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            top.add(node.name)
            names = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    names.add(item.target.id)
            members[node.name] = names
    return top, members


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


CUDA_ONLY = {"GpuApplyReport", "apply_cuda", "range_hashes_cuda"}


def test_stub_matches_module():
    top, members = stub_names()
    if not _native.has_cuda:
        top -= CUDA_ONLY
    assert top == public(_native)
    for cls, names in members.items():
        if cls in public(_native):
            assert names == public(getattr(_native, cls)), cls


def test_package_exports_resolve():
    for name in refit.__all__:
        assert getattr(refit, name) is not None, name
    assert (pathlib.Path(refit.__file__).with_name("py.typed")).exists()
