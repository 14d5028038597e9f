"""The Inductor work-around for the int array cache (engines/inductor_fixes.py)."""
import inspect
from itertools import count

from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.utils import IndentedBuffer

from wan_trt.engines.backends.inductor_fixes import (apply_inductor_fixes, has_transient_int_array_key,
                                            int_array_var_keyed_by_buffer)


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


def test_replacement_fits_the_installed_method_and_is_applied_only_where_needed():
    installed = CppWrapperCpu.codegen_int_array_var
    assert list(inspect.signature(int_array_var_keyed_by_buffer).parameters) == \
        list(inspect.signature(installed).parameters)
    needed = installed is not int_array_var_keyed_by_buffer and has_transient_int_array_key(installed)
    assert apply_inductor_fixes() == (["int_array_cache_key"] if needed else [])
    if needed:
        assert CppWrapperCpu.codegen_int_array_var is int_array_var_keyed_by_buffer
