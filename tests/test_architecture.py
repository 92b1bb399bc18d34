"""The floor plan of ARCHITECTURE.md, checked on the source of mimo/ with `ast` (nothing is imported).

- Every module belongs to a room, every room to a floor; a module imports only from its own room, a lower
  floor, or (never a sibling room of its own floor) - so no import runs upward.
- No import cycle between files (imports at module level and inside functions both count).
- No `from mimo...`/`import mimo...` (nor `importlib.import_module("mimo...")`) inside a function, except
  CLI start-up (cli.py, __main__.py and the package's __init__.py, whose public API loads on first use): a
  function-level import is how a cycle or an upward import hides.
- Process groups are created in parallel/grid.py only.
- No file over 450 lines, no function over 60 (decorators, signature and docstring included); every folder
  of mimo/ is a package.
- A file under tests/ imports from tests/support/ only, never from a test file: shared helpers live there.
- No model is changed from outside mimo/models/ by binding methods (`types.MethodType`) or by storing into the
  attributes of a model or of any of its parts (`model_patches`), but through its runtime and its own methods.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mimo"
TESTS = Path(__file__).resolve().parent

ROOMS = {  # module name (or package prefix) -> room
    "mimo.config": "config", "mimo.models": "models", "mimo.data": "data", "mimo.hf": "hf",
    "mimo.parallel": "parallel", "mimo.perf": "perf", "mimo.eval": "eval", "mimo.tasks": "tasks",
    "mimo.train": "train", "mimo.export": "export", "mimo.planner": "planner",
    "mimo.cli": "cli", "mimo.__main__": "cli", "mimo": "cli",  # mimo/__init__.py: the public API re-exports
}
FLOORS = {"config": 0, "models": 1, "data": 2, "hf": 3, "parallel": 4, "perf": 5, "eval": 6, "tasks": 7,
          "train": 8, "export": 9, "planner": 9, "cli": 10}
LAZY_ALLOWED = {"mimo.cli", "mimo.__main__", "mimo"}
GROUP_MAKERS = {"new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group", "init_device_mesh",
                "DeviceMesh"}
GROUP_HOME = "mimo.parallel.grid"
MAX_LINES = 450
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}
"""`module:function` -> the issue that will split it, for functions over MAX_FUNCTION_LINES left as they are."""


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `root` (a package folder)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The package's modules an import statement reaches (`from a import b` reaches a.b when it is a module)."""
    if isinstance(node, ast.Import):
        candidates = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        candidates = [f"{base}.{a.name}" for a in node.names] + [base]
    out = []
    for c in candidates:
        while c and c not in known:
            c = c.rpartition(".")[0]
        if c and c not in out:
            out.append(c)
    if isinstance(node, ast.ImportFrom) and len(out) > 1:
        out = [m for m in out if m != (node.module or "")] or out  # `from pkg import mod`: the module, not pkg
    return out


