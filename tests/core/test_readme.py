"""The README's examples run as written: its Python example streams blocks, and every `wan-trt` command line it
shows names a command and options the CLI has. Each reads the README itself, so an edit that breaks an example
fails here."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import torch

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.decoder_spec import RGB, DecoderSpec
from wan_trt.engines.backends import ALL_BACKENDS
from wan_trt.export.manifest import Manifest
from wan_trt.spec import LATENTS, VISUAL_CONTEXT, PassSpec
from wan_trt.stream import synthetic_stream

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = 2


def section(heading: str) -> str:
    """The text of the README's ``## heading`` section, up to the next ``## `` heading."""
    text = README.read_text()
    start = text.find(f"\n## {heading}\n")
    assert start >= 0, f"README.md has no section '## {heading}'"
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def code_block(heading: str, language: str) -> str:
    """The first ```language fenced block of the README's ``## heading`` section."""
    found = re.search(rf"^```{language}\n(.*?)^```$", section(heading), re.S | re.M)
    assert found, f"README.md's section '## {heading}' has no ```{language} block"
    return found.group(1)


def replaced(text: str, old: str, new: str) -> str:
    """``text`` with its one ``old`` replaced: a README that no longer holds ``old`` (or holds it twice) fails, so
    that an edit of the example cannot slip past the substitution."""
    if text.count(old) != 1:
        pytest.fail(f"the README's example holds {old!r} {text.count(old)} times, not once: update this test with it",
                    pytrace=False)
    return text.replace(old, new)


# ---- "Embedding the engine in Python" ---------------------------------------------------------------

EMBEDDING = "Embedding the engine in Python"


def comment_of(code: str, line_start: str) -> str:
    """The comment of the example's line that starts (after its indent) with ``line_start``."""
    lines = [line for line in code.splitlines() if line.strip().startswith(line_start)]
    assert len(lines) == 1 and "#" in lines[0], f"the example has no one commented line starting {line_start!r}"
    return lines[0].split("#", 1)[1]


def shapes_in(comment: str) -> list[tuple[int, ...]]:
    """Every ``[a, b, ...]`` of integers in ``comment``."""
    return [tuple(int(n) for n in m.split(",")) for m in re.findall(r"\[(\d+(?:,\s*\d+)*)\]", comment)]


def test_the_embedding_example_streams_blocks_as_it_says(aoti, decoder_aoti):
    """The README's example, run on universal-small's CPU engines with only the paths, the decoder's backend and
    device, and `while playing:` (two blocks of synthetic input) put in: it yields each block's latents, its
    uint8 frames (9, then 12) and the stages it names."""
    export, engine = aoti
    code = code_block(EMBEDDING, "python")
    code = replaced(code, '"out/uni"', repr(str(export)))
    code = replaced(code, '"out/uni/engine_aoti_plugins_cuda.pt2"', repr(str(engine)))
    code = replaced(code, '"out/dec/steady/engine_aoti_cuda.pt2"', repr(str(decoder_aoti)))
    code = replaced(code, '"aoti+cudagraph"', '"aoti"')
    code = replaced(code, '"cuda"', '"cpu"')
    code = replaced(code, "while playing:", "for cond_concat, mouse, keyboard in blocks:")

    cfg = Manifest.read(export).spec.config
    inputs = synthetic_stream(cfg, BLOCKS, seed=5)
    namespace: dict = {"visual_context": inputs.visual_context}
    results = []

    def blocks():
        """Each block's inputs as a live caller sends them; after each, the result the example's step made."""
        for block in range(BLOCKS):
            yield (inputs.block_cond(cfg, block), *inputs.block_actions(cfg, block))
            results.append(namespace["result"])
    namespace["blocks"] = blocks()
    try:
        exec(compile(code, f"{README} ({EMBEDDING})", "exec"), namespace)
    finally:  # what the example leaves active (the runner, the decoder and its process-wide cuDNN setting)
        for name in ("decoder", "runner"):
            if name in namespace:
                namespace[name].__exit__(None, None, None)

    assert len(results) == BLOCKS and results[0] is not results[1]
    latents = PassSpec.from_config(cfg, "fp32").tensor(LATENTS).shape
    stages = [s.strip() for s in comment_of(code, "result.stage_ms").split(":", 1)[1].split(",")]
    for block, result in enumerate(results):
        call = "first" if block == 0 else "steady"
        frames = DecoderSpec.from_config(cfg, "fp32", call).tensor(RGB).shape  # [1, 3, n, H, W]: H, W of the video
        assert result.latents.shape == latents and result.latents.device.type == "cpu", result.latents.shape
        assert torch.isfinite(result.latents).all()
        assert result.frames.dtype == torch.uint8 and result.frames.device.type == "cpu"
        assert result.frames.shape == (9 if block == 0 else 12, *frames[3:], 3), result.frames.shape
        assert result.frames.float().std() > 1, "constant frames"
        assert list(result.stage_ms) == stages, (list(result.stage_ms), stages)
        assert all(ms >= 0 for ms in result.stage_ms.values())


