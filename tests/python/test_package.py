"""The installed package: import, version, executables on the venv's PATH; what the wheel ships (the product,
not the benchmark lab or the tests), and no import circles in the product or the lab."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)


def _cmake_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(\s*dlop\s+VERSION\s+([0-9.]+)", text).group(1)


def test_import_and_version():
    import dlop

    assert dlop.__version__ == _pyproject_version()
    assert dlop.__version__ == _cmake_version()


def test_dlop_bench_on_venv_path():
    bench = Path(sys.prefix) / "bin" / "dlop-bench"
    assert bench.is_file(), f"{bench} missing: `make build` installs it"
    result = subprocess.run([str(bench), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- what the wheel ships, and how its modules import each other ----------------------------------

PRODUCT, LAB = ROOT / "python" / "dlop", ROOT / "bench"
# Built extension modules: leaves of the import graph, present only once built.
EXTENSIONS = ("dlop._C", "dlop.testing._accelerator")


def _modules() -> dict[str, Path]:
    """Every module of the product (python/dlop, the wheel's package) and of the benchmark lab (bench/), by name."""
    found = {}
    for base, package in ((ROOT / "python", "dlop"), (ROOT, "bench")):
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known) -> set[str]:
    """The modules of `known` that module `name` imports, wherever in its file: an import inside a function is
    still an import (deferring one does not break a circle, it only hides it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    out.add(f"{base}.{a.name}")
                elif base in known:
                    out.add(base)
    return out - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) | set(EXTENSIONS)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each module found on one (a -> b -> ... -> a), depth first."""
    circles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return circles


def test_no_import_circles_in_the_product_or_the_lab():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]  # the check itself
    graph = _graph()
    assert "dlop.report.linearity" in graph and "bench.ddp" in graph, sorted(graph)[:10]
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_product_never_imports_the_lab_or_the_tests():
    shared = {p.stem for folder in ("tests/python", "tests/bench") for p in (ROOT / folder).glob("*.py")}
    wrong = []
    for path in sorted(PRODUCT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n.split(".")[0] in {"bench", "tests"} | shared]
    assert not wrong, wrong


def test_the_wheel_ships_the_product_only():
    """pyproject.toml puts python/dlop in the wheel and nothing else; the benchmark lab lives beside it, in bench/."""
    text = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r"^wheel\.packages\s*=\s*(\[.*\])", text, re.M) == ['["python/dlop"]']
    assert not (PRODUCT / "bench").exists() and (LAB / "__init__.py").is_file()
    # One sub-package per concern; at the top only the command, the errors and the import hooks.
    assert {p.name for p in PRODUCT.iterdir() if (p / "__init__.py").is_file()} == {
        "c10d", "data", "fleet", "report", "testing"}
    assert {p.stem for p in PRODUCT.glob("*.py")} == {"__init__", "_moved", "_torchvision_compat", "cli", "errors"}
    import importlib.util

    assert importlib.util.find_spec("dlop.report") is not None and importlib.util.find_spec("dlop.bench") is None
