"""Where a generated method's time goes: ``relay bench --breakdown``.

For one map at one shape (debug off), each method the bench's step calls is timed
against its floor (``relay.bench.floor``: the same torch calls, bare), and then
statement by statement: the method's own source is split into its top-level
statements, each compiled into a function of its own over the method's arguments
and locals (Note [Statement timing]), run in order once to reach the steady state
of a step, then timed interleaved with the whole methods, the floor's methods and an
empty function. A statement's cost is its time (the 10th percentile of its samples,
Note [Low quantile]) less the empty function's (the call and the loop). Each
statement is also counted: the aten ops it dispatches, so the rows that are torch
work and the rows that are relay's Python are told apart by what they do, not by
reading them.

The statements come from the generated module as it is, so the figures can be taken
again after the generator changes, with no change here.
"""

from __future__ import annotations

import ast
import functools
import gc
import inspect
import textwrap
import time
from collections.abc import Callable, Generator, Sequence
from typing import IO, Any

import attrs
import torch

from relay.bench.floor import floor_side
from relay.bench.sides import Generated, Side, Workload, generated_side, pair_named
from relay.bench.sizes import Shape
from relay.bench.timing import balanced_orders, quantile
from relay.opcount import count_ops

__all__ = [
    "MethodBreakdown",
    "StatementCost",
    "breakdown",
    "breakdown_json",
    "render_breakdown",
]

# Note [Statement timing]
# A statement is timed as the body of a function whose globals are one namespace
# holding the method's module globals, its arguments (``self``, ``indices``, ``batch``,
# ``payload``...) and every local an earlier statement assigned (each statement
# function declares the names it assigns ``global``, so the next one sees them).
# Reading a name there is a dict lookup, a few ns dearer than the method's fast
# locals; the method's own time is measured whole beside it, so the sum of its
# statements is checked against it, and the difference is reported as the rest.
# An ``if`` statement also gets a row for each test of its chain (``if``/``elif``),
# timed as an expression: the debug branches and the host-slot test are such tests.
#
# A statement timed alone runs hot (its code, its tensors' headers in the caches);
# inside its method it runs after other work, so the rows under-attribute: on the
# loaded development machine the runtime helpers saved by a hand-edited leaner method
# were up to twice what their rows said. The rows say where to look; time a leaner
# copy (``generated=``) to price a cut.

# Note [Path taken]
# A method's rows are the statements its call runs in the bench's step, in order: the
# body and else block of a ``try`` (its handlers are the refusals' path), and of an
# ``if`` whose body returns, the test (a row of its own) and then the branch it takes,
# up to the first ``return``; statements after it do not run and get no row. So the
# fast path of a write (Note [Fast writes] in relay/runtime.py) is timed as it runs,
# and the checked path behind it is not. Any other ``if`` is one statement, with a
# row per test below it.

# Note [Two passes]
# Whole methods (generated and floor) and payloads are timed in one interleaved pass,
# the statements in a second. Timed among the statements' rows, a method ran colder
# and its figure moved with what else was in the plan (eagle's resolve_seq_lens_cpu,
# over its floor: 1.0 us timed alone, 2.1 us among its own statement rows, 6.6 us
# among the other methods' rows, on the loaded development machine), while the
# floor, with less Python to fetch, moved less. The first pass is the bench's step
# context: the methods and their floors, nothing else.

# Note [Low quantile]
# Other processes only ever add time to a sample (a preemption, a cache flush), never
# remove it. On a shared machine busy most of the time the median sample is a
# disturbed one: on the 2-core development machine at load 5, 150 samples of 30 calls
# of eagle's generated resolve_future read 10.9, 11.2, 16.8, 25.8 and 275 us at the
# 5th, 20th, 50th, 80th and 95th percentiles, and the median moved by tens of percent
# between runs while the low percentiles stayed within a few. So each row is the 10th
# percentile by default (``q``, ``--quantile``); on an idle machine it is close to the
# median, which ``--quantile 0.5`` gives.


@attrs.frozen
class StatementCost:
    """One statement (or one ``if`` test) of a method: its time (Note [Low quantile])
    less the empty function's, in ns, and the aten ops it dispatched when run once."""

    source: str
    ns: float
    ops: tuple[str, ...]
    #: Nesting: 0 a top-level statement, 1 a test inside an ``if`` chain.
    level: int = 0


