"""Reading a :class:`~wan_trt.config.WanConfig`: a preset, a JSON file, or a dict.

Presets live in ``wan_trt/configs/<name>.json`` as ``{"model": ..., "inference": ...}``.
``load_config`` accepts a preset name, one of those files, or an upstream
``config.json`` (model fields only; the streaming settings then come from the
preset with the same action signature). Every config read is checked by
:func:`wan_trt.config.validate` before it is returned.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from wan_trt.config import ActionConfig, InferenceConfig, ModelConfig, WanConfig, validate
from wan_trt.config_json import build, read_json_object
from wan_trt.errors import WanTrtError
from wan_trt.log import logger

PRESET_DIR = Path(__file__).parent / "configs"
FULL_PRESETS = ("universal", "gta_drive", "templerun")

# Fields every upstream config.json sets (Matrix-Game-2/configs/distilled_model/*/config.json):
# required, so a missing num_layers is an error, not a silent 30. The others (patch_size,
# qk_norm, cross_attn_norm; the mouse fields of a keyboard-only model) keep upstream's
# constructor defaults, which the dataclass defaults equal.
UPSTREAM_REQUIRED = {
    "ModelConfig": ("action_config", "dim", "eps", "ffn_dim", "freq_dim", "in_dim", "local_attn_size",
                    "model_type", "num_heads", "num_layers", "out_dim", "sink_size", "text_len"),
    "ActionConfig": ("blocks", "enable_keyboard", "enable_mouse", "heads_num", "hidden_size",
                     "img_hidden_size", "keyboard_dim_in", "keyboard_hidden_dim", "patch_size", "qk_norm",
                     "qkv_bias", "rope_dim_list", "rope_theta", "vae_time_compression_ratio", "windows_size"),
}
TOP_LEVEL = ("name", "model", "inference")  # a wan-trt config's keys ('_'-prefixed ones are comments)
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
MOUSE_REQUIRED = ("mouse_dim_in", "mouse_hidden_dim", "mouse_qk_dim_list")  # when enable_mouse is true


def _required(cls: type, data: Mapping[str, Any]) -> tuple[str, ...]:
    """Fields ``data`` must hold to build ``cls`` (an empty action_config means no action module)."""
    if cls is ActionConfig and not data:
        return ()
    names = UPSTREAM_REQUIRED.get(cls.__name__, ())
    return names + MOUSE_REQUIRED if cls is ActionConfig and data.get("enable_mouse") is True else names


def config_from_dict(data: Mapping[str, Any], name: str, where: str = "<dict>") -> WanConfig:
    """A checked :class:`WanConfig` from ``{"model": ..., "inference": ...}`` or an upstream config.json dict."""
    if "model" in data:
        unknown = sorted(k for k in data if k not in TOP_LEVEL and not k.startswith("_"))
        if unknown:
            raise WanTrtError(f"{where}: unknown top-level key(s) {', '.join(map(repr, unknown))}; a wan-trt config "
                              f"holds {', '.join(TOP_LEVEL)}")
        model = build(ModelConfig, data["model"], where, "model.", _required)
        inference = (build(InferenceConfig, data["inference"], where, "inference.", _required)
                     if "inference" in data else _inference_for(model, where))
    else:
        model = build(ModelConfig, data, where, "", _required)
        inference = _inference_for(model, where)
    cfg = WanConfig(name=_checked_name(data.get("name", name), where, derived="name" not in data), model=model,
                    inference=inference)
    validate(cfg, where)
    return cfg


def _checked_name(name: Any, where: str, derived: bool = False) -> str:
    """The config's name, which names output folders (out/<name>_...): a plain file name. ``derived``: taken
    from the file's (or, for a config.json, its folder's) name, which is then what to rename."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        origin = " (the config file's name, or its folder's for a config.json: rename it)" if derived else ""
        raise WanTrtError(f"{where}: name {name!r}{origin}: expected letters, digits, '.', '_' or '-', not starting "
                          "with '.' (it names the output folders)")
    return name


def _inference_for(model: ModelConfig, where: str) -> InferenceConfig:
    """Streaming settings for an upstream config.json: those of the preset with its action signature."""
    signature = (model.action_config.keyboard_dim_in, model.action_config.enable_mouse)
    for preset in FULL_PRESETS:
        candidate = read_json_object(PRESET_DIR / f"{preset}.json")
        action = candidate["model"]["action_config"]
        if (action["keyboard_dim_in"], action["enable_mouse"]) == signature:
            logger.info("%s has no inference settings: using those of preset '%s'", where, preset)
            return build(InferenceConfig, candidate["inference"], preset, "inference.", _required)
    logger.info("%s has no inference settings: using the defaults (3 steps, shift 5)", where)
    return InferenceConfig()


def preset_names() -> list[str]:
    """Names of the built-in presets, full-size first."""
    names = sorted(p.stem for p in PRESET_DIR.glob("*.json"))
    return [n for n in FULL_PRESETS if n in names] + [n for n in names if n not in FULL_PRESETS]


def load_config(name_or_path: str | Path) -> WanConfig:
    """A preset name (``universal``, ``universal-small``...) or a path to a JSON config.

    Raises:
        WanTrtError: unknown preset, unreadable file, or a field with a bad value.
    """
    text = str(name_or_path)
    if not text:  # an unset shell variable, say: read as a path it would be the current folder
        raise WanTrtError(f"--config '': empty; give a preset ({', '.join(preset_names())}) or a config.json path")
    if text in preset_names():  # a bare name: a path (absolute, or with a folder) is never a preset's
        return config_from_dict(read_json_object(PRESET_DIR / f"{text}.json"), text, f"preset '{text}'")
    path = Path(text)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if not path.is_file():
        kind = ("a folder without a config.json" if path.is_dir() else "not a regular file (a pipe? write it to "
                "a file first)" if path.exists() else "neither a preset nor a file")
        raise WanTrtError(f"--config '{text}' is {kind}; presets: {', '.join(preset_names())}")
    path = path.resolve()  # `--config config.json` in its own folder: the folder's name, not ''
    name = path.parent.name if path.name == "config.json" else path.stem
    cfg = config_from_dict(read_json_object(path), name, str(path))
    if cfg.name in preset_names() and cfg != load_config(cfg.name):
        # outputs are named after a config (out/<name>_...), and commands wan-trt advises say --config <name>
        raise WanTrtError(f"--config {text}: its name '{cfg.name}' is a preset's, and it is not that preset: its "
                          f"outputs would take the preset's default folders (out/{cfg.name}_...) and the commands "
                          "wan-trt advises would name the preset; give it a name of its own (\"name\" in the file, "
                          "or the file's name)")
    return cfg
