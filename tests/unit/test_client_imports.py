"""cluster.client is the SDK users import: it loads nothing of the server, and its modules import
each other at the top, without a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "cluster" / "client"
SERVER = ("actors", "serve_app", "ray")


def is_server(module: str) -> bool:
    top = module.split(".")[0]
    return top in SERVER or (top == "cluster" and not module.startswith("cluster.client"))


def test_importing_the_client_loads_nothing_of_the_server() -> None:
    code = "import sys, cluster.client; print(*sorted(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    assert "cluster.client.clients" in out
    assert [m for m in out if is_server(m) and m != "cluster"] == []


def test_client_modules_import_at_the_top_and_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in sorted(CLIENT.glob("*.py")):
        name = "cluster.client" + ("" if path.stem == "__init__" else f".{path.stem}")
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            else:
                continue
            assert id(node) in top_level, f"{path.name}:{node.lineno}: an import inside code"
            assert not any(is_server(t) for t in targets), f"{path.name}: imports {targets}"
            deps |= {t for t in targets if t.startswith("cluster.client.")}
        graph[name] = deps - {name}
    assert graph["cluster.client.index"].isdisjoint({"cluster.client", "cluster.client.clients"})
    list(TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
