"""Build the C++ kernels of many Inductor graphs together: one compiler call per set of flags, not one per kernel.

Inductor builds each CPU kernel it generates as a shared library of its own (`CppPythonBindingsCodeCache`): a compiler
call that loads the precompiled ATen headers, compiles the kernel and links. Planning compiles every planning node
alone and then the schedule's fused runs, hundreds of kernels, so those fixed costs of a call are most of what the
compiler takes (BENCHMARKS.md, "Compile time").

Inside `batched_builds()`, a kernel Inductor generates is not built: Inductor gets a stand-in that builds it on its
first call. `KernelBatch.build` (called on leaving the block) builds every pending kernel in one translation unit per
set of compiler flags (each kernel's code in a namespace of its own), split across the CPU's cores, links that library
at the path Inductor expects for each kernel (so Inductor's caches find them as if it had built each, and a later
process builds nothing), and puts each kernel in place of its stand-in in Inductor's modules. The library's module
initialiser serves every kernel in it: it reads the module name Python asks for (`<key>.kernel`) and returns that
kernel's module.

Only Inductor's plain CPU kernels are batched. A kernel already built, one whose code does not have the shape this
expects, or a batch the compiler refuses is built by Inductor as before, one by one (logged), so results never depend
on this module.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch._inductor import codecache
from torch._inductor.cpp_builder import CppBuilder

from checkmate.files import write_file

log = logging.getLogger(__name__)

# Kernels in one compiler call at least (a call's fixed cost is several kernels' own).
MIN_PER_CALL = 4

_PY_INIT = re.compile(r"PyMODINIT_FUNC\s+PyInit_kernel\s*\(")
_EXTERN_C = re.compile(r'extern\s+"C"\s+(?!\{)')
_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"].*$", re.MULTILINE)


@dataclass(frozen=True)
class _Pending:
    """One kernel Inductor asked for: its source, the path Inductor loads it from and its loader."""

    key: str
    source: str
    binary_path: str
    builder: CppBuilder
    load: Callable[[], Any]


@dataclass
class KernelBatch:
    """The kernels generated inside one `batched_builds` block and not built yet."""

    pending: list[_Pending] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def build(self) -> None:
        """Build every pending kernel (a library per set of flags and core), then link it at each kernel's path."""
        with self.lock:
            pending, self.pending = self.pending, []
        if not pending:
            return
        started = time.perf_counter()
        groups: dict[str, list[_Pending]] = {}
        for kernel in pending:
            groups.setdefault(_flags_of(kernel.builder), []).append(kernel)
        chunks = [chunk for group in groups.values() for chunk in _split(group, os.cpu_count() or 1)]
        with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
            built = sum(pool.map(_build_together, chunks))
        _resolve_stand_ins()
        log.info(
            "Inductor: %d kernels built in %d compiler calls in %.1f s (%d left to Inductor)",
            len(pending),
            len(chunks),
            time.perf_counter() - started,
            len(pending) - built,
        )


class _StandIn:
    """What Inductor's module calls in place of a kernel not built yet: builds the batch on its first call."""

    def __init__(self, batch: KernelBatch, load: Callable[[], Any]) -> None:
        self._batch = batch
        self._load = load
        self._function: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        return self.function()(*args)

    def function(self) -> Callable[..., Any]:
        """The kernel itself (its batch built first, where that has not happened yet)."""
        if self._function is None:
            self._batch.build()
            self._function = self._load().kernel
        return self._function


def _resolve_stand_ins() -> None:
    """Put each kernel in place of its stand-in in Inductor's loaded modules, so that a call costs nothing more."""
    for module in list(codecache.PyCodeCache.modules):
        for name, value in list(vars(module).items()):
            if isinstance(value, _StandIn):
                setattr(module, name, value.function())


