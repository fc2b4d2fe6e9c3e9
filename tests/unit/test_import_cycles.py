"""No module of the operator imports itself back through others, counting imports made only for
type checking: a circle hides which module is the lower one, and import-linter's layer contracts
only see circles that cross layers."""

from __future__ import annotations

import grimp


def cycles(package: str) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), every import counted."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.find_modules_directly_imported_by(module)):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_operator_has_no_import_circle() -> None:
    assert cycles("kimik3_operator") == []


def test_the_check_finds_a_circle(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n")
    (package / "b.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles("circled") == [["circled.a", "circled.b"]]
