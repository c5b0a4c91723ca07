"""The error a bad emulator configuration raises, in a module of its own so that every reader of
configuration (the YAML and ``Config.json`` readers, the namespace's service settings) can raise it
without importing the others."""


class ConfigError(ValueError):
    """A bad emulator configuration. The message names the key (and the file when known)."""
