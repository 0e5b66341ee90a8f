"""Inductor's CPU kernels built together (`checkmate.inductor.kernel_builds`): one compiler call for many kernels,
the same results as Inductor's own builds, the libraries found again where Inductor looks, and Inductor's own builds
where the compiler refuses a batch."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.fx
from torch._inductor import config as inductor_config
from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch._inductor.compile_fx import compile_fx
from torch._inductor.cpp_builder import CppBuilder
from torch._inductor.cpu_vec_isa import pick_vec_isa
from torch._inductor.utils import fresh_cache

import checkmate.inductor.kernel_builds
from checkmate.inductor.kernel_builds import batched_builds

WIDTH = 64


def _layer_norm_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (WIDTH,), weight, bias)) * 2,)


def _silu_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.nn.functional.silu(x * weight) + bias + x, x.sum(0))


def _softmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.softmax(x * weight, -1) + bias,)


FUNCTIONS: tuple[Callable[..., tuple[torch.Tensor, ...]], ...] = (_layer_norm_gelu, _silu_residual, _softmax)


@pytest.fixture
def libraries_built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The shared libraries built by the C++ compiler (targets ending in .so) while the test runs, in a fresh
    Inductor cache, with Inductor's graph caches off so that every compile generates its kernels."""
    pick_vec_isa()  # probes the CPU with builds of its own, once per process: before counting
    built: list[str] = []
    original = CppBuilder.build

    def counted(builder: CppBuilder) -> None:
        target = builder.get_target_file_path()
        if target.endswith(".so"):
            built.append(target)
        original(builder)

    monkeypatch.setattr(CppBuilder, "build", counted)
    with fresh_cache(), inductor_config.patch(fx_graph_cache=False, compile_threads=1):
        yield built


def _inputs() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(4, 16, WIDTH, generator=generator),
        torch.randn(WIDTH, generator=generator),
        torch.randn(WIDTH, generator=generator),
    ]


def _compiled(function: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[..., Any]:
    with torch.no_grad():
        return compile_fx(torch.fx.symbolic_trace(function), _inputs())  # type: ignore[return-value]


def _assert_as_eager(compiled: list[Callable[..., Any]]) -> None:
    for function, made in zip(FUNCTIONS, compiled, strict=True):
        with torch.no_grad():
            for expected, got in zip(function(*_inputs()), made(*_inputs()), strict=True):
                torch.testing.assert_close(got, expected)


def test_kernels_built_together_run_as_inductor_builds_them_and_are_found_again(libraries_built: list[str]) -> None:
    alone = [_compiled(function) for function in FUNCTIONS]
    kernels = len(libraries_built)
    assert kernels >= len(FUNCTIONS), "Inductor alone builds a library per kernel"
    libraries_built.clear()
    with fresh_cache():
        with batched_builds() as batch:
            together = [_compiled(function) for function in FUNCTIONS]
            assert len(batch.pending) == kernels and not libraries_built, "nothing is built inside the block"
        assert 1 <= len(libraries_built) <= (os.cpu_count() or 1), "one compiler call per core at most"
        _assert_as_eager(together)
        _assert_as_eager(alone)

        libraries_built.clear()
        CppPythonBindingsCodeCache.cache_clear()
        again = [_compiled(function) for function in FUNCTIONS]
        assert not libraries_built, "Inductor finds each kernel's library where it looks for it"
        _assert_as_eager(again)


def test_a_kernel_called_inside_the_block_builds_the_batch(libraries_built: list[str]) -> None:
    with batched_builds() as batch:
        first = _compiled(FUNCTIONS[0])
        _assert_as_eager([first, *(_compiled(function) for function in FUNCTIONS[1:])])
        assert not batch.pending


def test_a_batch_the_compiler_refuses_is_built_by_inductor_one_by_one(
    libraries_built: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(checkmate.inductor.kernel_builds, "_unity_source", lambda kernels: "this is not C++\n")
    with caplog.at_level(logging.WARNING, logger="checkmate.inductor.kernel_builds"), batched_builds() as batch:
        compiled = [_compiled(function) for function in FUNCTIONS]
        kernels = len(batch.pending)
    assert "could not be built together" in caplog.text
    _assert_as_eager(compiled)
    refused = len(libraries_built) - kernels
    assert 1 <= refused <= (os.cpu_count() or 1), "each kernel built by Inductor after the refused batch"
