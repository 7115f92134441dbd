"""Numba flags in one place, and the two intrinsics every kernel uses.

* ``popcount64(x)``: number of set bits of a uint64 (LLVM ``ctpop``, one POPCNT instruction).
* ``ctz64(x)``, ``clz64(x)``: trailing / leading zero bits of a uint64 (LLVM ``cttz``/``ctlz``).
* ``monotonic_ns()``: ``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds, callable from
  nopython code. It is declared as an external symbol (not a ctypes pointer), so kernels that
  call it can still be cached on disk.
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


@intrinsic
def popcount64(typingctx, x):
    """Number of set bits of a 64-bit integer."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        (val,) = args
        return builder.ctpop(val)

    return sig, codegen


@intrinsic
def ctz64(typingctx, x):
    """Number of trailing zero bits of a nonzero 64-bit integer."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        (val,) = args
        return builder.cttz(val, ir.Constant(ir.IntType(1), 1))

    return sig, codegen


@intrinsic
def clz64(typingctx, x):
    """Number of leading zero bits of a 64-bit integer (64 for 0)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        (val,) = args
        return builder.ctlz(val, ir.Constant(ir.IntType(1), 0))

    return sig, codegen


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


def default_threads() -> int:
    """Threads for batch searches: ``BUCKETSEARCH_THREADS`` or the numba thread count."""
    value = os.environ.get("BUCKETSEARCH_THREADS")
    return int(value) if value else numba.get_num_threads()
