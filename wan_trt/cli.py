"""The ``wan-trt`` command line: thin click commands over one library call each.

User errors (:class:`WanTrtError`) print one message and exit 1; bugs keep their traceback.
Each command imports its library module when it runs, so that `wan-trt --help` and `wan-trt info`
start without importing torch and every backend.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import click
from click.core import ParameterSource

from wan_trt.cli_options import (DECODERS, MAX_SEED, PathArg, config_option, device_option, pick_device, pick_precision,
                                 precision_aliases, precision_option, seed_option, weights_option)
from wan_trt.engines.backends import (ALL_BACKENDS, BACKENDS, BUILDABLE, BY_NAME, DEFAULT_BUILD, ENGINE_FLAGS,
                                      parse_backends)
from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.errors import USER_ERRNOS, WanTrtError
from wan_trt.log import logger, setup_logging
from wan_trt.outputs import json_values


def user_errors(fn: Callable) -> Callable:
    """Turn WanTrtError (and file-system errors on the user's paths) into one 'error: ...' line on
    stderr and exit status 1; with -v the traceback is logged too. Anything else is a bug and keeps
    its traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WanTrtError as exc:
            _fail(str(exc))
        except OSError as exc:
            if exc.errno not in USER_ERRNOS:
                raise
            where = exc.filename if exc.filename is not None else "a file"
            _fail(f"{where}: {exc.strerror or exc} (errno {errno.errorcode.get(exc.errno, exc.errno)}); "
                  "check the path, its permissions and the free space")
    return wrapper


def _fail(message: str) -> None:
    logger.debug("traceback of the error below", exc_info=True)
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


class OnceOptions(click.Command):
    """A command whose single-valued options may each be given once: click kept the last of `--out a --out b`
    (or of `--video --no-video`) without a word. Refused while the command line is parsed, before any work;
    options meant to repeat (``multiple=True``) repeat as before."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            refuse_repeats(self, ctx, args)
        return super().parse_args(ctx, args)


def refuse_repeats(command: click.Command, ctx: click.Context, args: list[str]) -> None:
    """Refuse ``args`` where one single-valued option of ``command`` (its spellings, a --x/--no-x pair, flags
    sharing one destination) is given more than once, but for a flag repeated as itself (`-v -v`: it means
    the same once or twice). Parses a copy with click's own parser, so `--out=a`, `-v` and values that look
    like options read as they will when the command runs. Its option table is click's private one (click
    8.x); tests/core/test_cli.py gives every option of every command twice."""
    parser = command.make_parser(ctx)
    given: dict[str, list[tuple[Any, Any]]] = {}
    options = {id(o): o for o in (*parser._long_opt.values(), *parser._short_opt.values())}.values()
    for option in options:
        if option.action in ("store", "store_const") and not option.obj.is_eager:  # not --help, not multiple
            option.process = _recording(option, given)
    parser.parse_args(args=list(args))
    for occurrences in given.values():
        flags = {o.const for o, _ in occurrences if o.action == "store_const"}
        one_flag = len(flags) == 1 and all(o.action == "store_const" for o, _ in occurrences)  # the same meaning
        if len(occurrences) > 1 and not one_flag:
            raise click.BadOptionUsage(_name(occurrences[0][0]), _repeated(occurrences), ctx=ctx)


def _recording(option, given: dict) -> Callable:
    process = option.process

    def record(value, state) -> None:
        given.setdefault(option.dest, []).append((option, value))
        process(value, state)
    return record


def _name(option) -> str:
    return (option._long_opts or option._short_opts)[0]


def _repeated(occurrences: list) -> str:
    """'--out given twice (a, b): give it once', or '--video and --no-video given together: give one of them'."""
    names = list(dict.fromkeys(_name(option) for option, _ in occurrences))
    values = [str(value) for option, value in occurrences if option.takes_value]
    shown = f" ({', '.join(values)})" if values else ""
    if len(names) > 1:
        return f"{' and '.join(names)} given together{shown}: give one of them"
    times = "twice" if len(occurrences) == 2 else f"{len(occurrences)} times"
    return f"{names[0]} given {times}{shown}: give it once"


class Commands(OnceOptions, click.Group):
    """The command group: what click itself refuses while it parses (a flag value out of its choices, a path
    that does not exist, an unknown flag) ends as the commands' own user errors do, one 'error: ...' line and
    exit status 1, pointing at the command's help instead of printing its usage. No command at all shows
    the help. Its options and every command's may each be given once (:class:`OnceOptions`)."""

    command_class = OnceOptions

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        with terminated_on_sigterm():
            self._run(*args, **kwargs)

    def _run(self, *args, **kwargs):
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except Terminated:  # the conventional status of a process ended by SIGTERM
            click.echo("error: terminated", err=True)
            sys.exit(128 + signal.SIGTERM)
        except NO_ARGS_IS_HELP as exc:
            click.echo(exc.format_message())
            sys.exit(0)
        except click.UsageError as exc:
            argv = kwargs.get("args", args[0] if args else None)
            click.echo(f"error: {exc.format_message()} (see `{self._command_path(exc, argv)} --help`)", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(1)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def _command_path(self, exc: click.UsageError, argv) -> str:
        """The command a usage error is about (click leaves out the context of a flag missing its value)."""
        if exc.ctx is not None:
            return exc.ctx.command_path
        named = [a for a in (sys.argv[1:] if argv is None else argv) if a in self.commands]
        return f"{self.name} {named[0]}" if named else self.name


NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2+


class Terminated(BaseException):
    """SIGTERM came: raised in the main thread, it unwinds the command as Ctrl-C's KeyboardInterrupt does."""


@contextlib.contextmanager
def terminated_on_sigterm() -> Iterator[None]:
    """While a command runs from the command line: SIGTERM (`timeout`, `kill`) ends it as Ctrl-C does, its
    staging files and locks removed on the way out (killed by the default action, it left them for the next
    run of the same output to find), then 'error: terminated' and exit status 143. Python runs the handler
    between bytecodes: a long native call (an engine compile, a load) ends first. Not where the process set
    its own handler or runs the command off its main thread; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    came = []

    def terminated(signum, frame) -> None:
        if not came:  # once: a second SIGTERM does not interrupt the unwinding of the first
            came.append(signum)
            raise Terminated
    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@click.group(name="wan-trt", cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug-level log.")
def main(verbose: bool) -> None:
    """wan-trt: Matrix-Game 2.0 (CausalWanModel) from PyTorch to deployable engines."""
    setup_logging(verbose)
    prefer_workspace_free_gemms()  # before any GEMM of the process (PyTorch reads it once)


def given(name: str) -> bool:
    """Whether the running command's parameter ``name`` was given (command line or environment), not defaulted."""
    return click.get_current_context().get_parameter_source(name) is not ParameterSource.DEFAULT


# ---- commands ------------------------------------------------------------------------------

@main.command()
@config_option
@click.option("--list", "list_presets", is_flag=True, help="List the built-in presets and exit (no --config).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def info(config_name: str, list_presets: bool, as_json: bool) -> None:
    """Parameters, tokens, cache sizes and FLOPs of a config."""
    from wan_trt.config_load import load_config, preset_names
    from wan_trt.info import format_info, model_info

    if list_presets:
        if given("config_name"):  # an option the command would not use is refused, never dropped
            raise WanTrtError(f"--config {config_name}: --list lists the presets and takes no --config; drop one "
                              "of them")
        names = preset_names()
        click.echo(json.dumps(names) if as_json else "\n".join(names))
        return
    data = model_info(load_config(config_name))
    click.echo(json.dumps(data, indent=2) if as_json else format_info(data))


@main.command()
@config_option
@weights_option
@precision_option("fp32")
@device_option
@seed_option
@click.option("--blocks", type=click.IntRange(1), default=8, show_default=True, help="Blocks to stream.")
@click.option("--reference/--no-reference", default=False, show_default=True,
              help="Also run the upstream-semantics pipeline and report per-block errors.")
@click.option("--out", type=PathArg(file_okay=False), default=None,
              help="Write latents.pt, report.json and video.mp4 here.")
@click.option("--overwrite", is_flag=True,
              help="Replace --out if it holds an earlier stream output (a folder with other files is never replaced).")
@click.option("--video/--no-video", default=None, help="With --out: decode and write video.mp4 (the default) or not.")
@click.option("--vae-weights", type=PathArg(dir_okay=False), default=None,
              help="The video decoder's checkpoint (see --decoder); seeded random if omitted.")
@click.option("--actions", type=PathArg(dir_okay=False), default=None,
              help="JSON-lines file, one line per block: {\"mouse\": [dx, dy], \"keyboard\": [...]}, each one "
                   "action held for the block or one row per video frame (9, then 12). Synthetic if omitted.")
@click.option("--decoder", type=click.Choice(list(DECODERS)), default="wan", show_default=True,
              help="The video decoder: wan (Wan2.1's VAE decoder; --vae-weights Wan2.1_VAE.pth) or tiny (TAEHV's "
                   "for Wan2.1's latents: a twenty-fifth of the work, coarser frames; --vae-weights taew2_1.pth, not "
                   "Hunyuan's taehv.pth, which loads but gives other colours).")
@user_errors
def stream(config_name, weights, precision, device, seed, blocks, reference, out, overwrite, video, vae_weights,
           actions, decoder) -> None:
    """Stream blocks of synthetic input through the static-cache runtime (PyTorch backend)."""
    from wan_trt.config_load import load_config
    from wan_trt.engines.stream import StreamOptions, run_stream

    if out is None and video is not None:  # an option the run would not use is refused, never dropped
        raise WanTrtError(f"--{'' if video else 'no-'}video: the stream writes its video only under --out; give "
                          "--out or drop the flag")
    options = StreamOptions(blocks=blocks, precision=precision, device=pick_device(device), weights=weights,
                            seed=seed, reference=reference, out=Path(out) if out else None, video=video is not False,
                            vae_weights=vae_weights, actions=Path(actions) if actions else None,
                            overwrite=overwrite, decoder=decoder if given("decoder") else None)
    report = run_stream(load_config(config_name), options)
    click.echo(json.dumps(json_values(report["summary"]), indent=2))
    if reference and not report["summary"]["reference_match"]:
        raise WanTrtError("the static-cache stream does not match the reference pipeline (see the report)")


@main.command()
@config_option
@weights_option
@precision_option("bf16")
@seed_option
@click.option("--ops", type=click.Choice(["native", "plugins"]), default="native", show_default=True,
              help="Graph flavour: plain ONNX ops, or the fused ops as wan_trt::* plugin nodes.")
@click.option("--opset", type=click.Choice(["23", "18"]), default="23", show_default=True,
              help="23: fused Attention/RMSNormalization (TensorRT 10.15+, 11); 18: decomposed (TensorRT 10.9+).")
@click.option("--out", type=PathArg(file_okay=False), default=None,
              help="Output directory. Defaults to out/<config>_<precision>_<ops>.")
@click.option("--overwrite", is_flag=True,
              help="Replace --out if it holds a wan-trt export (a folder with other files is never replaced).")
@click.option("--no-onnx", is_flag=True,
              help="Manifest and sample inputs only, no ONNX graph: enough for `build --backend aoti`.")
@click.option("--graph", type=click.Choice(["dit", "decoder", "tiny-decoder"]), default="dit", show_default=True,
              help="dit: one denoising pass. decoder: the video decoder's two graphs (first block, later blocks) "
                   "into OUT/first and OUT/steady. tiny-decoder: the same for the tiny decoder (TAEHV's for "
                   "Wan2.1's latents: a twenty-fifth of the decoder's work, coarser frames).")
@click.option("--vae-weights", type=PathArg(dir_okay=False), default=None,
              help="With --graph decoder: Wan2.1 VAE checkpoint (Wan2.1_VAE.pth); with --graph tiny-decoder: TAEHV's "
                   "taew2_1.pth. Seeded random if omitted.")
@user_errors
def export(config_name, weights, precision, seed, ops, opset, out, overwrite, no_onnx, graph, vae_weights) -> None:
    """ONNX of one denoising pass (KV caches as static-shaped inputs and outputs), or of the video decoder."""
    from wan_trt.config_load import load_config

    if no_onnx and given("opset"):  # the opset is the ONNX graph's: nothing would use it
        raise WanTrtError(f"--opset {opset}: --no-onnx writes no ONNX graph for it to apply to; drop one of them")
    if no_onnx and given("ops"):  # so are the ops: an engine's are `build --ops`
        raise WanTrtError(f"--ops {ops}: --no-onnx writes no ONNX graph for it to apply to (an AOTInductor engine's "
                          "fused ops are chosen by `wan-trt build --ops`); drop one of them")
    cfg = load_config(config_name)
    if graph != "dit":
        from wan_trt.export.decoder import export_decoder

        if weights is not None:
            raise WanTrtError(f"--graph {graph}: the decoder's checkpoint is given with --vae-weights, not --weights")
        if ops != "native":
            at_build = ("its AOTInductor engine takes them at build: `wan-trt build DIR --ops plugins`"
                        if graph == "decoder" else "nor does its engine: the tiny decoder has none")
            raise WanTrtError(f"--graph {graph}: the decoder's ONNX graph has no fused ops ({at_build}); drop --ops "
                              f"{ops}")
        out = Path(out or f"out/{cfg.name}_{precision}_{graph}")
        manifests = export_decoder(cfg, out, precision, vae_weights, seed, int(opset), overwrite, onnx=not no_onnx,
                                   kind=graph)
        for call, manifest in manifests.items():
            nodes = f"{sum(manifest.op_counts.values())} nodes" if manifest.graph else "no ONNX graph"
            click.echo(f"{out / call}: {nodes}, spec {manifest.spec.fingerprint()}")
        return
    if vae_weights is not None:
        raise WanTrtError("--vae-weights goes with --graph decoder or tiny-decoder")
    from wan_trt.export.transformer import export_transformer

    out = Path(out or f"out/{cfg.name}_{precision}_{ops}")
    manifest = export_transformer(cfg, out, precision, weights, seed, ops, int(opset), overwrite, onnx=not no_onnx)
    nodes = f"{sum(manifest.op_counts.values())} nodes" if manifest.graph else "no ONNX graph"
    click.echo(f"{out}: {nodes}, spec {manifest.spec.fingerprint()}")


@main.command()
@click.argument("target", type=PathArg(exists=True))
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default=None,
              help="ONNX Runtime execution provider for an export directory (default cpu; bf16/fp16 graphs need "
                   "cuda: ORT-CPU has no bf16 kernels). An engine runs where it was built: refused with one.")
@click.option("--blocks", type=click.IntRange(1), default=None,
              help="Blocks of the multi-block stream check [default: 8; a decoder's 3, and 3 or more].")
@click.option("--stream/--no-stream", default=True, show_default=True,
              help="Run the multi-block stream check (a decoder's histories are judged there: never skipped).")
@seed_option
@click.option("--save-results/--no-save-results", default=True, show_default=True,
              help="Save Polygraphy's RunResults (every output of the three runners) under check/; at full "
                   "size that is about 3.7 GB.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def check(target, provider, blocks, stream, seed, save_results, as_json) -> None:
    """Accuracy against PyTorch (Polygraphy), single pass and stream.

    TARGET is an export directory (checked with ONNX Runtime) or an engine file built by
    `wan-trt build` (AOTInductor package or TensorRT plan), of the DiT or of the video decoder
    (its export folder, or either of its two engine files).
    """
    from wan_trt.validate.check import CheckOptions
    from wan_trt.validate.check_decoder import check_target

    unused = [f"--{name}" for name in ("blocks", "seed") if not stream and given(name)]
    if unused:  # they set the stream check only
        raise WanTrtError(f"{' and '.join(unused)} set{'s' if len(unused) == 1 else ''} the stream check, which "
                          f"--no-stream skips: drop --no-stream to run it (a decoder's check always does), or drop "
                          f"{'it' if len(unused) == 1 else 'them'}")
    export = Path(target).is_dir()  # else an engine file
    if provider is not None and not export:
        raise WanTrtError(f"--provider {provider}: {target} is an engine, which runs on the device it was built for "
                          "(ONNX Runtime's provider applies to an export directory); drop --provider")
    options = CheckOptions(provider=(provider or "cpu") if export else None, blocks=blocks, seed=seed,
                           stream=stream, save_results=save_results)
    # with --json stdout carries the report only: library chatter (Polygraphy prints) goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        report = check_target(target, options)
    if as_json:
        from wan_trt.validate.check import report_json
        click.echo(report_json(report))
    else:
        click.echo(report.table())
    if not report.ok:
        raise WanTrtError("accuracy check failed:\n  " + "\n  ".join(report.problems()))


@main.command()
@click.argument("directory", required=False, type=PathArg(file_okay=False))
@click.option("--config", "config_name", default=None,
              help="Without DIRECTORY: export this config first (into out/<config>_<precision>_<ops>).")
@click.option("--backend", type=click.Choice(BUILDABLE), default=DEFAULT_BUILD, show_default=True)
@precision_option(None)
@precision_aliases
@click.option("--ops", type=click.Choice(["native", "plugins"]), default="native", show_default=True,
              help="AOTInductor: PyTorch's ops, or the fused Triton kernels (the DiT's attention and norms, "
                   "the video decoder's norms; CUDA only).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="AOTInductor target device (TensorRT is always cuda).")
@click.option("--timing-cache", type=PathArg(dir_okay=False), default=None, help="TensorRT timing cache file.")
@click.option("--opt-level", type=click.IntRange(0, 5), default=None,
              help="TensorRT builder optimization level.  [default: 3]")
@click.option("--weak-typing", is_flag=True, help="TensorRT 10.x only: untyped network + precision builder flag.")
@click.option("--out", type=PathArg(dir_okay=False), default=None,
              help="Engine path: " + ", ".join(
                  f"{b} *{BY_NAME[b].engine_suffix}" + (" (or any name but another backend's)"
                                                         if BY_NAME[b].any_engine_name else "") for b in BUILDABLE)
                   + ". Defaults to DIRECTORY/engine_<backend>_<device>.<pt2|plan>.")
@click.option("--force", is_flag=True, help="Rebuild even if an up-to-date engine exists.")
@weights_option
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None,
              help="Seed of random weights and inputs when exporting with --config (default 0); with an existing "
                   "export it must be the export's.")
@user_errors
def build(directory, config_name, backend, precision, precision_alias, ops, device, timing_cache, opt_level,
          weak_typing, out, force, weights, seed) -> None:
    """Build an engine (TensorRT plan or AOTInductor package) from an export directory.

    The precision is the export's (a --precision given must be it); an export --config makes is bf16 unless one is
    given (fp16 keeps an fp32 residual stream and norms).
    """
    from wan_trt.engines.build import BuildOptions, build_engine

    given = [flag for flag, value in (("--timing-cache", timing_cache), ("--opt-level", opt_level),
                                      ("--weak-typing", weak_typing or None)) if value is not None]
    if given and backend != "tensorrt":  # they would be dropped without a word
        raise WanTrtError(f"{', '.join(given)}: TensorRT build options; --backend {backend} has none")
    if backend == "tensorrt" and device != "cuda":  # likewise: a plan is built for CUDA whatever --device says
        raise WanTrtError(f"--device {device}: a TensorRT engine runs on CUDA only; drop --device, or build an "
                          f"AOTInductor package for the CPU with --backend aoti --device {device}")
    options = BuildOptions(backend=backend, precision=pick_precision(precision, precision_alias, None), ops=ops,
                           device=device, timing_cache=timing_cache, opt_level=3 if opt_level is None else opt_level,
                           weak_typing=weak_typing, out=out, force=force)
    engine = build_engine(directory, config_name, options, weights=weights, seed=seed)
    click.echo(str(engine))


@main.command()
@click.argument("engine", type=PathArg(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def inspect(engine, as_json) -> None:
    """List an engine's layers and plugin layers (TensorRT) or kernels and fused kernels (AOTInductor)."""
    from wan_trt.engines.build import inspect_engine

    info = inspect_engine(engine)
    click.echo(json.dumps(info, indent=2) if as_json else "\n".join(f"{k}: {v}" for k, v in info["summary"].items()))


@main.command(epilog="\b\nBackends:\n" + "\n".join(f"  {b.name:24} {b.summary}" for b in BACKENDS))
@click.argument("directory", type=PathArg(exists=True, file_okay=False))
@click.option("--backends", default=None,
              help="Comma-separated backends, each of which must run (an error otherwise). Default: every "
                   "backend, skipping with the reason those this machine cannot run. Choices: "
                   + ", ".join(ALL_BACKENDS) + ".")
@click.option("--blocks", type=click.IntRange(2), default=6, show_default=True)
@device_option
@click.option(ENGINE_FLAGS["aoti"], "aoti_engine", type=PathArg(exists=True, dir_okay=False), default=None,
              help="AOTInductor package (`wan-trt build DIR --backend aoti`).")
@click.option(ENGINE_FLAGS["aoti-plugins"], "aoti_plugins_engine", type=PathArg(exists=True, dir_okay=False),
              default=None, help="AOTInductor package built with --ops plugins.")
@click.option(ENGINE_FLAGS["tensorrt"], "trt_engine", type=PathArg(exists=True, dir_okay=False), default=None,
              help="TensorRT engine (`wan-trt build DIR`).")
@click.option("--profile", "profile", default="",
              help="Comma-separated benched backends to profile by op class (CUDA only), and 'decoder' for one "
                   "steady block of the decoder engine.")
@click.option("--decoder", type=PathArg(exists=True, file_okay=False), default=None,
              help="A decoder export (`wan-trt export --graph decoder`): bench the video decoder too, beside "
                   "PyTorch's fp16 decoder eager and compiled (on CUDA).")
@click.option("--decoder-engine", type=PathArg(exists=True, dir_okay=False), default=None,
              help="Either engine file of that decoder (`wan-trt build DECODER`).")
@click.option("--end-to-end", "end_to_end", default="",
              help="Comma-separated benched backends to run again with the decoder engine decoding every block.")
@click.option("--also-engine", "also_engines", type=PathArg(exists=True, dir_okay=False), multiple=True,
              help="An engine of another export of the same config (e.g. its fp16 or fp8 build), benched in this "
                   "run too: rows BACKEND@PRECISION (--profile takes those names). Repeatable.")
@click.option("--out", type=PathArg(dir_okay=False), default=None, help="JSON results file.")
@click.option("--chart", type=PathArg(dir_okay=False), default=None, help="PNG chart of ms per block.")
@click.option("--overwrite", is_flag=True,
              help="Replace an earlier report / chart of wan-trt bench at --out / --chart (nothing else is replaced).")
@user_errors
def bench(directory, backends, blocks, device, aoti_engine, aoti_plugins_engine, trt_engine, profile, decoder,
          decoder_engine, end_to_end, also_engines, out, chart, overwrite) -> None:
    """ms per pass / block, FPS, P50/P95 and memory for every backend available, side by side."""
    from wan_trt.engines.bench import BenchOptions, run_bench

    names = parse_backends(backends)  # unknown names are refused before any work
    engines = {"aoti": aoti_engine, "aoti-plugins": aoti_plugins_engine, "tensorrt": trt_engine}
    options = BenchOptions(backends=None if names is None else tuple(names), blocks=blocks, device=pick_device(device),
                           engines={k: Path(v) if v else None for k, v in engines.items()},
                           profile=tuple(b for b in profile.split(",") if b),
                           decoder=Path(decoder) if decoder else None,
                           decoder_engine=Path(decoder_engine) if decoder_engine else None,
                           end_to_end=tuple(b for b in end_to_end.split(",") if b),
                           also_engines=tuple(Path(e) for e in also_engines), out=Path(out) if out else None,
                           chart=Path(chart) if chart else None, overwrite=overwrite)
    report = run_bench(directory, options)
    for name, r in report["backends"].items():
        per_pass = "      -" if r["ms_per_pass"] is None else f"{r['ms_per_pass']['mean']:7.1f}"  # passes not timed apart
        click.echo(f"{name:28} {r['block_ms']['mean']:9.1f} ms/block  p50 {r['block_ms']['p50']:8.1f}  "
                   f"p95 {r['block_ms']['p95']:8.1f}  (n {r['block_ms']['n']})  {per_pass} ms/pass  "
                   f"{r['video_fps']:6.1f} fps  {r['tflops']:6.1f} TFLOP/s ({100 * r['dense_bf16_fraction']:.0f} % of "
                   "dense bf16)")
    for name, r in report.get("decoder", {}).get("rows", {}).items():
        click.echo(f"{'decoder ' + name:16} {r['block_ms']['p50']:9.1f} ms/block p50 (n {r['block_ms']['n']}) "
                   f"{r['tflops']:6.1f} TFLOP/s")
    for name, why in report.get("decoder", {}).get("skipped", {}).items():
        click.echo(f"{'decoder ' + name:16} skipped: {why}")
    for name, r in report["end_to_end"].items():
        click.echo(f"{name:16} {r['block_ms']['p50']:9.1f} ms/block p50 (stages: "
                   + ", ".join(f"{k} {v:.1f}" for k, v in r["stage_ms"].items()) + f") {r['video_fps']:6.1f} fps")
    for name, why in report["skipped"].items():
        click.echo(f"{name:16} skipped: {why}")
    for name, why in report["failed"].items():
        click.echo(f"{name:16} FAILED: {why.splitlines()[0]}")
    where = f"; the results are in {out}" if out else ""
    if report["failed"]:
        raise WanTrtError(f"{len(report['failed'])} row(s) failed: {', '.join(report['failed'])}{where}")
    if not report["backends"]:
        raise WanTrtError(f"no backend ran on this machine (every one was skipped, reasons above){where}")


if __name__ == "__main__":
    main()
