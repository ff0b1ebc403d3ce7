"""The type stubs describe the module as built: every public name, class member and parameter."""

import ast
import inspect
import pathlib

import gpucloud
import gpucloud._core as core

STUB = pathlib.Path(gpucloud.__file__).with_name("_core.pyi")


def stub_tree():
    return ast.parse(STUB.read_text())


def public(names):
    return {n for n in names if not n.startswith("_") or n in ("__init__", "__dlpack__", "__dlpack_device__")}


def test_stub_ships_with_the_package():
    assert STUB.is_file()
    assert (STUB.parent / "py.typed").is_file()


def test_every_public_name_is_declared():
    declared = {node.name for node in stub_tree().body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    declared |= {node.target.id for node in stub_tree().body if isinstance(node, ast.AnnAssign)}  # constants
    declared = {n for n in declared if not n.startswith("_")}
    runtime = {n for n in dir(core) if not n.startswith("_")}
    assert runtime - declared == set(), "regenerate with scripts/gen-stubs.py"
    assert declared - runtime == set()


def test_class_members_and_parameters_match():
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            params = [a.arg for a in node.args.args + node.args.kwonlyargs]
            doc = getattr(core, node.name).__doc__
            for p in params:
                assert f"{p}:" in doc, f"{node.name}: parameter {p} is not in the binding's signature"
        if not isinstance(node, ast.ClassDef) or issubclass(getattr(core, node.name), BaseException):
            continue
        cls = getattr(core, node.name)
        declared = public(n.name for n in node.body if isinstance(n, ast.FunctionDef))
        declared |= {t.id for n in node.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
        runtime = public(name for name, _ in inspect.getmembers(cls) if name in cls.__dict__)
        if not (cls.__init__.__doc__ or "").startswith("__init__("):  # no constructor bound
            runtime.discard("__init__")
        missing = runtime - declared - {"__members__", "name", "value"}
        assert missing == set(), f"{node.name}: {missing} not in the stub; regenerate with scripts/gen-stubs.py"