def as_import(node: ast.AST) -> ast.Import | None:
    """`importlib.import_module("mimo.x")` (a constant name) as the `import mimo.x` it is, else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    target = node.args[0].value
    if called != "import_module" or not isinstance(target, str) or not target.startswith("mimo"):
        return None
    return ast.Import(names=[ast.alias(name=target)], lineno=node.lineno)


def room_of(name: str) -> str | None:
    while name:
        if name in ROOMS:
            return ROOMS[name]
        name = name.rpartition(".")[0]
    return None


class Graph:
    """The import graph of one package folder, with where each edge was written."""

    def __init__(self, root: Path):
        self.root = root
        self.files = module_files(root)
        known = set(self.files)
        self.edges: dict[str, dict[str, int]] = {m: {} for m in self.files}
        self.lazy: list[str] = []
        self.groups: list[str] = []
        self.lines: dict[str, int] = {}
        self.function_lines: dict[str, int] = {}
        for name, path in self.files.items():
            src = path.read_text()
            self.lines[name] = len(src.splitlines())
            tree = ast.parse(src)
            for f in ast.walk(tree):
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([f.lineno, *(d.lineno for d in f.decorator_list)])
                    self.function_lines[f"{name}:{f.name}:{f.lineno}"] = f.end_lineno - first + 1
            inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom, ast.Call))}
            for node in ast.walk(tree):
                if (dynamic := as_import(node)) is not None:
                    if id(node) in inner:
                        inner.add(id(dynamic))
                    node = dynamic
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    targets = [t for t in imported_modules(name, path, node, known) if t != name]
                    for t in targets:
                        self.edges[name].setdefault(t, node.lineno)
                    if targets and id(node) in inner and name not in LAZY_ALLOWED:
                        self.lazy.append(f"{self.where(name, node.lineno)} imports {', '.join(targets)} inside a "
                                         "function; import at module level (only cli.py, __main__.py and "
                                         "mimo/__init__.py may defer)")
                elif isinstance(node, ast.Call):
                    f = node.func
                    called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    if called in GROUP_MAKERS and name != GROUP_HOME:
                        self.groups.append(f"{self.where(name, node.lineno)} calls {called}: process groups are "
                                           "created in parallel/grid.py only; ask a Grid or grid.py for the group")

    def where(self, name: str, line: int) -> str:
        return f"{self.files[name].relative_to(self.root.parent)}:{line}"

    def floor_violations(self) -> list[str]:
        out = []
        for name, targets in self.edges.items():
            room = room_of(name)
            if room is None:
                out.append(f"{self.files[name]} is in no room; add its package to ROOMS in tests/test_architecture.py "
                           "and to ARCHITECTURE.md")
                continue
            for target, line in targets.items():
                other = room_of(target)
                if other is None or other == room:
                    continue
                if FLOORS[other] > FLOORS[room]:
                    out.append(f"{self.where(name, line)} imports {target}: {room} (floor {FLOORS[room]}) may not "
                               f"import {other} (floor {FLOORS[other]}); move the shared code down to {room} or below")
                elif FLOORS[other] == FLOORS[room]:
                    out.append(f"{self.where(name, line)} imports {target}: {room} and {other} are sibling rooms of "
                               f"floor {FLOORS[room]} and may not import each other")
        return out

    def cycles(self) -> list[list[str]]:
        """Every strongly connected component of more than one module (Tarjan), each sorted."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        found: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in self.edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for v in self.edges:
            if v not in index:
                visit(v)
        return found


GRAPH = Graph(ROOT)


def test_no_import_runs_upward():
    problems = GRAPH.floor_violations()
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    cycles = GRAPH.cycles()
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_function_level_mimo_imports():
    assert not GRAPH.lazy, "\n".join(GRAPH.lazy)


def test_process_groups_only_in_grid():
    assert not GRAPH.groups, "\n".join(GRAPH.groups)


def test_no_file_over_450_lines():
    long = [f"{GRAPH.files[m].relative_to(ROOT.parent)} has {n} lines; split it (at most {MAX_LINES})"
            for m, n in GRAPH.lines.items() if n > MAX_LINES]
    assert not long, "\n".join(long)


def test_no_function_over_60_lines():
    long = [f"{GRAPH.files[key.split(':')[0]].relative_to(ROOT.parent)}:{key.split(':')[2]} {key.split(':')[1]}() "
            f"has {n} lines; split it (at most {MAX_FUNCTION_LINES})"
            for key, n in GRAPH.function_lines.items()
            if n > MAX_FUNCTION_LINES and key.rsplit(":", 1)[0] not in LONG_FUNCTIONS_ALLOWED]
    assert not long, "\n".join(long)


