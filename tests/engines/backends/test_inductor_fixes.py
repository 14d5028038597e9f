"""The Inductor work-arounds (engines/backends/inductor_fixes.py): the int array cache, the layout of
3-D convolutions."""
import inspect
import re
from itertools import count

import pytest
import torch
import torch._inductor.kernel.conv as inductor_conv
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.utils import IndentedBuffer

from wan_trt.engines.backends.inductor_fixes import (apply_inductor_fixes, channels_last_3d_convolutions,
                                                    has_transient_int_array_key, int_array_var_keyed_by_buffer)
from wan_trt.model.vae import channels_last_3d_strides

CL = torch.channels_last_3d


class Wrapper:
    """The two members of CppWrapperCpu the cached method uses."""

    def __init__(self):
        self.ids = count()

    def _codegen_int_array_var_impl(self, int_array, writeline, known_statically):
        var = f"int_array_{next(self.ids)}"
        writeline(f"static constexpr int64_t {var}[] = {int_array};")
        return var


def test_each_buffer_gets_its_own_declaration_and_reuses_it():
    wrapper, first_pass, second_pass = Wrapper(), IndentedBuffer(), IndentedBuffer()
    a = int_array_var_keyed_by_buffer(wrapper, "{1L, 2640L}", first_pass.writeline, True)
    b = int_array_var_keyed_by_buffer(wrapper, "{1L, 2640L}", second_pass.writeline, True)
    assert a != b  # a name declared in one buffer is never handed out for another
    assert int_array_var_keyed_by_buffer(wrapper, "{1L, 2640L}", second_pass.writeline, True) == b
    assert first_pass.getvalue().count("int_array_") == 1 and second_pass.getvalue().count(b) == 1


def test_short_lived_buffers_never_share_a_cache_entry():
    wrapper, names = Wrapper(), set()
    for _ in range(50):  # freed buffers would hand their address (id) to the next one
        buffer = IndentedBuffer()
        name = int_array_var_keyed_by_buffer(wrapper, "{3L}", buffer.writeline)
        assert name in buffer.getvalue()
        names.add(name)
    assert len(names) == 50


def test_the_bug_is_recognised_by_its_cache_key():
    def buggy(self, int_array, writeline, known_statically=False, graph=None):
        cache_key = (int_array, id(writeline), known_statically, id(graph) if graph else None)
        return cache_key

    assert has_transient_int_array_key(buggy)
    assert not has_transient_int_array_key(int_array_var_keyed_by_buffer)


def test_replacement_fits_the_installed_method():
    installed = CppWrapperCpu.codegen_int_array_var
    assert list(inspect.signature(int_array_var_keyed_by_buffer).parameters) == \
        list(inspect.signature(installed).parameters)


def test_the_fix_is_applied_where_the_method_has_the_bug_and_only_there(monkeypatch):
    """Both branches, whichever this torch installs: a method keyed by the id of a transient writeline is replaced
    (once: a second call finds the fix in place), a method without that key is left alone."""
    def buggy(self, int_array, writeline, known_statically=False, graph=None):
        cache_key = (int_array, id(writeline), known_statically, id(graph) if graph else None)
        return cache_key

    def fixed(self, int_array, writeline, known_statically=False, graph=None):
        return int_array

    monkeypatch.setattr(CppWrapperCpu, "codegen_int_array_var", buggy)
    assert apply_inductor_fixes() == ["int_array_cache_key"]
    assert CppWrapperCpu.codegen_int_array_var is int_array_var_keyed_by_buffer
    assert apply_inductor_fixes() == []  # in place already
    monkeypatch.setattr(CppWrapperCpu, "codegen_int_array_var", fixed)
    assert apply_inductor_fixes() == [] and CppWrapperCpu.codegen_int_array_var is fixed


class Conv(torch.nn.Module):
    """A 3-D convolution as the decoder's engine form runs them, and a pointwise op after it."""

    def __init__(self, weight_format=CL):
        super().__init__()
        self.conv = torch.nn.Conv3d(8, 16, 3, padding=(0, 1, 1)).to(memory_format=weight_format)

    def forward(self, x):
        return self.conv(x) * 2


def _compiled(module, x, fix: bool):
    """(the compiled module, the output strides Inductor's lowering gave its convolution)."""
    layouts = []
    with channels_last_3d_convolutions() if fix else torch._inductor.config.patch(fx_graph_cache=False):
        inner = inductor_conv.conv_layout

        def recorded(*args, **kwargs):
            layout = inner(*args, **kwargs)
            layouts.append([int(s) for s in layout.stride])
            return layout

        inductor_conv.conv_layout = recorded
        try:
            with torch.no_grad():
                compiled = torch._inductor.compile(torch.fx.symbolic_trace(module), [x])
        finally:
            inductor_conv.conv_layout = inner
    return compiled, layouts


def _input(device="cpu", dtype=torch.float32):
    return torch.randn(1, 8, 5, 6, 7, device=device, dtype=dtype).contiguous(memory_format=CL)


