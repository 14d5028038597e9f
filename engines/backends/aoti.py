"""AOTInductor engine: the static pass compiled ahead of time into a ``.pt2`` package.

The package is built from the same spec and weights as the ONNX graph (it reads the
export directory's manifest), loads in Python (:class:`AotiRunner`) and in C++
(``torch::inductor::AOTIModelPackageLoader``, engines/cpp) with no Python at run time.
"""
from __future__ import annotations

import contextlib
import json
import re
import time
import zipfile
from pathlib import Path

import torch

from wan_trt.engines.artifact import (REBUILD, EngineMetadata, check_engine_out, check_unchanged, default_engine_path,
                                     engine_key, install_engine, staged_file, up_to_date)
from wan_trt.engines.backends import check_engine_name, get_backend
from wan_trt.engines.backends.inductor_fixes import (apply_inductor_fixes, channels_last_3d_convolutions,
                                                     make_libstdcxx_global, shared_kernel_inputs)
from wan_trt.engines.runtime.cuda_graph import CudaGraphRunner
from wan_trt.engines.runtime.runner import Runner
from wan_trt.engines.runtime.runtime_file import write_runtime_file
from wan_trt.digest import file_identity
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest, reference_model, verify_weights
from wan_trt.log import logger, stage
from wan_trt.graphs import graph_kind
from wan_trt.outputs import output_lock, parent_made
from wan_trt.plugins.registry import FUSED_OPS

FP8_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada and Hopper onwards


def check_fp8_device(device: str) -> None:
    """Refuse an fp8 engine where its FP8 GEMMs (cuBLASLt, row-wise scales) cannot run."""
    if device != "cuda":
        raise WanTrtError("an fp8 graph's engine runs its GEMMs on FP8 tensor cores: build it with --device cuda")
    have = torch.cuda.get_device_capability()
    if have < FP8_CAPABILITY:
        raise WanTrtError(f"an fp8 engine needs FP8 tensor cores (compute capability {FP8_CAPABILITY[0]}."
                          f"{FP8_CAPABILITY[1]} or later); {torch.cuda.get_device_name()} has {have[0]}.{have[1]}: "
                          "build a bf16 engine instead")


def check_target(device: str, ops: str, precision: str) -> None:
    """Refuse a package of ``precision`` with ``ops`` for ``device`` that this machine cannot build."""
    if device == "cuda" and not torch.cuda.is_available():
        raise WanTrtError("--device cuda: no CUDA device here; build with --device cpu")
    if ops == "plugins" and device != "cuda":
        raise WanTrtError("--ops plugins: the fused Triton kernels compile for CUDA; build with --device cuda")
    if precision == "fp8":
        check_fp8_device(device)


def build_aoti(directory: str | Path, out: str | Path | None = None, device: str = "cuda",
               force: bool = False, ops: str | None = None) -> Path:
    """Compile the export in ``directory`` into an AOTInductor package for ``device`` ('cuda' or 'cpu').

    ``ops`` ('native' or 'plugins', default: the export's) picks PyTorch ops or the fused wan_trt
    Triton kernels; the I/O spec and weights are the export's either way.
    """
    directory = Path(directory)
    manifest = Manifest.read(directory)
    ops = ops or manifest.ops
    check_target(device, ops, manifest.spec.precision)
    engine = Path(out) if out else default_engine_path(directory, "aoti", device, ops)
    key = engine_key(manifest, "aoti", device, {"ops": ops})
    check_engine_name(get_backend("aoti"), engine)
    check_engine_out(engine)
    with parent_made(engine, "--out"), output_lock(engine, "build"):  # a failed build leaves no folder it made
        if force or not up_to_date(engine, key, manifest) or _mismatched(engine):
            _compile(manifest, directory, engine, key, device, ops)
        meta = EngineMetadata.read(engine)  # verified or just made
        write_runtime_file(manifest, engine, meta.engine_file, meta.device)
    return engine


def _mismatched(engine: Path) -> bool:
    """Whether the up-to-date engine's metadata says other than its package holds (rebuilt then, not reused)."""
    mismatch = package_mismatch(engine, EngineMetadata.read(engine))
    if mismatch is not None:
        logger.info("rebuilding %s: its metadata says %s", engine, mismatch)
    return mismatch is not None


