"""The layers of the package, read from its imports: no circle, and no import that runs back up."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "streamrecover"

# Lowest first. A module may import from its own layer or a lower one, never a higher one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("engine",),
    ("providers",),
    ("conf", "models", "fields", "querysets", "redaction", "redisclients", "gctuning", "checks", "migrations"),
    ("runs",),
    ("live", "analytics"),  # both read what runs leave behind; the Celery tasks fold analytics
    ("starter", "tasks", "dispatch"),
    ("views", "urls", "routing", "admin", "cli", "management", "receivers", "apps", "chat", "proxy", "templatetags"),
)
EDGE = "testing"  # the fake provider and the reference client: imported only through its package


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[str]:
    """Every streamrecover module ``path`` imports, at any depth in the file."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("streamrecover"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("streamrecover"):
                continue
            if node.module is None or (node.level and not node.module):
                yield from (f"{target}.{alias.name}" for alias in node.names)
            else:
                yield target


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for target in _imports(path):
            while target not in modules and "." in target:  # "pkg.module.name" -> "pkg.module"
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int | None:
    area = _area(module)
    for index, names in enumerate(LAYERS):
        if area in names:
            return index
    return None


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in _graph() if _area(m) not in ("", EDGE) and _layer(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"


def test_no_import_runs_back_up() -> None:
    upward = []
    for module, targets in _graph().items():
        own = _layer(module)
        for target in targets:
            theirs = _layer(target)
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports from a higher layer:\n" + "\n".join(sorted(upward))


def test_the_engine_and_the_adapters_import_no_django() -> None:
    offenders = []
    for path in [*(PACKAGE / "engine").rglob("*.py"), *(PACKAGE / "providers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("django", "channels", "celery")]
    assert not offenders


def test_the_testing_tools_are_reached_only_through_their_package() -> None:
    reaching_in = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if _area(module) != EDGE
        for target in targets
        if _area(target) == EDGE and target != f"streamrecover.{EDGE}"
    ]
    assert not reaching_in, "\n".join(sorted(reaching_in))


def test_no_import_circle() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"
