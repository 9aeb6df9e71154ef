"""The design's hard lines, checked on the source (docs/architecture.md, "The layers" and the rules under it).

The import graph is read with ``ast``: every ``import`` and ``from ... import``, at module level
and inside functions (and ``TYPE_CHECKING`` blocks), relative imports resolved, plus
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name. An edge from a
package's ``__init__`` to one of its own submodules is not a dependency and is left out.
Each rule's checker takes a package directory, so the ``test_rule_*_can_fail`` tests run it on
a small package written with the violation it must find.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import sysconfig
from collections import deque
from pathlib import Path
from typing import Iterator, Optional

import pytest

from nodehealth.registry import BY_NAME, CHECKS

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "nodehealth"
TESTS = ROOT / "tests"
OS_MODULES = {"pynvml", "subprocess", "psutil"}
IMPURE = OS_MODULES | {"os", "io", "pathlib", "shutil", "socket", "select", "signal", "threading", "time"}


# --------------------------------------------------------------------------- the import graph


def imported_by_call(node: ast.AST) -> Optional[str]:
    """The module a ``__import__("a.b")`` or ``importlib.import_module("a.b")`` call names, or None."""
    if not (
        isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return None
    f = node.func
    if (isinstance(f, ast.Name) and f.id == "__import__") or (
        isinstance(f, ast.Attribute) and f.attr == "import_module"
    ):
        return node.args[0].value
    return None


class Package:
    """The modules of one package directory and what each imports."""

    def __init__(self, pkg_dir: Path) -> None:
        self.dir = pkg_dir
        self.name = pkg_dir.name
        self.files: dict[str, Path] = {}
        for path in sorted(pkg_dir.rglob("*.py")):
            parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            self.files[".".join(parts)] = path
        self._trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.files[module].read_text(encoding="utf-8"))
        return self._trees[module]

    def is_package(self, module: str) -> bool:
        return self.files[module].name == "__init__.py"

    def rel(self, module: str) -> str:
        return str(self.files[module].relative_to(self.dir.parent))

    def imported(self, module: str) -> list[tuple[str, int]]:
        """Every absolute name ``module`` imports, with its line: ``from a.b import c`` gives a.b and a.b.c."""
        out: list[tuple[str, int]] = []
        for node in ast.walk(self.tree(module)):
            if isinstance(node, ast.Import):
                out += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".") if self.is_package(module) else module.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                out.append((base, node.lineno))
                out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*"]
            elif dynamic := imported_by_call(node):
                out.append((dynamic, node.lineno))
        return out

    def resolve(self, name: str) -> Optional[str]:
        """The module of this package that ``name`` is (or is inside of); None outside the package."""
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def edges(self, module: str) -> dict[str, int]:
        """The package's modules that ``module`` imports, each with the line of its first import."""
        out: dict[str, int] = {}
        for name, line in self.imported(module):
            target = self.resolve(name)
            if target is None or target == module:
                continue
            if self.is_package(module) and target.startswith(module + "."):
                continue  # a package's __init__ importing its own submodule
            out.setdefault(target, line)
        return out

    def graph(self) -> dict[str, dict[str, int]]:
        return {m: self.edges(m) for m in self.files}

    def under(self, *subpackages: str) -> list[str]:
        """This package's modules inside any of ``subpackages`` (dotted, relative to the package)."""
        return [m for m in self.files if in_any(m, [f"{self.name}.{s}" for s in subpackages])]


