"""Kernel names from real profiles land in the op class the bench reports them under."""
import subprocess

import pytest

from wan_trt.profiling import classify, environment, provenance, source_revision


@pytest.mark.parametrize("kernel, expected", [
    ("_window_attention_kernel", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("nvjet_sm90_tst_128x240_64x4_2x1_v_bz_coopA_bias_TNT", "gemm"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1_g1_execute_"
     "segment_k_off_kernel__5x_cudnn", "conv"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x32x32_stage4_warpsize4x1x", "conv"),
    ("sm90_xmma_dgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x128x64_warpgroupsize2x1x1_"
     "g1_execute_segment_k_off_kernel__5x_cudnn", "conv"),  # a transposed convolution (the decoder's upsampling)
    ("triton_red_fused_add_cat_clamp_min_convolution_div_expand_linalg_vector_norm_mul_silu_slice_49", "norm"),
    ("triton_poi_fused_cat_silu_45", "copy/cat"),
    ("_qk_norm_rope_kernel", "norm"),
    ("_adaln_kernel", "norm"),
    ("_add_adaln_kernel", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>", "norm"),
    ("triton_poi_fused_gelu_view_35", "elementwise"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::OpaqueType<2u>>", "copy/cat"),
])
def test_kernel_classes(kernel, expected):
    assert classify(kernel) == expected


def _git(root, *args) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_source_revision_names_the_commit_and_local_changes(tmp_path):
    """Result files record which code made them: the checkout's commit, whether tracked files differed, and
    the tree of the tracked files as they were (that of the commit that holds them)."""
    assert source_revision(tmp_path) is None  # not a git checkout
    commit = ("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, *commit, "--allow-empty", "-m", "first")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "add", "model.py")
    _git(tmp_path, *commit, "-m", "second")
    head, tree = _git(tmp_path, "rev-parse", "HEAD"), _git(tmp_path, "rev-parse", "HEAD^{tree}")
    assert source_revision(tmp_path) == {"commit": head, "dirty": False, "tree": tree}
    (tmp_path / "notes.txt").write_text("untracked files do not make a result dirty\n")
    assert source_revision(tmp_path) == {"commit": head, "dirty": False, "tree": tree}
    (tmp_path / "model.py").write_text("x = 2\n")
    changed = source_revision(tmp_path)
    assert changed["commit"] == head and changed["dirty"] and changed["tree"] != tree
    assert _git(tmp_path, "diff", "--cached", "--name-only") == ""  # the checkout's index is left alone
    _git(tmp_path, *commit, "-a", "-m", "third")  # the commit that holds the changed code has the recorded tree
    assert changed["tree"] == _git(tmp_path, "rev-parse", "HEAD^{tree}")
    (tmp_path / "layers.py").write_text("y = 1\n")  # a new file, added but not committed, is part of the code
    _git(tmp_path, "add", "layers.py")
    added = source_revision(tmp_path)
    assert added["dirty"] and _git(tmp_path, "diff", "--cached", "--name-only") == "layers.py"
    _git(tmp_path, *commit, "-m", "fourth")
    assert added["tree"] == _git(tmp_path, "rev-parse", "HEAD^{tree}")
    (tmp_path / "sub").mkdir()
    assert source_revision(tmp_path / "sub") is None  # inside a checkout, but not its root: another repository's copy


def test_result_files_start_with_the_source_revision():
    assert set(provenance("wan-trt")) == {"command", "environment", "source"}


def test_the_environment_names_the_variables_that_pick_library_kernels(monkeypatch):
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert "variables" not in environment("cpu")
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "0")
    assert environment("cpu")["variables"] == {"CUBLASLT_WORKSPACE_SIZE": "0"}


def test_memory_and_sync_helpers_act_on_the_runs_device(monkeypatch):
    """A run on cuda:1 is synchronised and measured on cuda:1, not on whichever device is current; a CPU run
    on a machine with a GPU reports no device memory (it reported the GPU's)."""
    import torch
    from wan_trt import profiling
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("synchronize", "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, _n=name: calls.append((_n, device)) or 2 ** 30)
    profiling.synchronize("cuda:1")
    profiling.reset_peak_memory("cuda:1")
    assert profiling.peak_memory_gib("cuda:1") == 1.0 and profiling.allocated_memory_gib("cuda:1") == 1.0
    assert calls == [(n, torch.device("cuda:1")) for n in
                     ("synchronize", "reset_peak_memory_stats", "max_memory_allocated", "memory_allocated")]
    calls.clear()
    profiling.synchronize("cpu")
    profiling.reset_peak_memory("cpu")
    assert profiling.peak_memory_gib("cpu") is None and profiling.allocated_memory_gib("cpu") is None
    assert calls == []


def test_the_recorded_command_runs_as_it_was_given(monkeypatch):
    """Arguments were joined with spaces: a path with a space (or a shell character) came back as other
    arguments than the ones given, so the recorded command did not run again as it had."""
    import shlex
    import sys

    argv = ["bench", "out/my export", "--out", "runs;old.json", "--backends", "torch-eager"]
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/wan-trt", *argv])
    assert shlex.split(provenance("wan-trt")["command"]) == ["wan-trt", *argv]
    monkeypatch.setattr(sys, "argv", ["scripts/time_blocks.py", "current", "out/uni"])
    assert provenance()["command"] == "time_blocks.py current out/uni"  # plain arguments stay as they were


def test_a_file_rewritten_with_its_modification_time_set_back_is_not_unchanged(tmp_path):
    """A file rewritten in place at the same size with its modification time set back (cp -p, rsync -t) kept its
    identity: a stream's report named the new actions file's sha256 while the run had read the old one. The change
    time, which no writer can set, is part of the identity."""
    import os
    import time
    from wan_trt.digest import file_identity, require_unchanged
    from wan_trt.errors import WanTrtError
    path = tmp_path / "actions.jsonl"
    path.write_text("{}\n")
    before = os.stat(path)
    identity = file_identity(path)
    time.sleep(0.01)
    path.write_text("[]\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns and os.stat(path).st_size == before.st_size
    with pytest.raises(WanTrtError, match="its status changed .*a write that set its modification time back"):
        require_unchanged(path, identity, "--actions", "while the stream ran", "run it again")
