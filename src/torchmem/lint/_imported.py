"""What the class of a called model does, read from this file or the file of the project that defines
it: the one place the linter looks beyond the file it checks (round X). A loop that calls
``model(data, mode="inference")`` on ``model = Pix2PixModel(opt)`` (``from models.pix2pix_model import
Pix2PixModel``) records no graph when that class's ``forward`` runs the ``mode == "inference"`` branch under
``torch.no_grad()`` (SPADE's and Bringing-Old-Photos-Back-to-Life's test scripts: TM002 said otherwise);
nor does one whose ``forward`` is decorated with ``@torch.no_grad()``, nor a class that is no module (round
Z).

The imported module is looked for as Python would find it from the checked file's folder or a folder
above it (up to four levels: a script run from the repository's root or from its own folder); a module
that cannot be found or parsed decides nothing. Each file is parsed once per process."""

from __future__ import annotations

import ast
import os
import re
import weakref

from torchmem.lint._syntax import is_const, no_grad_item
from torchmem.lint._walk import Scope, Walker

_UP = 4  # folders above the checked file's where an absolute import may start
_CACHE: dict[tuple[str, int, int], ast.Module | None] = {}
_CACHE_MAX = 256
# A class found in another file of the project -> (the class, that file's tree, its path).
_TREES: dict[int, tuple[ast.ClassDef, ast.Module, str]] = {}


def forward_off(call: ast.Call, scope: Scope, w: Walker) -> bool:
    """Whether ``call`` (``model(x)``) records no graph by what the class of ``model``, defined in this file
    or imported from a module of the project, says: its ``forward`` is decorated with ``@torch.no_grad()``
    (LLaMA-VID's vision towers, round Z), the class is no ``nn.Module`` and its ``__call__`` calls no part of
    it (OmniDrive's TensorRT wrapper with its own ``eval()``, round Z), or the branch of its ``forward`` that
    ``model(x, mode="inference")`` runs is under ``no_grad`` (round X)."""
    if not isinstance(call.func, ast.Name):
        return False
    cls = _class_of(call.func.id, scope, w)
    if cls is None:
        return False
    methods = {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if not _may_be_module(cls):
        run = methods.get("__call__")
        return run is None or _decorated_off(run) or not _calls_own_part(run, methods)
    forward = methods.get("forward")
    if forward is None:
        return False
    if _decorated_off(forward) or _body_off(forward):
        return True
    if _head_only(cls, forward, w):
        return True
    choices = [
        (k.arg, k.value.value)
        for k in call.keywords
        if k.arg is not None and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)
    ]
    params = {a.arg for a in forward.args.args + forward.args.kwonlyargs}
    return any(arg in params and _branch_off(forward, arg, value) for arg, value in choices)


def _may_be_module(cls: ast.ClassDef) -> bool:
    """False for a class with no base but ``object``: no ``nn.Module`` (a base of the project's may be)."""
    return any(not (isinstance(b, ast.Name) and b.id == "object") for b in cls.bases)


