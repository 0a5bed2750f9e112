"""Hydra search-path plugin: the folders of $PRUNELAB_CONF come before prunelab's packaged configs,
for the CLI and the compose API alike, so a user's own groups and options (a cluster launcher, a
private model) compose with the packaged ones. `--config-dir DIR` does the same for one command."""

import os
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class PrunelabSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for folder in reversed([p for p in os.environ.get("PRUNELAB_CONF", "").split(os.pathsep) if p]):
            search_path.prepend(provider="prunelab-user", path=f"file://{Path(folder).expanduser().resolve()}")