def test_every_folder_is_a_package():
    missing = [str(d.relative_to(ROOT.parent)) for d in [ROOT, *ROOT.rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").is_file()]
    assert not missing, f"folders without __init__.py (setuptools skips them): {missing}"


def test_the_checks_see_the_whole_package():
    """The walk found the floors' rooms and the edges between them (a check over nothing would pass)."""
    rooms = {room_of(m) for m in GRAPH.files}
    assert rooms == set(FLOORS), rooms ^ set(FLOORS)
    assert any(t.startswith("mimo.models.") for t in GRAPH.edges["mimo.train.trainer"])
    assert "mimo.parallel.grid" in GRAPH.edges["mimo.parallel.bridge.colocated"]


def test_imports_between_tests_go_through_support():
    """`from tests.unit.test_x import helper` couples two test files: the helper belongs in tests/support/."""
    bad, through_support = [], 0
    for path in TESTS.rglob("*.py"):
        package = ".".join(path.relative_to(TESTS.parent).parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "tests.support" or name.startswith("tests.support."):
                    through_support += 1
                elif name.startswith("tests.") or name == "tests":
                    bad.append(f"{path.relative_to(TESTS.parent)}:{node.lineno} imports {name}")
    assert not bad, "move what these share into tests/support/:\n" + "\n".join(bad)
    assert through_support > 100, through_support  # the walk saw the suites' imports


MODEL_NAMES = {"model", "mimo_model", "language_model", "lm", "block", "layer"}
"""Names that hold a model or one of its parts throughout mimo/ (`model.X`, `self.model.X`, `lm.X`, `block.X`)."""
RUNTIME_ATTRIBUTES = {"forward", "runtime", "bridges", "output_bridges", "shard_sequence", "gather_sequence",
                      "mask_positions", "loss_fn", "logits_fn", "modality_autocast", "autocast", "lm_attention",
                      "layout_attention", "attention_fn"}
"""Attributes through which a model computes: set on nothing outside mimo/models/, whatever it is called."""


def module_classes(sources: list[str]) -> frozenset[str]:
    """The names of the classes in `sources` that are `nn.Module`s: those whose base is one of torch's module
    classes (`nn.Module`, `nn.Linear`, ...) or, transitively, another such class."""
    bases = {cls.name: [ast.unparse(b).rsplit(".", 1)[-1] for b in cls.bases] for src in sources
             for cls in ast.walk(ast.parse(src)) if isinstance(cls, ast.ClassDef)}
    found = {"Module", "Linear", "Embedding", "LayerNorm", "Conv1d", "Conv2d", "ModuleList", "ModuleDict",
             "Sequential", "Identity", "Parameter"}  # torch's (a Parameter swapped in is surgery too)
    while grown := {name for name, of in bases.items() if name not in found and found & set(of)}:
        found |= grown
    return frozenset(found)


def model_attributes(model_sources: list[str], all_sources: list[str]) -> frozenset[str]:
    """What a model part holds: the attributes the `nn.Module` classes of `model_sources` (mimo/models/) store on
    `self` or register as buffers and parameters, less every field name of a dataclass or NamedTuple in
    `all_sources` (a config or output object with such a field is no model part)."""
    modules, names, fields = module_classes(all_sources), set(), set()
    for src in all_sources:
        for cls in (n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef)):
            if any("dataclass" in ast.unparse(d) for d in cls.decorator_list) or \
                    any(ast.unparse(b).endswith("NamedTuple") for b in cls.bases):
                fields |= {s.target.id for s in cls.body
                           if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for src in model_sources:
        for cls in (n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name in modules):
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _receiver_name(node.value) \
                        == "self" and isinstance(node.value, ast.Name):
                    names.add(node.attr)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and \
                        node.func.attr in {"register_buffer", "register_parameter"} and \
                        isinstance(node.args[0], ast.Constant):
                    names.add(node.args[0].value)
    return frozenset(names - fields)


def _is_child_swap(node: ast.AST, modules: frozenset[str]) -> bool:
    """`x.child = None` or `x.child = SomeModule(...)` (a class of `modules`): replacing or dropping a child
    module or parameter, PyTorch's module surgery (how a layout applies tensor parallelism or cuts a pipeline
    stage, as torchtitan's does)."""
    if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Attribute):
        return False
    value = node.value
    if isinstance(value, ast.Constant) and value.value is None:
        return True
    func = value.func if isinstance(value, ast.Call) else None
    return (func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "") in modules


def _receiver_name(node: ast.expr) -> str:
    """The last name of an attribute's owner: `model` for `model.x`, `self.model.x` and `trainer.model.x`."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _stores(tree: ast.AST) -> list[tuple[ast.AST, str, str]]:
    """Every (node, owner, attribute) that sets or deletes an attribute: `o.a = / del o.a / o.a += ...`,
    `o.a[...] =`, `setattr(o, "a", ...)` / `delattr` (a computed name reads `<computed>`)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.append((node, _receiver_name(node.value), node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"setattr", "delattr"}:
            given = node.args[1] if len(node.args) > 1 else None
            attr = given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else "<computed>"
            out.append((node, _receiver_name(node.args[0]) if node.args else "", attr))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                isinstance(node.value, ast.Attribute):
            out.append((node, _receiver_name(node.value.value), node.value.attr))
    return out


def model_patches(source: str, where: str, attributes: frozenset[str] = frozenset(),
                  modules: frozenset[str] = frozenset()) -> list[str]:
    """Where a file outside mimo/models/ sets (or deletes) an attribute of a model or of one of its parts: any
    store into `<model>.x` or `<model>.x[...]`; into `x.forward`, `x.loss_fn`... (those through which a model
    computes) or `x.<a>` for any attribute a model part holds (`attributes`, `model_attributes`: e.g.
    `moe.expert_offset`, `attn.fused_qkv`), whatever `x` is called; `setattr`/`delattr` of such names, and
    `x.__dict__[...] =`. An object's own attributes (`self.x`) and replacing or dropping a child module (a class
    of `modules` or of this file, `_is_child_swap`) are not patching."""
    tree, out = ast.parse(source, filename=where), []
    modules = modules | module_classes([source])
    swaps = {id(n.targets[0]) for n in ast.walk(tree) if _is_child_swap(n, modules)}
    for node, owner, attr in _stores(tree):
        own = isinstance(node, (ast.Attribute, ast.Subscript)) and _receiver_name(
            node.value if isinstance(node, ast.Attribute) else node.value.value) in {"self", "cls"}
        own = own and not (isinstance(node, ast.Subscript) and attr == "__dict__")
        watched = RUNTIME_ATTRIBUTES | attributes | {"__dict__"}
        if own or id(node) in swaps or (owner not in MODEL_NAMES and attr not in watched):
            continue
        out.append(f"{where}:{node.lineno} sets `{owner}.{attr}` from outside mimo/models/: a model is changed "
                   "only through its runtime (MimoModel.set_runtime / MimoModel.running, mimo.models.runtime), its "
                   "own methods (e.g. MoEFeedForward.keep_experts, SelfAttention.fuse_qkv), PyTorch's module APIs "
                   "(hooks, composable checkpoint, compile, fully_shard) or by replacing a child module")
    return out


def test_no_bound_methods_are_installed():
    """`types.MethodType` (or a function's `__get__`) binds a function to an object from outside its class."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            named = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            imported = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if named in {"MethodType", "__get__"} or "MethodType" in imported:
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} binds a method from outside its class "
                             "(types.MethodType); give the model a runtime or wrap the module with PyTorch's APIs")
    assert not found, "\n".join(found)


def _sources(under: Path) -> list[str]:
    return [path.read_text() for path in sorted(under.rglob("*.py"))]


def test_models_are_not_patched_from_outside():
    models = ROOT / "models"
    attributes, modules = model_attributes(_sources(models), _sources(ROOT)), module_classes(_sources(ROOT))
    found = [p for path in sorted(ROOT.rglob("*.py")) if models not in path.parents
             for p in model_patches(path.read_text(), str(path.relative_to(ROOT.parent)), attributes, modules)]
    assert not found, "\n".join(found)


def test_the_patch_rule_sees_patches():
    """The rule catches each form it names, and lets an object's own attributes and child-module swaps pass (a
    rule that matched nothing would pass on any tree)."""
    code = ("model.loss_fn = f\nself.model.bridges['a'] = b\nmodel.a, model.b = 1, 2\nblock.forward = g\n"
            "x.forward = g\nsetattr(lm, 'chunked', f)\ndel model.shard_sequence\nm.__dict__['forward'] = g\n"
            "self.__dict__['x'] = 1\nmodel.runtime.loss_fn = f\nx.runtime.bridges['a'] = b\n"
            "lm.lm_head = Head(lm.lm_head)\nlm.norm = None\nmodule.weight_scale = 2\nself.bridges = {}\n"
            "lm.head = types.MethodType(f, lm)\nclass Head(nn.Module):\n    pass\n")
    lines = sorted(int(p.split(":")[1].split()[0]) for p in model_patches(code, "sample.py"))
    assert lines == [1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16], lines


def plan_tests(source: str, where: str) -> list[str]:
    """Where code tests a plan (`plan`, `x.plan`) for None or for truth: `plan is None`, `plan is not None`,
    `if plan`, `a if plan else b`, `plan and ...`."""
    def is_plan(node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id == "plan" or isinstance(node, ast.Attribute) and \
            node.attr == "plan"

    found = []
    for node in ast.walk(ast.parse(source, filename=where)):
        if isinstance(node, ast.Compare) and is_plan(node.left) and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            found.append(node)
        elif isinstance(node, (ast.If, ast.IfExp, ast.While)) and is_plan(node.test):
            found.append(node)
        elif isinstance(node, ast.BoolOp) and any(is_plan(v) for v in node.values):
            found.append(node)
    return [f"{where}:{n.lineno} tests a plan for None; one process has a ParallelPlan too (its services are "
            "identities): ask it" for n in found]


def test_the_trainer_asks_its_plan_at_every_world_size():
    found = [p for path in sorted((ROOT / "train").rglob("*.py"))
             for p in plan_tests(path.read_text(), str(path.relative_to(ROOT.parent)))]
    assert not found, "\n".join(found)


def test_the_plan_rule_sees_tests_for_none():
    code = ("if self.plan is None:\n    pass\nx = plan is not None\ny = a if self.plan else b\nz = plan and plan.x\n"
            "if plan:\n    pass\nw = self.plan.pipeline is None\n")
    lines = sorted(int(p.split(":")[1].split()[0]) for p in plan_tests(code, "sample.py"))
    assert lines == [1, 3, 4, 5, 6], lines


def test_the_patch_rule_sees_a_model_parts_own_attributes_and_not_a_configs():
    """Stores into what a model part holds, under any name (`moe`, `module`, `m`), fail; the same statement on a
    config or output object (a dataclass field, even one a module also stores) or a tensor passes."""
    model = ("class Attn(nn.Module):\n    def __init__(self):\n        self.fused_qkv = False\n        self.heads = 2\n"
             "        self.register_buffer('expert_bias', None)\nclass Moe(Attn):\n    def f(self):\n"
             "        self.expert_offset = self.dispatcher = 0\n")
    config = "@dataclass\nclass Cfg:\n    heads: int = 2\n"
    attributes = model_attributes([model], [model, config])
    assert attributes == {"fused_qkv", "expert_bias", "expert_offset", "dispatcher"}, attributes
    code = ("moe.expert_offset = 3\nmodule.fused_qkv = True\nm.expert_bias += d\nsetattr(moe, 'dispatcher', f)\n"
            "moe.dispatcher = Dispatch(group)\ncfg.heads = 4\nm.heads = 4\np.grad = None\nout.loss_sum = s\n"
            "attn.o_proj = RowParallel(attn.o_proj)\nmoe.w_up = nn.Parameter(w)\nclass RowParallel(nn.Linear):\n"
            "    pass\n")
    lines = sorted(int(p.split(":")[1].split()[0]) for p in model_patches(code, "sample.py", attributes))
    assert lines == [1, 2, 3, 4, 5], lines
    real = model_attributes(_sources(ROOT / "models"), _sources(ROOT))
    assert {"expert_offset", "fused_qkv", "loss_scale", "row_stats", "expert_bias"} <= real
    assert not {"heads", "offset", "hidden", "layers"} & real  # config fields: no false alarms on configs
