"""Numba flags in one place, and the intrinsics the kernels use.

* ``popcount64(x)``: number of set bits of a uint64 (LLVM ``ctpop``, one POPCNT instruction).
* ``ctz64(x)``, ``clz64(x)``: trailing / leading zero bits of a uint64 (LLVM ``cttz``/``ctlz``).
* ``monotonic_ns()``: ``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds, callable from
  nopython code. It is declared as an external symbol (not a ctypes pointer), so kernels that
  call it can still be cached on disk.
* ``cycle_counter()``: the CPU's time-stamp counter (LLVM ``readcyclecounter``, RDTSC on
  x86-64), in ticks; :func:`ns_per_tick` converts. An instruction, not a call: a kernel whose
  query loop holds a ``clock_gettime`` call (even on a branch not taken, ``stats=False``) was
  measured 40 ns per query slower at radius 0 (bench/bench_small_radii.py), and the read
  itself costs about 6 ns instead of 25. The small-radius kernels use it; requires a constant,
  synchronized TSC (Linux's ``tsc`` clock source); elsewhere :func:`ns_per_tick` still
  calibrates it against ``time.perf_counter_ns``.
* ``prefetch(arr, i)``: a hint to load the cache line of ``arr.flat[i]`` (LLVM ``prefetch``),
  for loops that look up a batch of addresses before reading them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numba
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: Flags of every serial kernel: compiled once and cached, GIL released so threads run in parallel.
FLAGS = dict(nogil=True, cache=True, fastmath=False, error_model="numpy")
#: Flags of batch drivers parallel over queries.
PARALLEL_FLAGS = dict(FLAGS, parallel=True)

jit = numba.njit(**FLAGS)


def njit(*args, **kwargs):
    """``numba.njit`` with the project flags (extra keyword arguments override them)."""
    return numba.njit(*args, **{**FLAGS, **kwargs})


def pjit(*args, **kwargs):
    """``numba.njit`` with the project flags and ``parallel=True``."""
    return numba.njit(*args, **{**PARALLEL_FLAGS, **kwargs})


CLOCK_MONOTONIC = 1  # Linux value of the constant

# Make sure the JIT linker resolves clock_gettime whatever libc layout the process has.
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
llvm_binding.add_symbol("clock_gettime", ctypes.cast(_libc.clock_gettime, ctypes.c_void_p).value)


def _word_intrinsic(name: str, result, emit, doc: str):
    """An intrinsic ``name(x: uint64) -> result`` whose body is ``emit(builder, x)``."""

    def typer(typingctx, x):
        def codegen(context, builder, signature, args):
            return emit(builder, args[0])

        return result(types.uint64), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


_I1 = ir.IntType(1)
popcount64 = _word_intrinsic("popcount64", types.int64, lambda b, x: b.ctpop(x),
                             "Number of set bits of a 64-bit integer.")
ctz64 = _word_intrinsic("ctz64", types.uint64, lambda b, x: b.cttz(x, ir.Constant(_I1, 1)),
                        "Number of trailing zero bits of a nonzero 64-bit integer.")
clz64 = _word_intrinsic("clz64", types.uint64, lambda b, x: b.ctlz(x, ir.Constant(_I1, 0)),
                        "Number of leading zero bits of a 64-bit integer (64 for 0).")


@intrinsic
def monotonic_ns(typingctx):
    """Monotonic clock in nanoseconds (``clock_gettime(CLOCK_MONOTONIC)``), about 20-25 ns a call."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        ts_type = ir.LiteralStructType([i64, i64])
        fn_type = ir.FunctionType(i32, [i32, ts_type.as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fn_type, "clock_gettime")
        ts = cgutils.alloca_once(builder, ts_type)
        builder.call(fn, [i32(CLOCK_MONOTONIC), ts])
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, i64(1_000_000_000)), nsec)

    return sig, codegen


@intrinsic
def cycle_counter(typingctx):
    """Time-stamp counter in ticks (``llvm.readcyclecounter``); see :func:`ns_per_tick`."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fn_type = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fn_type)
        return builder.call(fn, [])

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint the CPU to bring element ``index`` of the flat C-contiguous array ``arr`` (its data
    read as one run) into the caches (``llvm.prefetch``, read, high locality): a load that
    cannot fault and that nothing waits for, issued some iterations before a loop reads an
    element it reaches through an index (a position). No effect on results."""
    sig = types.void(arr, index)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.gep(ary.data, [idx])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn_type = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fn_type, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(nogil=True, cache=True)
def _read_cycle_counter():
    return cycle_counter()


_NS_PER_TICK: list[float] = []


def ns_per_tick() -> float:
    """Nanoseconds per :func:`cycle_counter` tick, measured once per process (a 20 ms busy
    wait against ``time.perf_counter_ns``); 1.0 when the kernels run as Python."""
    if not _NS_PER_TICK:
        import time

        if numba.config.DISABLE_JIT:
            _NS_PER_TICK.append(1.0)
        else:
            _read_cycle_counter()  # compiled
            t0, c0 = time.perf_counter_ns(), _read_cycle_counter()
            while time.perf_counter_ns() - t0 < 20_000_000:
                pass
            t1, c1 = time.perf_counter_ns(), _read_cycle_counter()
            _NS_PER_TICK.append((t1 - t0) / max(c1 - c0, 1))
    return _NS_PER_TICK[0]


def _python_twins():
    """The intrinsics as plain Python, same result types: with ``NUMBA_DISABLE_JIT=1``
    every kernel runs as Python (``make coverage-kernels`` measures the kernel bodies that
    way), and an intrinsic cannot run there."""
    import time

    import numpy as np

    def popcount64(x):
        return np.int64(int(x).bit_count())

    def ctz64(x):
        x = int(x)
        return np.uint64((x & -x).bit_length() - 1)

    def clz64(x):
        return np.uint64(64 - int(x).bit_length())

    def monotonic_ns():
        return np.int64(time.monotonic_ns())

    def cycle_counter():
        return np.int64(time.monotonic_ns())

    def prefetch(arr, index):
        return None

    return {f.__name__: f for f in (popcount64, ctz64, clz64, monotonic_ns, cycle_counter,
                                    prefetch)}


if numba.config.DISABLE_JIT:
    globals().update(_python_twins())  # rebinds the intrinsics above


def compiled_entry(dispatcher, args: tuple):
    """``dispatcher``'s compiled function for the numba types of ``args`` (compiled first when
    missing); the dispatcher itself when the kernels run as Python.

    Called with arguments of exactly those types it skips the dispatcher's type resolution of
    every argument (0.3 us of a one-query call of an 18-argument kernel). Arguments of other
    types are not checked, so a caller uses it only where the types are fixed: its own arrays,
    and C-contiguous, writable ``uint64`` query words."""
    if numba.config.DISABLE_JIT:
        return dispatcher
    sig = tuple(dispatcher.typeof_pyval(a) for a in args)
    if sig not in dispatcher.overloads:
        dispatcher.compile(sig)
    return dispatcher.overloads[sig].entry_point


def default_threads() -> int:
    """Threads for batch searches: ``BUCKETSEARCH_THREADS`` or the numba thread count."""
    value = os.environ.get("BUCKETSEARCH_THREADS")
    return int(value) if value else numba.get_num_threads()