@attrs.frozen
class MethodBreakdown:
    """One method of one map: whole times (ns) and its statements."""

    schema: str
    shape: Shape
    method: str
    generated_ns: float
    floor_ns: float
    statements: tuple[StatementCost, ...]
    #: Times in ns of extra named items (payload construction), shown apart.
    extras: tuple[tuple[str, float], ...] = ()

    @property
    def overhead_ns(self) -> float:
        """Generated less floor: relay's Python in this method."""
        return self.generated_ns - self.floor_ns

    @property
    def python_ns(self) -> float:
        """The sum of the top-level statements that dispatch no op."""
        return sum(s.ns for s in self.statements if s.level == 0 and not s.ops)


def _method_args(
    method: str, side: Side, payload_cls: type[Any], work: Workload
) -> dict[str, Any]:
    """The arguments the bench's step passes ``method``, by parameter name."""
    fn = getattr(side.map, method)
    names = list(inspect.signature(fn).parameters)
    args: dict[str, Any] = {}
    for name in names:
        if name == "batch":
            args[name] = side.batch
        elif name == "indices":
            args[name] = work.indices
        elif name == "payload":
            fields = [f.name for f in attrs.fields(payload_cls)]
            args[name] = payload_cls(**{f: work.values[f] for f in fields})
        else:
            args[name] = work.values[name]
    return args