def test_the_embedding_examples_shapes_are_the_full_configs():
    """The shapes the example's comments give are those of `universal` (the config out/uni is exported from)."""
    code = code_block(EMBEDDING, "python")
    cfg = load_config("universal")
    spec = PassSpec.from_config(cfg, "bf16")
    first, steady = (DecoderSpec.from_config(cfg, "bf16", call).tensor(RGB).shape for call in ("first", "steady"))
    assert shapes_in(comment_of(code, "session.start(")) == [spec.tensor(VISUAL_CONTEXT).shape]
    assert shapes_in(comment_of(code, "result.latents")) == [spec.tensor(LATENTS).shape]
    frames = comment_of(code, "result.frames")
    assert "uint8" in frames and shapes_in(frames) == [(steady[2], *steady[3:], 3)], frames
    assert re.search(rf"\({first[2]} first\)", frames), (frames, first)


# ---- "What you run" ---------------------------------------------------------------------------------

WHAT_YOU_RUN = "What you run"
BACKEND_LISTS = ("--backends", "--end-to-end")  # options whose value is backend names, comma-separated


def commands_of(code: str) -> list[tuple[str, str]]:
    """(command line, its comment) per command of a bash block: continued lines joined, comment-only lines added
    to the comment before them. A line that is neither fails (this reader would skip what it cannot read)."""
    out: list[tuple[str, str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        hash_ = re.search(r"(?:^|\s)#", line)
        command, comment = (line[:hash_.start()], line[hash_.end():]) if hash_ else (line, "")
        if command.strip():
            assert command.split()[0] == "wan-trt", f"a line of the bash block that is no wan-trt command: {line!r}"
            out.append((command.strip(), comment))
        elif comment.strip():
            assert out, f"a comment before any command: {line!r}"
            out[-1] = (out[-1][0], f"{out[-1][1]} {comment}")
    return out


class CliUse:
    """Checks of the README's words against the click commands of `wan-trt`: the command, its long options, and
    the values given to an option of fixed choices or to one that takes backend names. Collects every problem found."""

    def __init__(self, where: str):
        self.where, self.problems, self.seen = where, [], set()

    def command(self, words: list[str]) -> click.Command | None:
        """The command that ``words`` (what follows `wan-trt`) name, its options checked (`[--ops plugins]`:
        an optional one); None, a problem noted, if there is none."""
        words = [w.strip("[]") for w in words]
        line = f"wan-trt {' '.join(words)}"
        at = next((i for i, w in enumerate(words) if not w.startswith("-")), len(words))
        self.options(main, words[:at], line)  # the group's own (-v)
        cmd = main.commands.get(words[at]) if at < len(words) else None
        if cmd is None:
            self.problems.append(f"{self.where}: `{line}`: no such command")
            return None
        self.seen.add(cmd.name)
        self.options(cmd, words[at + 1:], line)
        return cmd

    def options(self, cmd: click.Command, words: list[str], line: str, alternatives_only: bool = False) -> None:
        """Every `--option` of ``words`` (each word that starts with `--`) is one of ``cmd``'s, and the value after
        an option of fixed choices is one of them, and so is each backend named to an option that takes their list
        (with ``alternatives_only``, as in prose, only a value of `a|b`
        alternatives is read: each is)."""
        by_name = {o: p for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
        for i, word in enumerate(words):
            flag, _, value = word.partition("=")
            if not flag.startswith("--"):
                continue
            param = by_name.get(flag)
            if param is None:
                self.problems.append(f"{self.where}: `{line}`: `wan-trt {cmd.name}` has no option {flag}")
                continue
            if not value and i + 1 < len(words) and not (param.is_flag or param.count):
                value = words[i + 1]
            if flag in BACKEND_LISTS and value and not alternatives_only:
                wrong = [name for name in value.split(",") if name not in ALL_BACKENDS]
                if wrong:
                    self.problems.append(f"{self.where}: `{line}`: {flag} {','.join(wrong)}: no such backend "
                                         f"({', '.join(ALL_BACKENDS)})")
                continue
            if not isinstance(param.type, click.Choice) or not value or (alternatives_only and "|" not in value):
                continue
            wrong = [v for v in value.split("|") if v not in param.type.choices]
            if wrong:
                self.problems.append(f"{self.where}: `{line}`: {flag} {'|'.join(wrong)}: not among its choices "
                                     f"{list(param.type.choices)}")


def spans_naming_a_command(text: str) -> list[list[str]]:
    """The words after `wan-trt` of each `code span` of ``text`` that is a command line: `wan-trt ...`, or a
    command's name and more (`export --no-onnx`, `check out/dec`)."""
    spans = [s.split() for s in re.findall(r"`([^`\n]+)`", text)]
    return [s[1:] if s[0] == "wan-trt" else s for s in spans
            if len(s) > 1 and (s[0] == "wan-trt" or s[0] in main.commands)]


def test_what_you_run_names_commands_and_options_the_cli_has():
    """Every command line of the README's "What you run" block, and every option its comments give (`--json`,
    `--precision fp16|fp32|fp8`: of the command on that line, or of a `command ...` quoted there), is one the
    CLI has; a value given to an option of fixed choices is one of them. The block shows every command."""
    use = CliUse("README.md, What you run")
    lines = commands_of(code_block(WHAT_YOU_RUN, "bash"))
    assert len(lines) >= 10, lines  # the reader found the block's commands
    for command, comment in lines:
        cmd = use.command(shlex.split(command)[1:])
        for words in spans_naming_a_command(comment):
            use.command(words)
        prose = re.sub(r"`[^`]*`", " ", comment)  # the quoted commands: read above
        if cmd is not None:
            words = [w.rstrip(".") for w in re.sub(r"[,;:()]", " ", prose).split()]  # `(--json, --list)`
            use.options(cmd, words, f"{command}  # {' '.join(prose.split())}", alternatives_only=True)
    if use.problems:
        pytest.fail("\n".join(use.problems), pytrace=False)
    assert use.seen == set(main.commands), f"commands the block does not show: {set(main.commands) - use.seen}"


def test_the_readmes_quoted_commands_are_the_clis():
    """A command quoted anywhere in the README (`export --no-onnx --opset 18`, `wan-trt stream --actions`)
    names a command and options the CLI has."""
    use = CliUse("README.md")
    spans = spans_naming_a_command(README.read_text())
    assert len(spans) >= 5, spans
    for words in spans:
        use.command(words)
    if use.problems:
        pytest.fail("\n".join(use.problems), pytrace=False)
