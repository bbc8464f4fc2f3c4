"""Where an engine process keeps its byte code (`repro.engine.bytecode`): a real Python
process imports a package laid out as the lent GPU hosts' torch is (sources, no byte code)."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

from repro import runner
from repro.engine import bytecode


def _tree(root: Path, *, compiled: bool = False) -> Path:
    """A folder with a package named torch in it, without byte code (as the lent hosts have
    theirs)."""
    package = root / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "sub.py").write_text("from torch import VALUE\nDOUBLE = 2 * VALUE\n")
    if compiled:
        init = package / "__init__.py"
        tag = sys.implementation.cache_tag
        py_compile.compile(str(init), cfile=str(package / "__pycache__" / f"__init__.{tag}.pyc"))
    return root


def _import(env: dict[str, str]) -> str:
    """`import torch.sub` in a new Python with ``env``; its verbose import log (`-v`)."""
    proc = subprocess.run(
        [sys.executable, "-v", "-c", "import torch.sub; assert torch.sub.DOUBLE == 2"],
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stderr


def test_a_torch_without_byte_code_on_a_no_write_host_compiles_once_into_the_kits_folder(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "cache"))
    site = _tree(tmp_path / "site")
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(site)}

    # As the host leaves it: nothing is written, so every process compiles again.
    _import(env)
    assert not list(tmp_path.rglob("*.pyc"))

    prefix = bytecode.apply(env, [str(site)])
    assert prefix == tmp_path / "cache" / "bytecode"
    assert env == {"PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}

    _import(env)
    # The prefix mirrors each source's absolute path.
    written = sorted(p.name for p in (prefix / site.relative_to("/") / "torch").rglob("*.pyc"))
    tag = sys.implementation.cache_tag
    assert written == [f"__init__.{tag}.pyc", f"sub.{tag}.pyc"]
    assert not (site / "torch" / "__pycache__").exists()  # the host's folders stay as they were

    # The next process reads it instead of compiling.
    second = _import(env)
    assert f"code object from '{prefix}" in second, second[-2000:]


def test_nothing_changes_where_python_may_write_torch_has_byte_code_or_the_user_chose(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "cache"))
    bare = [str(_tree(tmp_path / "bare"))]
    compiled = [str(_tree(tmp_path / "compiled", compiled=True))]
    cases = [
        ({}, bare),  # Python may write beside the sources
        ({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/theirs"}, bare),
        ({"PYTHONDONTWRITEBYTECODE": "1"}, compiled),  # byte code at hand: nothing to gain
        ({"PYTHONDONTWRITEBYTECODE": "1"}, [str(tmp_path / "empty")]),  # no torch there
    ]
    for env, path in cases:
        before = dict(env)
        assert bytecode.apply(env, path) is None, (env, path)
        assert env == before
    assert bytecode.has_bytecode("torch", bare) is False
    assert bytecode.has_bytecode("torch", compiled) is True
    assert bytecode.has_bytecode("torch", [str(tmp_path / "empty")]) is None


def test_the_engine_process_env_applies_the_rule_to_this_pythons_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "cache"))
    site = _tree(tmp_path / "site")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    env = runner.engine_process_env(
        {"PATH": "/usr/bin", "PYTHONDONTWRITEBYTECODE": "1"}, device="cuda", fault_kind=None
    )
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / "bytecode")
    assert "PYTHONDONTWRITEBYTECODE" not in env