def in_any(module: str, prefixes: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a list of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def cycle_path(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One closed import path through ``component``: its first module, ..., back to it (shortest)."""
    start, members = component[0], set(component)
    came: dict[str, Optional[str]] = {start: None}
    todo = deque([start])
    while todo:
        v = todo.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])  # type: ignore[arg-type]
                return list(reversed(path)) + [start]
            if w in members and w not in came:
                came[w] = v
                todo.append(w)
    raise AssertionError(f"not a cycle: {component}")


def describe_cycle(pkg: Package, graph: dict[str, dict[str, int]], component: list[str]) -> str:
    path = cycle_path(graph, component)
    hops = [f"{pkg.rel(a)}:{graph[a][b]} imports {b}" for a, b in zip(path, path[1:])]
    return " -> ".join(path) + " (" + "; ".join(hops) + ")"


# --------------------------------------------------------------------------- the rules


def import_cycles(pkg_dir: Path) -> list[str]:
    """Rule 1: every import cycle between the package's modules, each with the imports that close it."""
    pkg = Package(pkg_dir)
    graph = pkg.graph()
    return [describe_cycle(pkg, graph, comp) for comp in cycles(graph)]


def forbidden_imports(pkg_dir: Path, sources: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    """``file:line imports X`` for each import from a module under ``sources`` of a module under ``forbidden``."""
    pkg = Package(pkg_dir)
    banned = [f"{pkg.name}.{f}" for f in forbidden]
    out = []
    for module in pkg.under(*sources):
        hits = sorted((line, target) for target, line in pkg.edges(module).items() if in_any(target, banned))
        for line, target in hits:
            if not any(other.startswith(target + ".") and at == line for at, other in hits):  # the most precise
                out.append(f"{pkg.rel(module)}:{line} imports {target}")
    return out


PROBES_MAY_NOT_IMPORT = ("slurm.policy", "slurm.act", "faces", "daemon", "commands")
CHECKS_MAY_NOT_IMPORT = ("probes", "platform", "sim", "statedir")


def _stdlib_top_names() -> frozenset[str]:
    names = getattr(sys, "stdlib_module_names", None)  # Python >= 3.10
    if names is not None:
        return frozenset(names)
    return frozenset()


_STDLIB = _stdlib_top_names()
_STDLIB_DIRS = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}


def is_stdlib(name: str) -> bool:
    top = name.split(".")[0]
    if _STDLIB:
        return top in _STDLIB
    if top in sys.builtin_module_names or top == "__future__":
        return True
    spec = importlib.util.find_spec(top)  # Python 3.9: where the module lives decides
    if spec is None or spec.origin is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    origin = Path(spec.origin).resolve()
    return not {"site-packages", "dist-packages"} & set(origin.parts) and any(d in origin.parents for d in _STDLIB_DIRS)


def non_stdlib_imports(pkg_dir: Path, sub: str) -> list[str]:
    """Rule 4: ``file:line imports X`` for each import under ``sub`` of neither the standard library nor ``sub``."""
    pkg = Package(pkg_dir)
    own = f"{pkg.name}.{sub}"
    ancestors = {".".join(own.split(".")[:i]) for i in range(1, own.count(".") + 1)}  # imported with it anyway
    out = []
    for module in pkg.under(sub):
        seen = set()
        for name, line in pkg.imported(module):
            target = pkg.resolve(name)
            if target is not None:
                if in_any(target, [own]) or target in ancestors:
                    continue
                bad = target
            elif is_stdlib(name):
                continue
            else:
                bad = name.split(".")[0]
            if (bad, line) not in seen:
                seen.add((bad, line))
                out.append(f"{pkg.rel(module)}:{line} imports {bad}")
    return out


# Every state-dir file name, and the pieces of the boot-id path: only statedir/ may spell them.
STATE_FILE_NAMES = (
    "daemon-state.json",
    "daemon-state.marshal",
    "gpu-counters.marshal",
    "slurm-state.json",
    "gpu-counters.json",
    "jobs.jsonl",
    "xid-events.json",
    "xid-events.lock",
    "ib-history.json",
    "config-good.json",
    "slurm-observe.json",
    "reboots.json",
)
BOOT_ID_PIECES = ("random", "boot_id")
_STATE_NAME_RE = re.compile("|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-])" for n in STATE_FILE_NAMES))


def _bare_strings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are whole statements: docstrings (module, class, function, attribute)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _strings(nodes: list[ast.expr]) -> list[Optional[str]]:
    return [n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None for n in nodes]


def _div_operands(node: ast.expr) -> list[ast.expr]:
    """``a / "b" / "c"`` as [a, "b", "c"] (pathlib joins)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _div_operands(node.left) + [node.right]
    return [node]


def _has_pieces(seq: list[Optional[str]], pieces: tuple[str, ...]) -> bool:
    n = len(pieces)
    return any(tuple(seq[i : i + n]) == pieces for i in range(len(seq) - n + 1))


def state_names_outside_statedir(pkg_dir: Path) -> list[str]:
    """Rule 5: ``file:line`` and the literal, for each state-dir file name or boot-id path piece outside statedir/."""
    pkg = Package(pkg_dir)
    statedir = [f"{pkg.name}.statedir"]
    out = []
    for module in pkg.files:
        if in_any(module, statedir):
            continue
        tree = pkg.tree(module)
        docs = _bare_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if _STATE_NAME_RE.search(node.value) or "random/boot_id" in node.value:
                    out.append(f"{pkg.rel(module)}:{node.lineno} {node.value!r}")
            seqs = []
            if isinstance(node, (ast.Tuple, ast.List)):
                seqs.append(node.elts)
            elif isinstance(node, ast.Call):
                seqs.append(node.args)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                seqs.append(_div_operands(node))
            for seq in seqs:
                if _has_pieces(_strings(seq), BOOT_ID_PIECES):
                    out.append(f"{pkg.rel(module)}:{node.lineno} boot-id path pieces {BOOT_ID_PIECES}")
    return sorted(set(out), key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0]), s))


# The modules whose functions read or write a persistent file: they take the config's [paths], never a directory.
PERSISTENT_OWNERS = ("slurmstate", "lastgood", "observe", "reboot")
LAYOUT_RESOLVERS = ("path_for", "dir_for", "earlier_path")


def _is_state_dir(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "state_dir") or (
        isinstance(node, ast.Name) and node.id == "state_dir"
    )


def persistent_files_in_the_run_dir(pkg_dir: Path, persistent: set[str]) -> list[str]:
    """Rule 5b: ``file:line`` of each way a persistent file could land in the run directory: a reader or
    writer of one (``slurmstate.load(...)``, ``lastgood.record(...)``) or a layout resolver handed
    ``state_dir``, or ``layout.path(d, layout.NAME)`` for a ``NAME`` of ``persistent`` (constant names),
    which must be ``layout.path_for(paths, NAME)``. statedir/layout.py itself is the resolver."""
    pkg = Package(pkg_dir)
    out = []
    for module in pkg.files:
        if module == f"{pkg.name}.statedir.layout":
            continue
        for node in ast.walk(pkg.tree(module)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            f, owner = node.func, node.func.value
            owner_name = (
                owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            )
            args = list(node.args) + [k.value for k in node.keywords]
            if (owner_name in PERSISTENT_OWNERS or f.attr in LAYOUT_RESOLVERS) and any(map(_is_state_dir, args)):
                out.append(f"{pkg.rel(module)}:{node.lineno} {owner_name}.{f.attr} given state_dir")
            if (
                f.attr == "path"
                and owner_name == "layout"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Attribute)
                and node.args[1].attr in persistent
            ):
                out.append(f"{pkg.rel(module)}:{node.lineno} layout.path for {node.args[1].attr}")
    return sorted(out)


def os_imports(path: Path) -> set[str]:
    """Rule 6: the top-level names ``path`` imports (any level, ``importlib`` included) that touch the OS."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif dynamic := imported_by_call(node):
            found.add(dynamic.split(".")[0])
    return found


# The layers, bottom up (docs/architecture.md, "The layers"; `python tests/test_architecture.py` prints
# this table and the climbs as markdown). A module may import modules of its own layer or of a lower
# one; its layer is that of the longest prefix listed ("" is the package's own __init__). The arrows of
# the drawn picture are the flow of data; imports point the other way: the runner imports the probes
# and the checks, the probes and the checks import observations, config validates against the
# registry, which lists the checks.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("", "observations", "model", "statedir")),
    (
        "pure domain",
        (
            "xid",
            "slurm",
            "slurm.nodes",
            "slurm.jobenv",
            "nccl",
            "nccl.results",
            "nccl.parse",
            "nccl.transport",
            "nccl.floors",
            "hints",
        ),
    ),
    ("checks", ("checks",)),
    ("registry", ("registry",)),
    ("config", ("config",)),
    ("platform", ("platform", "slurm.client", "slurm.reboot", "slurm.observe", "nccl.runner", "nccl.plan")),
    ("probes", ("probes",)),
    ("runner", ("runner", "config.use")),  # config.use: the faces' and the daemon's recipe
    ("results", ("slurm.policy", "slurm.reasons", "slurm.act", "slurm.stores", "metrics", "render")),
    ("faces", ("faces", "daemon", "commands", "preflight", "validation", "nccl.builtin", "nccl.cli_parse")),
    ("cli", ("cli", "__main__")),
)

