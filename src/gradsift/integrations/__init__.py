"""Glue for training frameworks. Each submodule imports its framework only when it is
itself imported (``import gradsift`` never imports Lightning or transformers):
``gradsift.integrations.lightning.TopKHookCallback``. See ``docs/integrations.md``."""