def test_inductor_alone_lays_a_channels_last_3d_convolution_out_contiguous():
    """The choice the fix overrides (compiled only: the CPU's 3-D convolution computes contiguous outputs,
    which is why the fix is applied to CUDA builds only)."""
    _, layouts = _compiled(Conv().eval(), _input(), fix=False)
    assert layouts == [[2016, 126, 42, 7, 1]]


def test_the_fix_lays_it_out_channels_last_and_is_undone_after():
    original = inductor_conv.conv_layout
    _, layouts = _compiled(Conv().eval(), _input(), fix=True)
    assert layouts == [channels_last_3d_strides([1, 16, 3, 6, 7])] == [[2016, 1, 672, 112, 16]]
    assert inductor_conv.conv_layout is original


def test_a_convolution_with_a_contiguous_weight_keeps_its_layout():
    _, layouts = _compiled(Conv(torch.contiguous_format).eval(), _input().contiguous(), fix=True)
    assert layouts == [[2016, 126, 42, 7, 1]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's channels-last 3-D convolutions need a CUDA device")
def test_on_cuda_the_channels_last_engine_computes_what_eager_does():
    module, x = Conv().to("cuda", torch.bfloat16).eval(), _input("cuda", torch.bfloat16)
    compiled, layouts = _compiled(module, x, fix=True)
    assert layouts == [channels_last_3d_strides([1, 16, 3, 6, 7])]
    with torch.no_grad():
        out, expected = compiled(x), module(x)
    assert out.is_contiguous(memory_format=CL)
    torch.testing.assert_close(out, expected)


def _two_kernels_reading_one_table(x, frame_cos):
    """A RoPE table built in the graph (fp32 [L, D/2]) and read by two fused kernels, as the layers read theirs."""
    cos = torch.cat([frame_cos, torch.ones_like(frame_cos)], dim=1).repeat_interleave(x.shape[1] // 2, dim=0)
    sin = torch.zeros_like(cos)
    unit = torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)
    a = torch.ops.wan_trt.norm_rope(x, unit, cos, sin, 1e-6, 64)
    return torch.ops.wan_trt.norm_rope(a * 2, unit, cos, sin, 1e-6, 64)


def _two_kernels_reading_views_of_one_table(x, frame_cos):
    """A table of two layers' rows made by one broadcast add ([2, 8, 32], as the modulation table of every
    layer: its projection + e0), each layer's rows read by its own fused kernel."""
    rows = torch.cat([frame_cos, torch.ones_like(frame_cos)], dim=1).repeat_interleave(x.shape[1] // 2, dim=0)
    table = rows + torch.arange(2, device=x.device, dtype=rows.dtype)[:, None, None]
    unit = torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)
    a = torch.ops.wan_trt.norm_rope(x, unit, table[0], table[1] * 0, 1e-6, 64)
    return torch.ops.wan_trt.norm_rope(a * 2, unit, table[1], table[0] * 0, 1e-6, 64)


def _table_buffers(fix: bool, x, frame_cos, fn=_two_kernels_reading_one_table, shape="(8, 32), (32, 1)") -> int:
    """How many [8, 32] fp32 buffers (the tables' shape) the compiled function allocates."""
    from torch._inductor.utils import run_and_get_code

    from wan_trt.engines.backends.inductor_fixes import shared_kernel_inputs

    torch._dynamo.reset()
    with shared_kernel_inputs() if fix else torch._inductor.config.patch(fx_graph_cache=False):
        out, (code, *_) = run_and_get_code(torch.compile(fn), x, frame_cos)
    torch.testing.assert_close(out, fn(x, frame_cos))
    return len(re.findall(re.escape(f"empty_strided_cuda({shape}, torch.float32)"), code))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="user Triton kernels compile for CUDA only")
def test_values_two_fused_kernels_read_are_computed_once_with_the_fix():
    import wan_trt.plugins.ops  # noqa: F401  (the fused ops)

    x = torch.randn(1, 8, 128, device="cuda")
    frame_cos = torch.rand(2, 16, device="cuda")
    unfixed, fixed = _table_buffers(False, x, frame_cos), _table_buffers(True, x, frame_cos)
    assert fixed < unfixed and fixed <= 2  # each table once for both kernels (4 copies without the fix)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="user Triton kernels compile for CUDA only")
def test_a_table_whose_views_fused_kernels_read_is_computed_once_with_the_fix():
    import wan_trt.plugins.ops  # noqa: F401  (the fused ops)

    x = torch.randn(1, 8, 128, device="cuda")
    frame_cos = torch.rand(2, 16, device="cuda")
    fn = _two_kernels_reading_views_of_one_table
    table = "(2, 8, 32), (256, 32, 1)"
    counts = {fix: (_table_buffers(fix, x, frame_cos, fn, table), _table_buffers(fix, x, frame_cos, fn))
              for fix in (False, True)}
    # with the fix the whole table once ([2, 8, 32]); without, each kernel's rows computed into their own [8, 32]
    assert counts[True][0] == 1 and counts[True][1] < counts[False][1], counts
