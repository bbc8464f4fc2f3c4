"""The package's shape: no import circle, and docs/design.md's module map matches the tree.

Imports are read with the standard library's ``ast`` (nothing is imported): every
``import``/``from … import`` in a module counts, those inside functions too (a deferred import
hides a circle, it does not remove one), except under ``if TYPE_CHECKING:``, which never runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"


def module_names(root: Path, package: str) -> dict[str, Path]:
    """``{dotted name: file}`` for every module of ``package`` under ``root``."""
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Which of the package's modules each module imports (by dotted name)."""
    modules = module_names(root, package)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from a import b`: b is a module of a, or a name defined in a.
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            deps |= {m for t in targets if (m := known(t)) and m != name}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_repro_has_no_import_circle():
    circles = cycles(import_graph(REPO, "repro"))
    assert not circles, "import circles (each line one circle of modules):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


@pytest.mark.parametrize(
    "files, circle",
    [
        (  # a deferred import inside a function is a circle all the same
            {"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import a\n"},
            [["pkg.a", "pkg.b"]],
        ),
        ({"a.py": "from . import b\n", "b.py": "from .a import x\n"}, [["pkg.a", "pkg.b"]]),
        (  # only for the type checker: never imported at run time
            {
                "a.py": "import pkg.b\n",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
            },
            [],
        ),
    ],
    ids=["deferred", "relative", "type-checking"],
)
def test_the_circle_finder_finds_circles(tmp_path, files, circle):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
    assert cycles(import_graph(tmp_path, "pkg")) == circle


# --- docs/design.md's module map -----------------------------------------------------------


def _map_entries() -> dict[str, str]:
    """``{path: entry}`` of the module map: items ``- `repro/…py` …`` (continued on indented
    lines) under its heading."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    items = re.finditer(r"^- `([\w/]+\.py)`(.*(?:\n  .*)*)", section, re.M)
    return {m[1]: " ".join(m[2].split()) for m in items}


def test_the_module_map_names_every_module_once_and_no_other():
    tree = {p.relative_to(REPO).as_posix() for p in (REPO / "repro").rglob("*.py")}
    listed = _map_entries()
    assert sorted(tree - set(listed)) == [], "modules missing from docs/design.md's module map"
    assert sorted(set(listed) - tree) == [], "docs/design.md maps modules the tree lacks"
    text = DESIGN.read_text(encoding="utf-8").split("## Module map", 1)[1]
    for path in listed:
        assert text.count(f"- `{path}`") == 1, f"{path} is listed more than once"


MAX_MODULE_LINES = 400


def test_a_module_over_400_lines_says_why_in_the_design_notes():
    over = {
        p.relative_to(REPO).as_posix(): n
        for p in (REPO / "repro").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    entries = _map_entries()
    unexplained = {
        path: lines for path, lines in over.items() if "over 400 lines:" not in entries[path]
    }
    assert not unexplained, (
        f"modules over {MAX_MODULE_LINES} lines whose module-map line gives no reason "
        f"('over 400 lines: …'): {unexplained}"
    )


# The kit's documents and tests; ``tests/v1/…`` is upstream vLLM's test tree (the kit's is flat).
CITED_FILE = re.compile(r"(?<![\w/])(docs/[\w-]+\.md|tests/(?!v1/)[\w/-]+\.py)")
CITED_SECTION = re.compile(r"\b(docs/[\w-]+\.md),? §([^\n`]+)")


def _cited_in() -> list[Path]:
    return [*(REPO / "repro").rglob("*.py"), *(REPO / "tests").rglob("*.py"), REPO / "noxfile.py"]


def test_code_cites_no_document_the_repository_lacks():
    """Citations point into the project (docs/, tests/ …), upstream vLLM, or nothing; a cited
    section (``docs/measured.md, §GPU hosts``) is a heading of that document."""
    missing = []
    for path in _cited_in():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            if "ARCHITECTURE" + ".md" in line:
                missing.append(f"{where}: a document the repository never had")
            for target in CITED_FILE.findall(line):
                if not (REPO / target).exists():
                    missing.append(f"{where}: {target}")
            for doc, rest in CITED_SECTION.findall(line):
                headings = re.findall(r"^#+ (.+)$", (REPO / doc).read_text(encoding="utf-8"), re.M)
                if not any(rest.startswith(h) for h in headings):
                    missing.append(f"{where}: {doc} has no section {rest!r}")
    assert not missing, "citations of what the repository does not have:\n" + "\n".join(missing)


# --- layers (docs/design.md, §Layers) ------------------------------------------------------

OUTSIDE_ENGINE = ("repro.arms", "repro.runner", "repro.evidence", "repro.fanout", "repro.cli")


def _imports_of(package: str) -> dict[str, set[str]]:
    graph = import_graph(REPO, "repro")
    return {name: deps for name, deps in graph.items() if name.startswith(package)}


def test_core_imports_nothing_of_the_kit_outside_core():
    leaks = {
        name: sorted(d for d in deps if not d.startswith("repro.core") and d != "repro")
        for name, deps in _imports_of("repro.core").items()
    }
    assert not {name: deps for name, deps in leaks.items() if deps}


def test_the_engine_package_imports_no_arm_runner_evidence_fanout_or_cli():
    leaks = {
        name: sorted(d for d in deps if d.startswith(OUTSIDE_ENGINE))
        for name, deps in _imports_of("repro.engine").items()
    }
    assert not {name: deps for name, deps in leaks.items() if deps}