# Imports up a layer that stay, each with its reason (module -> module it imports). An entry whose
# import is gone fails the rule too, so the list shrinks with the code.
ALLOWED_CLIMBS: dict[tuple[str, str], str] = {}


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> Optional[int]:
    """The index in ``layers`` of ``module``'s layer: its longest listed prefix; None when none is listed."""
    rel = module.partition(".")[2]
    best: Optional[tuple[int, int]] = None
    for rank, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if rel == prefix or (prefix and rel.startswith(prefix + ".")):
                length = len(prefix) + 1 if prefix else 0
                if best is None or length > best[0]:
                    best = (length, rank)
    return None if best is None else best[1]


def climbs(pkg_dir: Path, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> dict[tuple[str, str], str]:
    """Rule 8: every import up a layer, ``(module, imported module) -> "file:line layer -> layer"``;
    a module in no layer of ``layers`` is one too, as ``(module, "") -> "file has no layer"``."""
    pkg = Package(pkg_dir)
    out: dict[tuple[str, str], str] = {}
    for module, edges in pkg.graph().items():
        low = layer_of(module, layers)
        if low is None:
            out[(module, "")] = f"{pkg.rel(module)} has no layer"
            continue
        for target, line in sorted(edges.items()):
            high = layer_of(target, layers)
            if any(other.startswith(target + ".") and at == line for other, at in edges.items()):
                continue  # ``from a import b``: the edge to a.b says it
            if high is not None and high > low:
                out[(module, target)] = f"{pkg.rel(module)}:{line} {layers[low][0]} -> {layers[high][0]}"
    return out


def layer_violations(
    pkg_dir: Path, allowed: dict[tuple[str, str], str], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
) -> list[str]:
    """The climbs not in ``allowed``, and the entries of ``allowed`` that are no climb (any more)."""
    found = climbs(pkg_dir, layers)
    out = [
        f"{where} ({module} imports {target})" if target else where
        for (module, target), where in sorted(found.items())
        if (module, target) not in allowed
    ]
    out += [
        f"allowed climb {module} -> {target} is not one (any more): drop it"
        for module, target in sorted(allowed)
        if (module, target) not in found
    ]
    return out


def layers_markdown() -> str:
    """The layer table and the allowed climbs, for docs/architecture.md."""
    rows = ["| layer (bottom up) | modules |", "|---|---|"]
    rows += [
        f"| {rank} {name} | " + ", ".join(f"`{p or 'nodehealth/__init__'}`" for p in prefixes) + " |"
        for rank, (name, prefixes) in enumerate(LAYERS)
    ]
    rows += ["", "| import up a layer | why it stays |", "|---|---|"]
    rows += [f"| `{a}` → `{b}` | {why} |" for (a, b), why in sorted(ALLOWED_CLIMBS.items())]
    return "\n".join(rows)


MAX_LISTED_CHECKS = 5


def literal_collections(test_dir: Path) -> Iterator[tuple[str, int, list[Optional[ast.expr]]]]:
    """``(file, line, items)`` of each literal list, tuple, set or dict (its keys) in the tests under ``test_dir``."""
    for path in sorted(test_dir.rglob("*.py")):
        rel = str(path.relative_to(test_dir.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                yield rel, node.lineno, list(node.elts)
            elif isinstance(node, ast.Dict):
                yield rel, node.lineno, list(node.keys)


def hand_written_registries(test_dir: Path, names: set[str]) -> list[str]:
    """Rule 7: ``file:line`` of each literal list, tuple, set or dict in the tests naming over 5 registered checks."""
    out = []
    for rel, line, items in literal_collections(test_dir):
        listed = {n.value for n in items if isinstance(n, ast.Constant) and n.value in names}
        if len(listed) > MAX_LISTED_CHECKS:
            out.append(f"{rel}:{line} lists {len(listed)} checks")
    return out


def hand_written_module_lists(test_dir: Path, modules: set[str]) -> list[str]:
    """Rule 7 for modules: ``file:line`` of each literal list, tuple, set or dict (keys) in the tests
    holding over 5 check modules by name (``gpu_ecc`` or ``checks.gpu_ecc``): derive it from
    ``registry.CHECKS`` (``spec.module``) instead."""
    out = []
    for rel, line, items in literal_collections(test_dir):
        listed = {
            n.id if isinstance(n, ast.Name) else n.attr for n in items if isinstance(n, (ast.Name, ast.Attribute))
        }
        if len(listed & modules) > MAX_LISTED_CHECKS:
            out.append(f"{rel}:{line} lists {len(listed & modules)} check modules")
    return out


# --------------------------------------------------------------------------- the rules on nodehealth


def test_no_import_cycle():
    found = import_cycles(PKG)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_probes_import_no_policy_act_face_daemon_or_command():
    found = forbidden_imports(PKG, ("probes",), PROBES_MAY_NOT_IMPORT)
    assert not found, "probes/ reaches above itself:\n" + "\n".join(found)


def test_checks_import_no_probe_platform_sim_or_statedir():
    found = forbidden_imports(PKG, ("checks",), CHECKS_MAY_NOT_IMPORT)
    assert not found, "checks/ imports I/O layers:\n" + "\n".join(found)


def test_statedir_imports_only_the_standard_library():
    found = non_stdlib_imports(PKG, "statedir")
    assert not found, "statedir/ imports beyond the standard library:\n" + "\n".join(found)


def test_state_file_names_and_the_boot_id_path_come_from_statedir():
    found = state_names_outside_statedir(PKG)
    assert not found, "state-dir names spelt outside statedir/ (use nodehealth.statedir.layout):\n" + "\n".join(found)


def _persistent_constants() -> set[str]:
    from nodehealth.statedir import layout

    return {k for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) and v in layout.PERSISTENT}


def test_persistent_files_are_reached_through_the_layout():
    found = persistent_files_in_the_run_dir(PKG, _persistent_constants())
    assert not found, (
        "a persistent file reached through the run dir (pass the config's [paths]; "
        "layout.path_for):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] not in ("probes", "platform")],
    ids=lambda p: str(p.relative_to(PKG)),
)
def test_only_probes_and_platform_touch_hardware_and_the_os(path):
    assert not os_imports(path) & OS_MODULES


def test_tests_derive_check_lists_from_the_registry():
    found = hand_written_registries(TESTS, set(BY_NAME))
    assert not found, "hand-written lists of check names (derive them from nodehealth.registry.CHECKS):\n" + "\n".join(
        found
    )


def _check_modules() -> set[str]:
    return {spec.module.__name__.rpartition(".")[2] for spec in CHECKS}


def test_tests_derive_check_module_lists_from_the_registry():
    found = hand_written_module_lists(TESTS, _check_modules())
    assert not found, (
        "hand-written lists of check modules (derive them from nodehealth.registry.CHECKS):\n" + "\n".join(found)
    )


@pytest.mark.parametrize("path", sorted((PKG / "checks").rglob("*.py")), ids=lambda p: p.name)
def test_checks_are_pure(path):
    tree = ast.parse(path.read_text())
    os_uses = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os"
    }
    assert os_uses <= {"path"}, f"os.{os_uses - {'path'}} in a check"  # os.path is string work
    assert not os_imports(path) & (IMPURE - {"os"})
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open" not in calls


def test_observations_import_nothing_of_ours():
    found = [hit for hit in non_stdlib_imports(PKG, "observations") if "imports nodehealth" in hit]
    assert not found, "observations import other modules of ours (define the type in observations):\n" + "\n".join(
        found
    )


# What reads the system; the XID feature's pure modules (patterns, parse, catalog, events, text,
# attribution, the store's content) use none of it: reading the kernel log and the store's file is
# the probes' (probes/kernel_log.py, xid_store.py, xid_follower.py, process_job.py).
SYSTEM_MODULES = OS_MODULES | {"os", "io", "socket", "select", "signal", "threading", "fcntl", "shutil", "tempfile"}


def system_imports(pkg_dir: Path, sub: str) -> list[str]:
    """Rule 9: ``file:line imports X`` for each module under ``sub`` importing one of ``SYSTEM_MODULES``,
    and ``file:line calls open()``."""
    pkg = Package(pkg_dir)
    out = []
    for module in pkg.under(sub):
        for name, line in pkg.imported(module):
            if name.split(".")[0] in SYSTEM_MODULES:
                out.append(f"{pkg.rel(module)}:{line} imports {name.split('.')[0]}")
        for node in ast.walk(pkg.tree(module)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                out.append(f"{pkg.rel(module)}:{node.lineno} calls open()")
    return sorted(set(out))


# The one read in xid/: the package's own data file, not the system.
READS_ITS_DATA_FILE = {
    "nodehealth/xid/catalog.py": "load_catalog reads data/xid_catalog.toml, the catalog as data "
    "with its sources (once: catalog_for is cached)"
}


def test_xid_is_pure():
    found = [
        hit
        for hit in system_imports(PKG, "xid")
        if not (hit.endswith(" calls open()") and hit.split(":")[0] in READS_ITS_DATA_FILE)
    ]
    assert not found, "xid/ reads the system (that is a probe's: probes/kernel_log.py, xid_store.py):\n" + "\n".join(
        found
    )


def test_rule_xid_pure_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "xid/kmsg.py": "import os\ndef f():\n    import select\n    return open('/dev/kmsg')\n",
            "xid/parse.py": "import re\nfrom pathlib import Path\n",  # string work, a data file's path: fine
            "probes/kernel_log.py": "import os\n",  # not xid/
        },
    )
    assert system_imports(pkg, "xid") == [
        "nodehealth/xid/kmsg.py:1 imports os",
        "nodehealth/xid/kmsg.py:3 imports select",
        "nodehealth/xid/kmsg.py:4 calls open()",
    ]