def _compile(manifest: Manifest, directory: Path, engine: Path, key: str, device: str, ops: str) -> None:
    """Rebuild the model, torch.export it and AOTInductor-package it into ``engine`` (staged, then renamed)."""
    spec = manifest.spec
    begin = time.perf_counter()
    kind = graph_kind(spec)
    with stage(f"rebuild {spec.config.name} {kind.name} ({spec.precision}) on {device}"):
        module = reference_model(manifest, spec.dtype, device)
        verify_weights(manifest, module)
        module = kind.prepare(module, ops, spec.precision)  # the same fp32 islands (and FP8 GEMMs) as the ONNX graph
    static = kind.static(module, spec).eval()
    feeds = {k: v.to(device) for k, v in manifest.sample_feeds(directory).items()}
    with stage("torch.export"), torch.no_grad():
        program = torch.export.export(static, tuple(feeds[n] for n in spec.input_names), strict=False)
    layouts = channels_last_3d_convolutions() if kind.channels_last_convolutions and device == "cuda" \
        else contextlib.nullcontext()
    with stage("AOTInductor compile + package"), staged_file(engine) as partial:
        apply_inductor_fixes()
        try:
            with layouts, shared_kernel_inputs():
                torch._inductor.aoti_compile_and_package(program, package_path=str(partial))
        except Exception as exc:
            compile_error = _cpp_compile_error(exc)
            if compile_error is None:
                raise
            lines = str(compile_error).splitlines()
            first = next((line.strip() for line in lines if "error:" in line), lines[0] if lines else "")
            raise WanTrtError(f"AOTInductor failed to compile the C++ code of the {ops} package: {first[:400]}. "
                              f"With a working compiler this is likely a PyTorch {torch.__version__} code-generation "
                              "error rather than a problem with the export; try --ops native or another torch "
                              "version") from exc
        meta = EngineMetadata.of_build(manifest, directory, backend="aoti", device=device, key=key, ops=ops,
                                       build_seconds=time.perf_counter() - begin)
        mismatch = package_mismatch(partial, meta)  # the rule runners hold engines to, asked of the build itself
        if mismatch is not None:
            raise WanTrtError(f"the package just built does not show what it was built as ({mismatch}): this PyTorch "
                              f"{torch.__version__} records devices or names its kernels otherwise than wan-trt reads "
                              "them, and its runners would refuse the engine; nothing was installed")
        install_engine(partial, engine, meta)


def _cpp_compile_error(exc: BaseException) -> BaseException | None:
    """The CppCompileError in ``exc``'s chain (Inductor wraps it in InductorError), if any."""
    from torch._inductor.exc import CppCompileError

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, CppCompileError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _package(engine: Path) -> tuple[list[str], str, str | None]:
    """(the names inside the package ``engine``, the text of its generated sources, the device kind its code was
    compiled for: AOTInductor's own record), refused where the file is no readable package."""
    try:
        with zipfile.ZipFile(engine) as pkg:
            names = pkg.namelist()
            text = "\n".join(pkg.read(n).decode(errors="ignore") for n in names if n.endswith((".cpp", ".py")))
            records = [json.loads(pkg.read(n)) for n in names if n.endswith("wrapper_metadata.json")]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise WanTrtError(f"engine {engine}: not a readable AOTInductor package ({exc}); {REBUILD} --force") from None
    devices = {str(r["AOTI_DEVICE_KEY"]).partition(":")[0] for r in records
               if isinstance(r, dict) and r.get("AOTI_DEVICE_KEY") is not None}  # no record: no device judged
    return names, text, devices.pop() if len(devices) == 1 else None


def _fused_kernels(text: str) -> dict[str, int]:
    """Per registered fused op, how many compiled variants of its Triton kernel the package's code names (Inductor
    names a user Triton kernel ``_<op>_kernel`` with a number per variant)."""
    return {op.name: len(found) for op in FUSED_OPS
            if (found := set(re.findall(rf"\b{op.kernel_name}(?:_\d+)?\b", text)))}


def package_mismatch(engine: Path, meta: EngineMetadata, package: tuple | None = None) -> str | None:
    """Where the metadata ``meta`` says other than the package ``engine`` holds (its device kind, fused kernels or
    none), or None: an edited metadata file, or another engine's, made a runner run a package under another name
    (a check report and a bench row named a backend that did not run) and build rewrite the runtime file with it."""
    _, text, device = package or _package(engine)  # ``package``: :func:`_package` of it, read already
    problems = []
    if device is not None and device != meta.device.partition(":")[0]:
        problems.append(f"device {meta.device}, where the package's code was compiled for {device}")
    fused = bool(_fused_kernels(text))
    if meta.ops == "plugins" and not fused:
        problems.append("ops plugins, where the package holds no fused kernels")
    if meta.ops != "plugins" and fused:
        problems.append(f"ops {meta.ops}, where the package holds fused kernels")
    return "; ".join(problems) or None