def _decorated_off(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(no_grad_item(d) == 1 for d in fn.decorator_list)


# Parts that record one small graph of their own on top of a part that records none (a head).
_HEAD_PARTS = frozenset({"Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "Identity"})


def _head_only(cls: ast.ClassDef, forward: ast.FunctionDef | ast.AsyncFunctionDef, w: Walker) -> bool:
    """Whether ``forward`` runs a part whose forward records nothing (a backbone under ``no_grad``) and,
    besides it, only head layers (``nn.Linear``, norms): qserve's ``LlamaForCausalLM`` (round BB), a linear
    probe on a frozen backbone. The graph it records is the head's, on an input that needs no grad: no
    training-sized activations. Parts are what ``__init__`` assigns to ``self.<name>``, their classes looked
    up where ``cls`` is defined."""
    init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is None:
        return False
    made: dict[str, ast.Call] = {}
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    made[t.attr] = node.value
    entry = _TREES.get(id(cls))
    tree, path = (entry[1], entry[2]) if entry is not None and entry[0] is cls else (w.module.node, w.path)
    off = 0
    for node in ast.walk(forward):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"):
            continue
        part = made.get(f.attr)
        if part is None:
            return False  # a method of its own, or a part not made in __init__: not known
        name = part.func.attr if isinstance(part.func, ast.Attribute) else getattr(part.func, "id", "")
        if name in _HEAD_PARTS:
            continue
        inner = _class_in(tree, path, name) if isinstance(part.func, ast.Name) else None
        fwd = (
            next((s for s in inner.body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None)
            if inner is not None
            else None
        )
        if fwd is None or not (_decorated_off(fwd) or _body_off(fwd)):
            return False
        off += 1
    return off > 0


def _class_in(tree: ast.AST, path: str, name: str) -> ast.ClassDef | None:
    """The class ``name`` defined at the top of ``tree`` (the file at ``path``) or imported there."""
    if not isinstance(tree, ast.Module):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    found = _binding_import(tree, name)
    if found is None:
        return None
    imp, original = found
    return _find_class(path, imp.module, imp.level, original, 0)


def _body_off(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``fn``'s work all runs under ``with torch.no_grad():`` (qserve's ``LlamaModel.forward``, round
    BB): every statement but a docstring and a ``return`` of what the block computed (no call) is such a
    block."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    blocks = [s for s in body if isinstance(s, (ast.With, ast.AsyncWith))]
    if not blocks:
        return False
    for s in body:
        if isinstance(s, (ast.With, ast.AsyncWith)):
            if not any(no_grad_item(i.context_expr) == 1 for i in s.items):
                return False
        elif isinstance(s, ast.Return):
            if s.value is not None and any(isinstance(n, ast.Call) for n in ast.walk(s.value)):
                return False
        else:
            return False
    return True


def _calls_own_part(
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef],
    depth: int = 0,
) -> bool:
    """Whether ``fn`` calls an attribute of ``self`` that is no method of the class (``self.model(x)``: a
    wrapper around a model) or something it was handed (``fn(x)``); ``self.forward(...)`` is followed into
    the class's own method."""
    params = {a.arg for a in fn.args.args[1:]}
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            own = methods.get(f.attr)
            if own is None:
                return True
            if own is not fn and (depth >= 3 or _calls_own_part(own, methods, depth + 1)):
                return True
        elif isinstance(f, ast.Name) and f.id in params:
            return True
    return False


def _class_of(name: str, scope: Scope, w: Walker) -> ast.ClassDef | None:
    """The class ``name`` was last bound from a call of (``Pix2PixModel(opt)``, ``Net().cuda()``), when
    that class is defined at the top of this file or imported from a module of the project."""
    bound = [b for b in scope.bindings.get(name, ()) if b.value is not None] or [
        b for b in w.module.bindings.get(name, ()) if b.value is not None
    ]
    value: ast.expr | None = None
    for b in sorted(bound, key=lambda b: -b.line):
        value = b.value
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            value = value.func.value  # `.cuda()`, `.to(device)`, `.eval()` on the model made
        if not (isinstance(value, ast.Name) and value.id == name):
            break
        # `model = model.eval()` (qserve, round BB): the same object, made by an earlier binding
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    if not isinstance(w.module.node, ast.Module):
        return None
    here = [n for n in w.module.node.body if isinstance(n, ast.ClassDef) and n.name == value.func.id]
    if here:
        return here[-1]
    found = _binding_import(w.module.node, value.func.id)
    if found is None:
        return None
    node, original = found
    return _find_class(w.path, node.module, node.level, original, 0)


def _binding_import(tree: ast.Module, name: str) -> tuple[ast.ImportFrom, str] | None:
    """The top-level ``from ... import`` of ``tree`` that binds ``name``, and the name it imports there
    (``name`` itself, or the one ``... as name`` renames)."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == name:
                    return node, a.name
    return None


def _find_class(path: str, module: str | None, level: int, name: str, depth: int) -> ast.ClassDef | None:
    tree, where = _module_tree(path, module, level)
    if tree is None or where is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            if len(_TREES) >= _CACHE_MAX:
                _TREES.clear()
            _TREES[id(node)] = (node, tree, where)  # (its parts' classes are looked up there)
            return node
    found = _binding_import(tree, name) if depth < 2 else None
    if found is not None:  # a package's `__init__` that imports the class from one of its modules
        node, original = found
        return _find_class(where, node.module, node.level, original, depth + 1)
    return None


def _module_tree(path: str, module: str | None, level: int) -> tuple[ast.Module | None, str | None]:
    """The parsed file of ``from <level dots><module> import ...`` written in ``path``, and its path."""
    parts = module.split(".") if module else []
    here = os.path.dirname(os.path.abspath(path))
    if level:
        for _ in range(level - 1):
            here = os.path.dirname(here)
        bases = [here]
    else:
        bases = [here]
        for _ in range(_UP):
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
            bases.append(here)
    for base in bases:
        target = os.path.join(base, *parts)
        for candidate in (target + ".py", os.path.join(target, "__init__.py")):
            if parts and os.path.isfile(candidate):
                return _parsed(candidate), candidate
    return None, None


def _parsed(path: str) -> ast.Module | None:
    """The file parsed; again when it changed since (a process that lints, the user edits, it lints)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        try:
            with open(path, "rb") as f:
                _CACHE[key] = ast.parse(f.read(), path)
        except (OSError, SyntaxError, ValueError):
            _CACHE[key] = None
    return _CACHE[key]


def _branch_off(forward: ast.AST, arg: str, value: str) -> bool:
    """``if <arg> == "<value>":`` (or ``elif``, or ``in (...)`` listing it) in ``forward`` whose body runs
    its computation under ``no_grad``: every statement is a ``with`` that turns autograd off, or hands back
    what was computed there (a ``return`` or an assignment without a call)."""
    for node in ast.walk(forward):
        if not isinstance(node, ast.If) or not _tests(node.test, arg, value):
            continue
        off = False
        for s in node.body:
            if isinstance(s, (ast.With, ast.AsyncWith)) and any(
                no_grad_item(item.context_expr) == 1 for item in s.items
            ):
                off = True
            elif isinstance(s, (ast.Return, ast.Assign, ast.Expr, ast.Pass)) and not any(
                isinstance(n, ast.Call) for n in ast.walk(s)
            ):
                continue
            else:
                return False
        return off
    return False


def _tests(test: ast.expr, arg: str, value: str) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    left, right = test.left, test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    if not (isinstance(left, ast.Name) and left.id == arg):
        return False
    if isinstance(test.ops[0], ast.Eq):
        return isinstance(right, ast.Constant) and right.value == value
    if isinstance(test.ops[0], ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value == value for e in right.elts)
    return False


# Calls that leave no graph of what they are given: `val.detach()`, `val.item()`, `float(val)`, ...
_CUTS = frozenset({"detach", "item", "tolist", "numpy", "float", "int", "detach_"})


def imported_update_keeps(name: str, scope: Scope, w: Walker) -> bool | None:
    """Whether ``name.update(x)``, ``name`` made by a class imported from a module of the project, keeps
    ``x`` with its graph in an attribute: its ``update`` stores the argument itself (``self.sum += val``)
    rather than what cuts the graph (``val.detach().cpu()``, ``val.item()``, anycost-gan's
    ``DistributedMeter``, round CC: TM007 said it kept each step's loss); ``None`` when the class or its
    ``update`` is not found or stores nothing of the argument."""
    cls = _class_of(name, scope, w)
    members = cls.body if cls is not None else []
    update = next(
        (s for s in members if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "update"),
        None,
    )
    if update is None or len(update.args.args) < 2:
        return None
    arg = update.args.args[1].arg
    cut: set[int] = set()  # ids of the argument's uses under a call that cuts the graph
    for n in ast.walk(update):
        fn = n.func if isinstance(n, ast.Call) else None
        called = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if called in _CUTS:
            cut.update(id(x) for x in ast.walk(n) if isinstance(x, ast.Name) and x.id == arg)
    rebinds = [
        n.value for n in ast.walk(update)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == arg for t in n.targets)
    ]  # fmt: skip
    if rebinds:
        # `val = val.detach()` first: what is stored later is cut; any other rebinding is not read here
        made_clean = all(
            any(id(x) in cut for x in ast.walk(v) if isinstance(x, ast.Name) and x.id == arg) for v in rebinds
        )
        return False if made_clean and _stores(update, arg) else None
    uses = _stores(update, arg)
    return any(id(x) not in cut for x in uses) if uses else None


def _stores(fn: ast.AST, arg: str) -> list[ast.Name]:
    """The uses of ``arg`` in what ``fn`` stores on ``self`` (assigned, added to, appended)."""
    out: list[ast.Name] = []
    for n in ast.walk(fn):
        value: list[ast.AST] = []
        if (isinstance(n, ast.Assign) and any(_on_self(t) for t in n.targets)) or (
            isinstance(n, ast.AugAssign) and _on_self(n.target)
        ):
            value = [n.value]
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("append", "extend", "add")
            and _on_self(n.func.value)
        ):
            value = list(n.args)
        out += [x for v in value for x in ast.walk(v) if isinstance(x, ast.Name) and x.id == arg]
    return out


def _on_self(node: ast.AST) -> bool:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return True
        node = node.value
    return False


_PROJECT_FILES_MAX = 3000  # files of a project read to find who imports a function (more: not looked for)
_IMPORTERS: dict[str, list[tuple[str, frozenset[str]]]] = {}  # project root -> (file, names it imports)
_IMPORT_RE = re.compile(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)


def _project_root(path: str) -> str:
    """The folder above the checked file's top package (its own folder for a file in no package)."""
    here = os.path.dirname(os.path.abspath(path))
    while os.path.isfile(os.path.join(here, "__init__.py")) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    return here


def _importers(root: str) -> list[tuple[str, frozenset[str]]]:
    """Every Python file under ``root`` (bounded) with the names its ``from ... import`` lines import."""
    found = _IMPORTERS.get(root)
    if found is not None:
        return found
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "site-packages")]
        for f in files:
            if not f.endswith(".py"):
                continue
            if len(found) >= _PROJECT_FILES_MAX:
                break
            p = os.path.join(folder, f)
            try:
                with open(p, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            names = {w for m in _IMPORT_RE.findall(text) for w in re.findall(r"\w+", m)}
            found.append((p, frozenset(names)))
    if len(_IMPORTERS) >= 16:
        _IMPORTERS.clear()
    _IMPORTERS[root] = found
    return found


def called_under_no_grad_elsewhere(name: str, w: Walker, owner: str | None = None) -> bool:
    """Whether another file of the project imports the function ``name`` from the checked file and calls it
    under ``no_grad`` (a ``@torch.no_grad()`` entry point, a ``with torch.no_grad():`` block): as a caller in
    the same file does, it decides that the function's forward passes record no graph (smoothquant's
    ``get_act_scales``, called only from ``examples/generate_act_scales.py``'s ``@torch.no_grad()`` ``main``,
    round CC: TM002 said otherwise). For a method, ``owner`` is its class: a file that imports the class and
    calls ``.name(...)`` under ``no_grad`` (ipex-llm's ``BigDLPPL.perplexity_hf``, called from
    ``run_longbench.py``'s ``@torch.no_grad()`` ``main``, round HH). Looked for only where a finding is about
    to be made."""
    me = os.path.abspath(w.path)
    imported = owner or name
    for path, names in _importers(_project_root(w.path)):
        if imported not in names or os.path.abspath(path) == me:
            continue
        tree = _parsed(path)
        found = _binding_import(tree, imported) if tree is not None else None
        if found is None or found[1] != imported:
            continue
        _, where = _module_tree(path, found[0].module, found[0].level)
        if where is None or os.path.abspath(where) != me:
            continue
        try:
            caller = Walker(tree, path)  # type: ignore[arg-type]
        except Exception:  # a file the walker cannot read decides nothing
            continue
        if name in caller.facts.called_under_no_grad:
            return True
    return False


def frozen_model(name: str, scope: Scope, w: Walker, depth: int = 0) -> bool:
    """Whether the model ``name`` (bound from a class, or a parameter that every caller in the file fills
    with one, through up to three callers' own parameters) is an instance of a class whose ``__init__``
    turns off ``requires_grad`` for all of its parameters (pytorch-fid's ``InceptionV3(requires_grad=
    False)``, PickScore, round CC: TM002 said its forward passes record graphs)."""
    cls = _class_of(name, scope, w)
    if cls is not None:
        return _freezes_itself(cls, _made_by(name, scope))
    if scope.kind != "function" or name not in scope.params or scope.cls is not None:
        return False
    pos = scope.params.index(name)
    callers = 0
    for other, n in _calls_by_name(w).get(scope.name, ()):
        if other is scope:
            continue
        positional = n.args[pos] if pos < len(n.args) else None
        arg = next((k.value for k in n.keywords if k.arg == name), positional)
        if not isinstance(arg, ast.Name):
            return False
        given = _class_of(arg.id, other, w)
        if given is not None:
            if not _freezes_itself(given, _made_by(arg.id, other)):
                return False
        elif depth >= 3 or not frozen_model(arg.id, other, w, depth + 1):  # a caller's own parameter
            return False
        callers += 1
    return callers > 0


_CALLS: weakref.WeakKeyDictionary[Walker, dict[str, list[tuple[Scope, ast.Call]]]] = (
    weakref.WeakKeyDictionary()
)


def _calls_by_name(w: Walker) -> dict[str, list[tuple[Scope, ast.Call]]]:
    """Every ``f(...)`` call of the file by the name called, with the scope it is written in (built once)."""
    found = _CALLS.get(w)
    if found is None:
        found = {}
        for sc in w.scopes:
            for n in _own_nodes(sc.node):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                    found.setdefault(n.func.id, []).append((sc, n))
        _CALLS[w] = found
    return found


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes of a scope's own code: not inside the functions, lambdas and classes written in it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        out.append(n)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _made_by(name: str, scope: Scope) -> ast.Call | None:
    """The constructor call ``name`` was last bound from (``InceptionV3([3])``, under ``.cuda()``...)."""
    bound = sorted((b for b in scope.bindings.get(name, ()) if b.value is not None), key=lambda b: -b.line)
    value = bound[0].value if bound else None
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        value = value.func.value
    return value if isinstance(value, ast.Call) else None


def _freezes_itself(cls: ast.ClassDef, made: ast.Call | None) -> bool:
    """``__init__`` sets ``requires_grad`` off for every parameter: ``self.requires_grad_(False)``, or
    ``for p in self.parameters(): p.requires_grad = flag`` with ``flag`` False, or an ``__init__`` argument
    whose default is False that the constructor call ``made`` does not give."""
    init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is None:
        return False
    args = init.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(init.args.defaults) :]], init.args.defaults))

    def off(v: ast.AST) -> bool:
        if isinstance(v, ast.Constant):
            return v.value is False
        if isinstance(v, ast.Name) and v.id in defaults and is_const(defaults[v.id], False):
            given = made is not None and (
                any(k.arg == v.id for k in made.keywords)
                or len(made.args) >= [a.arg for a in args].index(v.id)  # positional (self not counted)
            )
            return not given
        return False

    for n in init.body:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call):
            f = n.value.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "requires_grad_"
                and _is_self(f.value)
                and n.value.args
                and off(n.value.args[0])
            ):
                return True
        if (
            isinstance(n, ast.For)
            and isinstance(n.target, ast.Name)
            and isinstance(n.iter, ast.Call)
            and isinstance(n.iter.func, ast.Attribute)
            and n.iter.func.attr == "parameters"
            and _is_self(n.iter.func.value)
        ):
            for s in n.body:
                if (
                    isinstance(s, ast.Assign)
                    and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in s.targets)
                    and off(s.value)
                ):
                    return True
    return False


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"
