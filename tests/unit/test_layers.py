"""The layer rule of docs/ARCHITECTURE.md, read from its ```layers block: a module of the package imports modules of
its own component (``patching``, ``simulate``, ``ops``, ...) and of lower layers only, never a peer of its own layer
(``demo`` and ``simulate`` share what they both need from a layer below them); and nothing the wheel does not ship.
Each import is found in the source (every ``import`` statement, also those inside functions), so no module runs."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "deepspeed_zeropp"
INIT = "__init__"  # the package's own module: patch(), unpatch(), __version__
# Top-level folders, lowest first: the package ships alone; the harness builds on it; tests, benchmarks and
# examples build on both and not on one another.
FOLDERS = ((PACKAGE, ), ("harness", ), ("tests", "benchmarks", "examples"))


def layers():
    """Components by layer, lowest first, as docs/ARCHITECTURE.md states them (one layer a line, peers beside
    each other)."""
    block = re.search(r"^```layers\n(.*?)^```", (ROOT / "docs" / "ARCHITECTURE.md").read_text(), re.M | re.S)
    assert block, "docs/ARCHITECTURE.md has no ```layers block"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(folder):
    return {module_name(path): path for path in sorted((ROOT / folder).rglob("*.py"))}


def imports(name, path):
    """(line, module imported) of every import in ``path`` (module ``name``): ``from a import b`` names ``a.b`` when
    that is a module of the repository, else ``a``; relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield node.lineno, submodule if is_module(submodule) else base


def is_module(name):
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def component(name):
    """``deepspeed_zeropp.patching.seams.gathers`` -> ``patching``; the package itself -> ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else INIT


def test_every_component_of_the_package_has_a_layer():
    placed = {name for layer in layers() for name in layer}
    unplaced = sorted({component(name) for name in modules(PACKAGE)} - placed)
    assert unplaced == [], f"components missing from docs/ARCHITECTURE.md's layers block: {unplaced}"


def test_no_import_runs_up_or_across_a_layer():
    level = {name: i for i, layer in enumerate(layers()) for name in layer}
    wrong = []
    for name, path in modules(PACKAGE).items():
        for line, target in imports(name, path):
            if target.split(".")[0] != PACKAGE or component(target) == component(name):
                continue
            source, imported = component(name), component(target)
            if level[imported] >= level[source]:
                how = "runs up" if level[imported] > level[source] else "reaches across"
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} -> {target} ({how}: {source} is layer "
                             f"{level[source]}, {imported} layer {level[imported]})")
    assert wrong == [], "imports against the layer order of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_no_folder_imports_one_at_or_above_its_own():
    level = {name: i for i, folders in enumerate(FOLDERS) for name in folders}
    wrong = []
    for own in level:
        for name, path in modules(own).items():
            for line, target in imports(name, path):
                top = target.split(".")[0]
                if top in level and top != own and level[top] >= level[own]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} -> {target}")
    assert wrong == [], "imports of a folder at or above the importing one's level:\n" + "\n".join(wrong)