@contextmanager
def batched_builds() -> Iterator[KernelBatch]:
    """Inside, Inductor's CPU kernels are built together (see the module doc); every one is built on leaving."""
    batch = KernelBatch()
    original = codecache.CppPythonBindingsCodeCache.load_pybinding_async

    def load_pybinding_async(
        cls: type[codecache.CppPythonBindingsCodeCache],
        argtypes: Sequence[str],
        main_code: str,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if args or kwargs.get("kernel_code") is not None or kwargs.get("device_type", "cpu") != "cpu":
            return original.__func__(cls, argtypes, main_code, *args, **kwargs)  # type: ignore[attr-defined]
        kwargs["submit_fn"] = None  # Inductor's load_async then builds only when its loader is called
        get_result = original.__func__(cls, argtypes, main_code, **kwargs)  # type: ignore[attr-defined]
        pending = _pending_of(get_result)
        if pending is None or os.path.exists(pending.binary_path):
            return get_result
        with batch.lock:
            batch.pending.append(pending)
        stand_in = _StandIn(batch, pending.load)
        return lambda: stand_in

    codecache.CppPythonBindingsCodeCache.load_pybinding_async = classmethod(load_pybinding_async)  # type: ignore[assignment]
    try:
        yield batch
    finally:
        codecache.CppPythonBindingsCodeCache.load_pybinding_async = original  # type: ignore[method-assign]
        batch.build()


def _pending_of(get_result: Callable[[], Any]) -> _Pending | None:
    """The kernel behind Inductor's `load_pybinding_async` result (its closure's loader and that loader's build),
    or None where this version of Inductor lays them out otherwise."""
    load = _closure(get_result).get("get_result")
    if not callable(load):
        return None
    cells = _closure(load)
    worker = cells.get("worker_fn")
    arguments: list[Any] = list(getattr(worker, "args", ()))
    builders: list[Any] = list(arguments[1]) if len(arguments) == 2 else []
    if not (isinstance(cells.get("key"), str) and isinstance(cells.get("binary_path"), str)) or len(builders) != 1:
        return None
    builder, binary_path = builders[0], cells["binary_path"]
    source_path = os.path.splitext(binary_path)[0] + ".cpp"  # Inductor writes `<key>.cpp` beside `<key>.so`
    if not isinstance(builder, CppBuilder) or source_path not in builder.get_command_line():
        return None
    with open(source_path) as source:
        code = source.read()
    return _Pending(cells["key"], code, binary_path, builder, load)


def _closure(function: Callable[..., Any]) -> dict[str, Any]:
    code = getattr(function, "__code__", None)
    cells = getattr(function, "__closure__", None) or ()
    if code is None:
        return {}
    values = {}
    for name, cell in zip(code.co_freevars, cells, strict=True):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return values


def _flags_of(builder: CppBuilder) -> str:
    """The builder's command line without its source and target: kernels with equal flags build together."""
    target = builder.get_target_file_path()
    source = os.path.splitext(target)[0] + ".cpp"
    return builder.get_command_line().replace(source, "").replace(target, "")


def _split(group: list[_Pending], parts: int) -> list[list[_Pending]]:
    """`group` in at most `parts` chunks of at least MIN_PER_CALL kernels (one chunk when it is smaller)."""
    parts = max(1, min(parts, len(group) // MIN_PER_CALL))
    size = -(-len(group) // parts)
    return [group[start : start + size] for start in range(0, len(group), size)]


def _build_together(kernels: list[_Pending]) -> int:
    """Build `kernels` as one library and link it at each kernel's path; the number linked (0 when the compiler
    refused the batch: Inductor then builds each as it always does)."""
    source = _unity_source(kernels)
    if source is None:
        return 0
    first = kernels[0].builder
    directory = os.path.dirname(kernels[0].binary_path)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        path = os.path.join(scratch, "kernels.cpp")
        write_file(path, source)
        builder = CppBuilder(name="kernels", sources=path, BuildOption=first._build_option, output_dir=scratch)
        try:
            builder.build()
        except Exception as error:  # a compiler error: each kernel is built by Inductor instead
            log.warning("Inductor: %d kernels could not be built together; built one by one: %s", len(kernels), error)
            return 0
        library = builder.get_target_file_path()
        for kernel in kernels:
            _place(library, kernel.binary_path)
    return len(kernels)


def _place(library: str, target: str) -> None:
    """Link (or copy) `library` at `target` atomically, unless a library is there already."""
    if os.path.exists(target):
        return
    staged = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.link(library, staged)
    except OSError:  # a file system without hard links
        write_file(target, Path(library).read_bytes())
    else:
        os.replace(staged, target)


def _unity_source(kernels: Sequence[_Pending]) -> str | None:
    """One translation unit holding every kernel's code in a namespace of its own, and one module initialiser that
    returns the kernel module Python asks for by name; None when a kernel's code is not as expected."""
    includes: list[str] = []
    bodies = []
    for number, kernel in enumerate(kernels):
        if len(_PY_INIT.findall(kernel.source)) != 1:
            return None
        for include in _INCLUDE.findall(kernel.source):
            if include.strip() not in includes:
                includes.append(include.strip())
        body = _INCLUDE.sub("", kernel.source)
        body = _EXTERN_C.sub("", body)
        body = _PY_INIT.sub("PyObject* PyInit_kernel(", body)
        bodies.append(f"namespace kernel_{number} {{\n{body}\n}}  // namespace kernel_{number}\n")
    choices = "\n".join(
        f'    if (std::strcmp(wanted, "{kernel.key}.kernel") == 0) module = kernel_{number}::PyInit_kernel();'
        for number, kernel in enumerate(kernels)
    )
    return "\n".join(
        [
            "#define PY_SSIZE_T_CLEAN",
            *includes,
            "#include <cstring>",
            *bodies,
            _INITIALISER.replace("CHOICES", choices),
        ]
    )


_INITIALISER = """
static PyObject* checkmate_create(PyObject* spec, PyModuleDef*) {
    PyObject* name = PyObject_GetAttrString(spec, "name");
    if (name == nullptr) return nullptr;
    const char* wanted = PyUnicode_AsUTF8(name);
    PyObject* module = nullptr;
    if (wanted != nullptr) {
CHOICES
    }
    if (module == nullptr && !PyErr_Occurred())
        PyErr_Format(PyExc_ImportError, "no kernel %s in this library", wanted);
    Py_DECREF(name);
    return module;
}

static PyModuleDef_Slot checkmate_slots[] = {{Py_mod_create, (void*)checkmate_create}, {0, nullptr}};
static PyModuleDef checkmate_module = {PyModuleDef_HEAD_INIT, "kernel", nullptr, 0, nullptr, checkmate_slots,
                                       nullptr, nullptr, nullptr};

extern "C" PyObject* PyInit_kernel(void) { return PyModuleDef_Init(&checkmate_module); }
"""