def test_no_import_up_a_layer():
    found = layer_violations(PKG, ALLOWED_CLIMBS)
    assert not found, (
        "imports up a layer (move the code, or name the edge in ALLOWED_CLIMBS with its reason):\n" + "\n".join(found)
    )


def test_every_check_module_is_registered_once():
    modules = {p.stem for p in (PKG / "checks").glob("*.py")} - {"__init__", "base"}
    registered = [spec.module.__name__.rsplit(".", 1)[1] for spec in CHECKS]
    assert sorted(registered) == sorted(set(registered)), "a module registered twice"
    assert modules == set(registered)
    assert [s.name for s in CHECKS] == list(dict.fromkeys(s.name for s in CHECKS))


def test_every_check_needs_only_known_probes():
    from nodehealth.observations import Observations
    from nodehealth.probes import PROBES

    fields = set(Observations.__dataclass_fields__)
    for spec in CHECKS:
        for probe in spec.needs:
            assert probe in PROBES and probe in fields, (spec.name, probe)


# --------------------------------------------------------------------------- each rule can fail


def _package(root: Path, files: dict[str, str]) -> Path:
    """A package named ``nodehealth`` under ``root`` with ``files`` (path -> source); __init__.py added."""
    pkg = root / "nodehealth"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(pkg).parents:
            (pkg / parent / "__init__.py").touch()
        path.write_text(text)
    return pkg


