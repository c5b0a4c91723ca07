"""Reading a configuration file: the emulator's YAML or the official emulator's ``Config.json``, told
apart by name or first character, handed to ``EmulatorConfig.from_dict`` (which knows both shapes)."""
from __future__ import annotations

import json
import os

import yaml

from .config import EmulatorConfig
from .config_error import ConfigError


def load_config(path) -> EmulatorConfig:
    """Load and validate a config file: the emulator's YAML, or the official emulator's ``Config.json``
    (JSON is recognised by a ``.json`` name or a leading ``{``). Raises ``ConfigError`` on any problem."""
    try:
        with open(path, encoding="utf-8-sig") as fh:      # -sig: Config.json files saved with a BOM
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    if os.fspath(path).lower().endswith(".json") or text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    else:
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    return EmulatorConfig.from_dict(raw if raw is not None else {}, source=os.fspath(path))