def check_package(engine: Path, meta: EngineMetadata, package: tuple | None = None) -> None:
    """Refuse an engine whose metadata says other than its package holds (:func:`package_mismatch`)."""
    mismatch = package_mismatch(engine, meta, package)
    if mismatch is not None:
        raise WanTrtError(f"engine {engine}: its metadata ({engine.name}.json) says {mismatch}: edited, or another "
                          f"engine's; {REBUILD} --force")


class AotiRunner(Runner):
    """Runs an AOTInductor package built by :func:`build_aoti`."""

    without_cuda = ("the package was built for CUDA and runs only there: run it on a machine with a CUDA GPU, or "
                    "build one for this CPU with `wan-trt build EXPORT --backend aoti --device cpu`")

    def __init__(self, engine: str | Path, manifest: Manifest, single_threaded: bool = False):
        self.engine = Path(engine)
        self.single_threaded = single_threaded  # no thread synchronisation: required under CUDA-graph capture
        self.meta = EngineMetadata.read(self.engine)
        self.verified = file_identity(self.engine)  # the file whose sha256 check_against verifies
        self.meta.check_against(manifest, self.engine)
        check_package(self.engine, self.meta)
        self._check_unchanged()
        super().__init__(manifest.spec, self.meta.device)
        self.name = self.meta.backend_name
        self.weights_sha256 = manifest.weights["sha256"]
        self.compiled = None

    def activate(self) -> None:
        """Load the package: the file verified when the runner was made (refused if it was replaced or
        rewritten since, before and after the load: a report would give the verified file's sha256)."""
        make_libstdcxx_global()
        self._check_unchanged()
        compiled = torch._inductor.aoti_load_package(str(self.engine), run_single_threaded=self.single_threaded)
        self._check_unchanged()
        self.compiled = compiled

    def _check_unchanged(self) -> None:
        check_unchanged(self.engine, self.verified)

    def deactivate(self) -> None:
        self.compiled = None

    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.check_feeds(feeds)
        with self.arithmetic():
            outputs = self.compiled(*(feeds[n] for n in self.spec.input_names))
        return dict(zip(self.spec.output_names, outputs))


# ---- the registry's entry points (engines/backends/__init__.py) ----------------------------------

def build(directory: Path, options) -> Path:
    """``wan-trt build --backend aoti``: the package of the export in ``directory`` (a BuildOptions)."""
    return build_aoti(directory, options.out, options.device, options.force, options.ops)


def check_options(options) -> None:
    """What ``wan-trt build --backend aoti`` (a BuildOptions) cannot build here, refused before an export is made."""
    check_target(options.device, options.ops, options.precision)


def make_runner(backend, sources) -> Runner:
    """The runner of an ``aoti*`` entry: its package, as CUDA graphs where the entry says so."""
    runner = AotiRunner(sources.engine(backend), sources.manifest, single_threaded=backend.cuda_graph)
    return CudaGraphRunner(runner) if backend.cuda_graph else runner


def check_runners(engine: Path, manifest: Manifest) -> tuple[Runner, None]:
    """``wan-trt check ENGINE``: the runner to check (the same one runs the single pass and the stream)."""
    return AotiRunner(engine, manifest), None


def inspect(engine: Path, meta: EngineMetadata) -> dict:
    """Files and generated kernels inside an AOTInductor package, and the fused ops it runs (:func:`_fused_kernels`),
    so a --ops plugins package shows which fused kernels it holds; refused where its metadata says otherwise.
    Files are named as inside the package: the zip holds them all in a folder named after the file it was written
    as, the build's staging file (renamed into place since), which is left out."""
    package = _package(engine)
    check_package(engine, meta, package)
    names, text, _ = package
    names = [n.split("/", 1)[-1] for n in names]
    kernels = sorted({n.rsplit("/", 1)[-1].split(".")[0] for n in names if n.endswith((".cubin", ".ptx", ".hsaco"))})
    fused = _fused_kernels(text)
    summary = {"backend": "aoti", "device": meta.device, "config": meta.config, "precision": meta.precision,
               "ops": meta.ops, "files": len(names), "gpu_kernels": len(kernels), "fused_kernels": sum(fused.values())}
    return {"summary": summary, "files": names, "kernels": kernels, "fused_kernels": fused}