def test_rule_import_cycle_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "faces/common.py": "def f():\n    from . import fast\n",  # function level, relative
            "faces/fast.py": "from nodehealth.faces.common import f\n",
            "faces/__init__.py": "from nodehealth.faces import common\n",  # __init__ -> own submodule: no edge
            "a.py": "import nodehealth.b\n",
            "b.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .c import X\n",
            "c.py": "import importlib\nm = importlib.import_module('nodehealth.a')\n",
            "d.py": "from nodehealth import a\n",  # into a cycle, not part of it
        },
    )
    found = import_cycles(pkg)
    assert len(found) == 2, found
    assert found[0].startswith("nodehealth.a -> nodehealth.b -> nodehealth.c -> nodehealth.a ("), found
    assert found[1].startswith("nodehealth.faces.common -> nodehealth.faces.fast -> nodehealth.faces.common ("), found
    assert "nodehealth/faces/common.py:2 imports nodehealth.faces.fast" in found[1]
    assert "nodehealth/faces/fast.py:1 imports nodehealth.faces.common" in found[1]
    assert import_cycles(_package(tmp_path / "ok", {"x.py": "from . import y\n", "y.py": "import os\n"})) == []


def test_rule_probes_layer_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "probes/slurm.py": "from nodehealth.slurm import policy\n"
            "def f():\n    from ..faces import common\n    import nodehealth.daemon.core\n",
            "probes/nvml.py": "from nodehealth.slurm import client\nfrom nodehealth.slurm.act import go\n",
            "probes/host.py": "def f():\n    from nodehealth.commands.check import main\n",
            "slurm/policy.py": "",
            "slurm/client.py": "",
            "slurm/act.py": "",
            "faces/common.py": "",
            "daemon/core.py": "",
            "commands/check.py": "",
            "checks/ok.py": "from nodehealth.faces import common\n",  # not probes/
        },
    )
    assert forbidden_imports(pkg, ("probes",), PROBES_MAY_NOT_IMPORT) == [
        "nodehealth/probes/host.py:2 imports nodehealth.commands.check",
        "nodehealth/probes/nvml.py:2 imports nodehealth.slurm.act",
        "nodehealth/probes/slurm.py:1 imports nodehealth.slurm.policy",
        "nodehealth/probes/slurm.py:3 imports nodehealth.faces.common",
        "nodehealth/probes/slurm.py:4 imports nodehealth.daemon.core",
    ]