def _assigned(node: ast.AST) -> list[str]:
    """Names ``node`` binds (assignment targets, anywhere inside it)."""
    names = {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    return sorted(names)


class _Unannotated(ast.NodeTransformer):
    """``x: T = v`` as ``x = v``: a name declared ``global`` takes no annotation."""

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.stmt:
        if node.value is None:
            return ast.Pass()
        return ast.copy_location(ast.Assign([node.target], node.value), node)


def _compile(node: ast.stmt, namespace: dict[str, Any], tag: str) -> Callable[[], Any]:
    """``node`` as the body of a function over ``namespace`` (Note [Statement timing])."""
    node = ast.fix_missing_locations(_Unannotated().visit(node))
    names = _assigned(node)
    lines = [f"def {tag}():"]
    if names:
        lines.append(f"    global {', '.join(names)}")
    lines.append(textwrap.indent(ast.unparse(node), "    "))
    code = compile("\n".join(lines) + "\n", f"<relay bench --breakdown {tag}>", "exec")
    exec(code, namespace)  # noqa: S102 - the generated module's own statements
    compiled: Callable[[], Any] = namespace.pop(tag)
    return compiled


def _statements(fn: Callable[..., Any]) -> list[ast.stmt]:
    """The top-level statements of ``fn``'s source, its docstring left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    body = list(func.body)
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    return body


def _returns(node: ast.stmt) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))


def _taken(
    nodes: Sequence[ast.stmt], namespace: dict[str, Any], tag: str
) -> Generator[ast.stmt | ast.expr, None, bool]:
    """The statements a call runs, in order (Note [Path taken]), as it runs them: the
    caller runs each before asking for the next, so a test is evaluated over the
    locals of the statements before it. Returns whether the path ended in a
    ``return``."""
    for n, node in enumerate(nodes):
        if isinstance(node, ast.Try) and node.handlers and not node.finalbody:
            # Its else block runs after the body when nothing was raised.
            for part, block in enumerate((node.body, node.orelse)):
                if (yield from _taken(block, namespace, f"{tag}_{n}_{part}")):
                    return True
        elif isinstance(node, ast.If) and _returns(node):
            yield node.test
            holds = _compile(ast.Return(value=node.test), namespace, f"{tag}_{n}t")
            branch = node.body if holds() else node.orelse
            if (yield from _taken(branch, namespace, f"{tag}_{n}b")):
                return True
        elif isinstance(node, ast.Return):
            return True
        else:
            yield node
    return False


def _tests(node: ast.stmt) -> list[ast.expr]:
    """The tests of an ``if``/``elif`` chain."""
    tests: list[ast.expr] = []
    current: ast.stmt | None = node
    while isinstance(current, ast.If):
        tests.append(current.test)
        current = current.orelse[0] if len(current.orelse) == 1 else None
    return tests


def _one_line(node: ast.AST, width: int = 72) -> str:
    text = " ".join(ast.unparse(node).split())
    if isinstance(node, ast.If):
        text = "if " + " ".join(ast.unparse(node.test).split()) + ": ..."
    return text if len(text) <= width else text[: width - 3] + "..."


def _time_all(
    fns: Sequence[Callable[[], Any]], *, repeat: int, sample_ns: int, q: float
) -> list[float]:
    """The ``q`` quantile over repeats of each function's ns per call: each sample
    ``inner`` calls, ``inner`` calibrated per function to about ``sample_ns``; repeats
    interleaved, the orders balanced over repeats (Note [Balanced order] in
    relay/bench/timing.py); the garbage collector off."""
    inners = []
    for fn in fns:
        for _ in range(3):
            fn()
        start = time.perf_counter_ns()
        for _ in range(10):
            fn()
        probe = max(1, (time.perf_counter_ns() - start) // 10)
        inners.append(max(1, min(100_000, sample_ns // probe)))
    samples: list[list[float]] = [[] for _ in fns]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for order in balanced_orders(len(fns), repeat):
            for i in order:
                fn, inner = fns[i], inners[i]
                start = time.perf_counter_ns()
                for _ in range(inner):
                    fn()
                samples[i].append((time.perf_counter_ns() - start) / inner)
    finally:
        if was_enabled:
            gc.enable()
    return [quantile(s, q) for s in samples]


#: A row of a method: (index of its function in the plan, source, level, ops).
_Row = tuple[int, str, int, tuple[str, ...]]


@attrs.define
class _Plan:
    """Everything to time, in one list, and which entries make up each method."""

    fns: list[tuple[str, Callable[[], Any]]] = attrs.field(
        factory=lambda: [("empty", lambda: None)]
    )
    rows: dict[str, list[_Row]] = attrs.field(factory=dict)
    extras: dict[str, list[tuple[str, int]]] = attrs.field(factory=dict)
    #: Entries timed in the first pass (whole methods and payloads), not among the
    #: statements (Note [Two passes]).
    whole: set[int] = attrs.field(factory=set)

    def add(self, name: str, fn: Callable[[], Any], *, whole: bool = False) -> int:
        self.fns.append((name, fn))
        if whole:
            self.whole.add(len(self.fns) - 1)
        return len(self.fns) - 1

    def time(self, *, repeat: int, sample_ns: int, q: float) -> list[float]:
        """Each entry's time less its pass's empty function, in ns."""
        out = [0.0] * len(self.fns)
        passes = (
            sorted(self.whole),
            [i for i in range(1, len(self.fns)) if i not in self.whole],
        )
        for indices in passes:
            times = _time_all(
                [self.fns[0][1]] + [self.fns[i][1] for i in indices],
                repeat=repeat,
                sample_ns=sample_ns,
                q=q,
            )
            for i, t in zip(indices, times[1:]):
                out[i] = t - times[0]
        return out


def _plan_method(
    plan: _Plan,
    method: str,
    side: Side,
    floor_call: Callable[[], None],
    gen: Generated,
    work: Workload,
) -> None:
    """Add ``method`` to ``plan``: whole (generated and floor), the payload its caller
    builds, and each statement and ``if`` test, run once in order (Note [Statement
    timing]) and counted."""
    fn = getattr(side.map, method)
    args = _method_args(method, side, gen.payload_cls, work)
    # Positional, as the bench's step calls it (relay.bench.sides.build_side).
    plan.add(f"{method}:generated", functools.partial(fn, *args.values()), whole=True)
    plan.add(f"{method}:floor", floor_call, whole=True)
    if "payload" in args:
        make: Callable[..., Any] = gen.payload_cls
        kwargs = {f.name: work.values[f.name] for f in attrs.fields(gen.payload_cls)}
        label = f"{gen.payload_cls.__name__}(**fields) (built by the caller)"
        index = plan.add("payload", functools.partial(make, **kwargs), whole=True)
        plan.extras.setdefault(method, []).append((label, index))
    namespace: dict[str, Any] = dict(vars(inspect.getmodule(fn)))
    namespace.update(self=side.map, **args)
    rows: list[_Row] = []
    for n, node in enumerate(_taken(_statements(fn), namespace, "_p")):
        if isinstance(node, ast.expr):  # the test of an if on the path
            holds = _compile(ast.Expr(value=node), namespace, f"_s{n}")
            index = plan.add(f"{method}:{n}", holds)
            rows.append((index, f"if {_one_line(node)}:", 0, count_ops(holds).data))
            continue
        run = _compile(node, namespace, f"_s{n}")
        ops = count_ops(run).data  # runs it once: later statements see its locals
        rows.append((plan.add(f"{method}:{n}", run), _one_line(node), 0, ops))
        for t, test in enumerate(_tests(node)):
            check = _compile(ast.Expr(value=test), namespace, f"_s{n}t{t}")
            word = "if" if t == 0 else "elif"
            index = plan.add(f"{method}:{n}:test{t}", check)
            rows.append((index, f"{word} {_one_line(test)}", 1, ()))
    plan.rows[method] = rows


def breakdown(
    schema: str,
    shape: Shape,
    *,
    generated: Generated | None = None,
    repeat: int = 100,
    sample_us: float = 300.0,
    q: float = 0.1,
    seed: int = 0,
) -> list[MethodBreakdown]:
    """Per method of the bench's step, generated against floor and statement by
    statement, on the CPU (debug off). ``generated`` overrides the bundled module
    (for instance a hand-edited copy, to price a leaner method before the generator
    emits it); its step must dispatch the floor's ops. Each figure is the ``q``
    quantile over ``repeat`` samples (Note [Low quantile])."""
    device = torch.device("cpu")
    pair = pair_named(schema)
    gen = generated or Generated.load(schema)
    work = Workload.random(
        shape, device, torch.Generator().manual_seed(seed), spec=pair.spec
    )
    side = generated_side(gen, shape, device, work)
    bare = floor_side(schema, shape, device, work)
    side.step()
    bare.step()
    floor_calls = dict(bare.calls)
    methods = [name for name, _ in side.calls if hasattr(side.map, name)]
    plan = _Plan()
    for method in methods:
        _plan_method(plan, method, side, floor_calls[method], gen, work)
    times = plan.time(repeat=repeat, sample_ns=int(sample_us * 1000), q=q)
    by_name = {name: t for (name, _), t in zip(plan.fns, times)}
    return [
        MethodBreakdown(
            schema=schema,
            shape=shape,
            method=method,
            generated_ns=by_name[f"{method}:generated"],
            floor_ns=by_name[f"{method}:floor"],
            statements=tuple(
                StatementCost(source, times[i], ops, level)
                for i, source, level, ops in plan.rows[method]
            ),
            extras=tuple((label, times[i]) for label, i in plan.extras.get(method, [])),
        )
        for method in methods
    ]


def render_breakdown(results: Sequence[MethodBreakdown], file: IO[str]) -> None:
    """Plain text: per map and shape the step's total, then per method the whole
    times and one row per statement (``[ops]`` it dispatches; ``-`` none)."""
    groups: dict[tuple[str, str], list[MethodBreakdown]] = {}
    for r in results:
        groups.setdefault((r.schema, r.shape.label), []).append(r)
    for (schema, label), methods in groups.items():
        gen = sum(m.generated_ns for m in methods)
        extra = sum(ns for m in methods for _, ns in m.extras)
        floor = sum(m.floor_ns for m in methods)
        print(
            f"\n== {schema} {label}: the relay methods of one step, generated "
            f"{gen / 1000:.2f} us + payload {extra / 1000:.2f} us, floor "
            f"{floor / 1000:.2f} us: {(gen + extra) / floor:.2f}x "
            f"({gen / floor:.2f}x without the payload)",
            file=file,
        )
        for r in methods:
            ratio = r.generated_ns / r.floor_ns if r.floor_ns > 0 else float("nan")
            print(
                f"\n{r.method}: generated {r.generated_ns / 1000:.2f} us, floor "
                f"{r.floor_ns / 1000:.2f} us, relay's Python {r.overhead_ns / 1000:.2f} "
                f"us ({ratio:.2f}x)",
                file=file,
            )
            for s in r.statements:
                indent = "    " * (s.level + 1)
                ops = ", ".join(s.ops) if s.ops else ("-" if s.level == 0 else "")
                tail = f"  [{ops}]" if ops else ""
                print(f"{s.ns / 1000:8.3f} us  {indent}{s.source}{tail}", file=file)
            rest = r.overhead_ns - r.python_ns
            print(
                f"{r.python_ns / 1000:8.3f} us  = the statements without ops\n"
                f"{rest / 1000:8.3f} us  = the rest of relay's Python (inside the op "
                "statements, the call)",
                file=file,
            )
            for label_, ns in r.extras:
                print(f"{ns / 1000:8.3f} us  + {label_}", file=file)


def breakdown_json(results: Sequence[MethodBreakdown]) -> list[dict[str, Any]]:
    """A JSON-ready list of the methods, their statements and extras."""
    return [
        {
            "schema": r.schema,
            **attrs.asdict(r.shape),
            "label": r.shape.label,
            "method": r.method,
            "generated_ns": r.generated_ns,
            "floor_ns": r.floor_ns,
            "statements": [
                {"source": s.source, "ns": s.ns, "ops": list(s.ops), "level": s.level}
                for s in r.statements
            ],
            "extras": [{"what": what, "ns": ns} for what, ns in r.extras],
        }
        for r in results
    ]
