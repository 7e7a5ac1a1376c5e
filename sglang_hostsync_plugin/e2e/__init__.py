"""The end-to-end benchmark: stock SGLang vs the plugin in real ``sglang.launch_server``
processes (``python -m sglang_hostsync_plugin.e2e``, or ``sglang-hostsync e2e``).

``matrix`` (configurations, arms, launch commands), ``client`` (HTTP), ``stats``
(windows, aggregates, identity, report), ``run`` (the orchestration and the CLI).
"""

from .run import main

__all__ = ["main"]