def test_rule_checks_layer_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "checks/a.py": "from nodehealth.probes import nvml\nfrom ..model import X\n",
            "checks/b.py": "def f():\n    from nodehealth.statedir.counters import read\n",
            "checks/c.py": "import nodehealth.platform.proc\nfrom nodehealth.sim import nvml\n",
            "checks/d.py": "from nodehealth import xid\n",  # xid/ is allowed
            "probes/nvml.py": "",
            "statedir/counters.py": "",
            "platform/proc.py": "",
            "sim/nvml.py": "",
            "model.py": "",
            "xid/__init__.py": "from nodehealth.statedir import counters\n",
        },
    )
    assert forbidden_imports(pkg, ("checks",), CHECKS_MAY_NOT_IMPORT) == [
        "nodehealth/checks/a.py:1 imports nodehealth.probes.nvml",
        "nodehealth/checks/b.py:2 imports nodehealth.statedir.counters",
        "nodehealth/checks/c.py:1 imports nodehealth.platform.proc",
        "nodehealth/checks/c.py:2 imports nodehealth.sim.nvml",
    ]


def test_rule_statedir_stdlib_only_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "statedir/verdict.py": "from __future__ import annotations\nimport json, os.path\nfrom . import files\n"
            "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from nodehealth.model import Report\n"
            "def f():\n    from ..model import Status\n    import psutil\n",
            "statedir/files.py": "import fcntl\nfrom collections import namedtuple\n"
            "from nodehealth.statedir import layout\n",
            "statedir/layout.py": "import tomli\nfrom nodehealth import config\n",
            "model.py": "",
            "config/__init__.py": "",
        },
    )
    assert non_stdlib_imports(pkg, "statedir") == [
        "nodehealth/statedir/layout.py:1 imports tomli",
        "nodehealth/statedir/layout.py:2 imports nodehealth.config",
        "nodehealth/statedir/verdict.py:6 imports nodehealth.model",
        "nodehealth/statedir/verdict.py:8 imports nodehealth.model",
        "nodehealth/statedir/verdict.py:9 imports psutil",
    ]
    assert is_stdlib("os.path") and is_stdlib("json") and is_stdlib("fcntl") and is_stdlib("__future__")
    assert not is_stdlib("pytest") and not is_stdlib("psutil") and not is_stdlib("nodehealth")


