"""The package's import graph: no cycles (also none hidden behind imports inside functions),
and the configuration schema imports nothing it configures."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sparkddl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the sparkddl modules it imports, wherever in the module the import is."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            # a package's __init__ re-exporting its submodules is not an edge back to it
            if node.startswith(nxt + "."):
                continue
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_cycles():
    assert cycle(imports()) is None


def test_the_schema_imports_nothing_it_configures():
    assert imports()["sparkddl.config"] == {"sparkddl.errors"}


# what the ranks and the data plane stand on never reaches up to the driver's launch path,
# the Estimator or the job/CLI modules; Spark sessions are told apart in sparkddl.session,
# below them all
LOWER = ("sparkddl.tables", "sparkddl.data", "sparkddl.train", "sparkddl.task",
         "sparkddl.strategies", "sparkddl.channel", "sparkddl.session", "sparkddl.export")
UPPER = ("sparkddl.launch", "sparkddl.fit", "sparkddl.ml", "sparkddl.cli", "sparkddl.tracking",
         "sparkddl.distributor")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_lower_layers_never_import_the_upper_ones():
    upward = {module: sorted(t for t in targets if _within(t, UPPER))
              for module, targets in imports().items() if _within(module, LOWER)}
    assert {m: t for m, t in upward.items() if t} == {}


def test_the_stage_runner_never_imports_the_fits_supervisor():
    """sparkddl.launch runs barrier stages for run, TorchDistributor, HorovodRunner and fits;
    sparkddl.fit supervises a fit on top of it, never the other way round."""
    launch = {m: t for m, t in imports().items() if m.startswith("sparkddl.launch")}
    assert {m: sorted(t) for m, t in launch.items() if _within_any(t, ("sparkddl.fit",))} == {}


def _within_any(targets: set[str], packages: tuple[str, ...]) -> list[str]:
    return [t for t in targets if _within(t, packages)]


def test_tables_stand_below_the_data_plane():
    """sparkddl.tables reads tables' metadata for the data plane and never imports it."""
    graph = imports()
    tables = {m: t for m, t in graph.items() if m.startswith("sparkddl.tables")}
    outside = set().union(*tables.values()) - set(tables)
    assert outside <= {"sparkddl.errors", "sparkddl.store", "sparkddl.store.store"}


def test_the_data_plane_reads_table_formats_only_through_tables():
    """No module outside sparkddl.tables opens a Delta log, Iceberg's manifests or a
    deletion vector: they are what sparkddl.tables is for."""
    markers = ("deltalake", "pyiceberg", "_delta_log", "deletionVector")
    offenders = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if not module_name(p).startswith("sparkddl.tables")
                       and any(m in p.read_text(encoding="utf-8") for m in markers))
    assert offenders == []


def test_sessions_are_told_apart_only_in_the_session_package():
    """No type or attribute tests for Spark Connect outside sparkddl.session."""
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if not module_name(p).startswith("sparkddl.session")
                 and ('"is_connect"' in (text := p.read_text(encoding="utf-8"))
                      or "pyspark.sql.connect" in text)]
    assert offenders == []


def test_the_session_package_stands_on_nothing_but_the_errors():
    session = {m: t for m, t in imports().items() if m.startswith("sparkddl.session")}
    assert set().union(*session.values()) - set(session) <= {"sparkddl.errors"}


def test_the_top_level_holds_the_public_surface_only():
    """Features live in wings (subpackages); the top level keeps at most seven modules
    (and ``__main__``, the CLI's ``python -m sparkddl``)."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "config", "distributor", "errors", "models", "problems",
                   "transforms"]


def test_the_code_copied_into_logged_models_imports_nothing_from_sparkddl():
    graph = imports()
    assert graph["sparkddl.export.portable"] <= {"sparkddl.export.program_check"}
    assert graph["sparkddl.export.program_check"] == set()


def test_the_rest_asks_the_session_seam_instead_of_branching_on_the_kind():
    """Outside sparkddl.session nothing asks whether a session is Spark Connect: the
    contexts of sparkddl.session.cluster answer the questions themselves."""
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if not module_name(p).startswith("sparkddl.session")
                 and "is_connect" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_no_hand_written_module_is_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if p.name != "generated_params.py"
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


def test_the_unit_tests_mirror_every_subpackage():
    code = {p.parent.name for p in PACKAGE.glob("*/*.py")}
    tests = {p.name for p in (PACKAGE.parent / "tests" / "unit").iterdir() if p.is_dir()}
    assert code - tests == set()


def test_every_folder_of_modules_is_a_package_a_wheel_carries():
    """setup.cfg's ``packages = find:`` skips a folder without ``__init__.py``: a wheel would
    lack it while an editable install hides that (sparkddl.train once was one)."""
    from setuptools import find_packages
    found = set(find_packages(str(PACKAGE.parent), include=["sparkddl*"]))
    folders = {module_name(p.parent / "__init__.py")
               for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert folders - found == set()