def test_rule_state_names_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "faces/common.py": '"""Reads daemon-state.json (a docstring: allowed)."""\n'
            'STATE_FILE = "slurm-state.json"\n'
            'def f(d):\n    """jobs.jsonl in a docstring."""\n'
            '    return f"{d}/gpu-counters.json", d + "/jobs.jsonl"\n',
            "xid/store.py": 'LOCK = "xid-events.lock"\nNAME = "xid-events.json"\n'
            'BACKUP = "my-xid-events.json.bak"\n',  # another file's name: fine
            "probes/host.py": "import os\nfrom pathlib import Path\n"
            'A = "/proc/sys/kernel/random/boot_id"\n'
            'B = os.path.join("/proc", "sys", "kernel", "random", "boot_id")\n'
            'C = ("sys", "kernel", "random", "boot_id")\n'
            'D = Path("/proc") / "sys" / "kernel" / "random" / "boot_id"\n'
            'E = {"boot_id": 1, "state": "daemon-state.jsonx"}\n',  # a key and another name: fine
            "statedir/layout.py": 'DAEMON_STATE = "daemon-state.json"\nBOOT = ("sys", "kernel", "random", "boot_id")\n',
        },
    )
    assert state_names_outside_statedir(pkg) == [
        "nodehealth/faces/common.py:2 'slurm-state.json'",
        "nodehealth/faces/common.py:5 '/gpu-counters.json'",
        "nodehealth/faces/common.py:5 '/jobs.jsonl'",
        "nodehealth/probes/host.py:3 '/proc/sys/kernel/random/boot_id'",
        f"nodehealth/probes/host.py:4 boot-id path pieces {BOOT_ID_PIECES}",
        f"nodehealth/probes/host.py:5 boot-id path pieces {BOOT_ID_PIECES}",
        f"nodehealth/probes/host.py:6 boot-id path pieces {BOOT_ID_PIECES}",
        "nodehealth/xid/store.py:1 'xid-events.lock'",
        "nodehealth/xid/store.py:2 'xid-events.json'",
    ]


def test_rule_persistent_files_through_the_layout_can_fail(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "slurm/act.py": "from nodehealth.statedir import slurmstate, layout\n"
            "def f(cfg, state_dir):\n"
            "    slurmstate.load(cfg.paths.state_dir)\n"
            "    slurmstate.update(state_dir, None, 1.0)\n"
            "    slurmstate.load(cfg.paths)\n"  # fine
            "    layout.path(cfg.paths.state_dir, layout.SLURM_STATE)\n"
            "    layout.path(cfg.paths.state_dir, layout.LEDGER)\n"  # a file of one boot: fine
            "    layout.path_for(cfg.paths.state_dir, layout.CONFIG_GOOD)\n",
            "config/loader.py": "from nodehealth.config import lastgood\n"
            "def g(cfg):\n    lastgood.record(paths=cfg.paths.state_dir)\n",
            "statedir/layout.py": "def path_for(paths, name):\n    return paths.state_dir\n",  # the resolver itself
        },
    )
    assert persistent_files_in_the_run_dir(pkg, {"SLURM_STATE", "CONFIG_GOOD"}) == [
        "nodehealth/config/loader.py:3 lastgood.record given state_dir",
        "nodehealth/slurm/act.py:3 slurmstate.load given state_dir",
        "nodehealth/slurm/act.py:4 slurmstate.update given state_dir",
        "nodehealth/slurm/act.py:6 layout.path for SLURM_STATE",
        "nodehealth/slurm/act.py:8 layout.path_for given state_dir",
    ]
    assert _persistent_constants() >= {"SLURM_STATE", "CONFIG_GOOD"}


def test_state_names_are_those_statedir_declares():
    from nodehealth.statedir import layout

    declared = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) and "." in v}
    assert declared <= set(STATE_FILE_NAMES), declared - set(STATE_FILE_NAMES)
    assert tuple(layout.BOOT_ID_REL[-2:]) == BOOT_ID_PIECES


def test_rule_layers_can_fail(tmp_path):
    layers = (("low", ("", "obs", "model")), ("mid", ("checks", "xid")), ("high", ("probes", "xid.store")))
    pkg = _package(
        tmp_path,
        {
            "obs.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from nodehealth.xid import events\n",
            "model.py": "def f():\n    from .checks import a\n",  # function level, relative
            "xid/events.py": "from nodehealth import obs\n",  # down: fine
            "xid/store.py": "import nodehealth.probes.kmsg\n",  # same layer (its longest prefix)
            "checks/a.py": "from nodehealth.xid.store import load\nfrom nodehealth.xid import events\n",
            "probes/kmsg.py": "from nodehealth.checks import a\n",  # down: fine
            "stray.py": "",  # no layer
        },
    )
    found = climbs(pkg, layers)
    assert found == {
        ("nodehealth.checks.a", "nodehealth.xid.store"): "nodehealth/checks/a.py:1 mid -> high",
        ("nodehealth.model", "nodehealth.checks.a"): "nodehealth/model.py:2 low -> mid",
        ("nodehealth.obs", "nodehealth.xid.events"): "nodehealth/obs.py:3 low -> mid",
        ("nodehealth.stray", ""): "nodehealth/stray.py has no layer",
    }, found
    allowed = {
        ("nodehealth.obs", "nodehealth.xid.events"): "a reason",
        ("nodehealth.xid.events", "nodehealth.obs"): "not a climb: stale",
    }
    assert layer_violations(pkg, allowed, layers) == [
        "nodehealth/checks/a.py:1 mid -> high (nodehealth.checks.a imports nodehealth.xid.store)",
        "nodehealth/model.py:2 low -> mid (nodehealth.model imports nodehealth.checks.a)",
        "nodehealth/stray.py has no layer",
        "allowed climb nodehealth.xid.events -> nodehealth.obs is not one (any more): drop it",
    ]
    assert layer_of("nodehealth.xid.store.disk", layers) == 2 and layer_of("nodehealth", layers) == 0


def test_rule_os_modules_can_fail(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "def f():\n    import subprocess.run\n    from psutil import Process\n    __import__('pynvml')\n    import os\n"
    )
    assert os_imports(path) & OS_MODULES == OS_MODULES


def test_rule_hand_written_registry_can_fail(tmp_path):
    names = [spec.name for spec in CHECKS]
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        f"A = {tuple(names[: MAX_LISTED_CHECKS + 1])!r}\n"
        f"B = {names[:MAX_LISTED_CHECKS]!r}\n"  # a few, by hand: fine
        f"C = {dict.fromkeys(names[-MAX_LISTED_CHECKS - 1 :], 1)!r}\n"
        f"def f():\n    return {set(names[:MAX_LISTED_CHECKS] + ['not_a_check'])!r}\n"
    )
    assert hand_written_registries(tests, set(names)) == [
        f"tests/test_x.py:1 lists {MAX_LISTED_CHECKS + 1} checks",
        f"tests/test_x.py:3 lists {MAX_LISTED_CHECKS + 1} checks",
    ]


def test_rule_hand_written_module_list_can_fail(tmp_path):
    modules = sorted(_check_modules())
    tests = tmp_path / "tests"
    tests.mkdir()
    many, few = modules[: MAX_LISTED_CHECKS + 1], modules[:MAX_LISTED_CHECKS]
    (tests / "test_x.py").write_text(
        f"from nodehealth import checks\nfrom nodehealth.checks import {', '.join(modules)}\n"
        f"A = ({', '.join(many)})\n"
        f"B = [{', '.join(few)}]\n"  # a few, by hand: fine
        f"C = {{{', '.join(f'checks.{m}: 1' for m in many)}}}\n"
        f"D = ({', '.join(few)}, not_a_check)\n"
        f"def f():\n    return {{{', '.join(many)}}}\n"
    )
    assert hand_written_module_lists(tests, set(modules)) == [
        f"tests/test_x.py:3 lists {MAX_LISTED_CHECKS + 1} check modules",
        f"tests/test_x.py:5 lists {MAX_LISTED_CHECKS + 1} check modules",
        f"tests/test_x.py:8 lists {MAX_LISTED_CHECKS + 1} check modules",
    ]


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_shell_and_no_sudo(path):
    """Programs run by argv list with an absolute path: no ``shell=True``, no ``sudo`` (docs/security.md)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "shell":
            assert isinstance(node.value, ast.Constant) and node.value.value is False, f"shell= in {path}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not node.value.split() or node.value.split()[0] not in ("sudo", "/usr/bin/sudo"), path


def test_the_architecture_doc_shows_the_layers_as_ranked_here() -> None:
    """docs/architecture.md's layer table is this test's ``LAYERS``: a layer added or a module moved here
    without the doc fails (``python tests/test_architecture.py`` prints the table to paste)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = layers_markdown().split("\n\n", 1)[0]
    assert table in doc, "docs/architecture.md's layer table is not LAYERS: paste `python tests/test_architecture.py`"


if __name__ == "__main__":
    print(layers_markdown())
    print()
    print("\n".join(f"{where} ({a} imports {b})" for (a, b), where in sorted(climbs(PKG).items())))
