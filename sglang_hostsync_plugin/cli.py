"""The CLI shim: ``--enable-hostsync-plugin`` for ``python -m sglang.launch_server``
and ``sglang serve``. SGLang 0.5.23 has no registry for plugin flags, so the parser
and the argument preparation are hooked. These two hooks are the only ones the
plugin registers while it is disabled."""

from __future__ import annotations

import argparse
import logging
import os

from . import config

logger = logging.getLogger("sglang.srt.plugins.hostsync")

FLAG = "--enable-hostsync-plugin"
ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
PREPARE_SERVER_ARGS = "sglang.srt.server_args.prepare_server_args"


class _EnableAction(argparse._StoreTrueAction):
    """Sets the env switch at parse time, so spawned processes inherit it. A
    store_true action, so ``--config`` YAML accepts ``enable-hostsync-plugin: true``."""

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[config.ENV_ENABLE] = "1"
        setattr(namespace, self.dest, True)


def add_cli_args_hook(result, parser, *args, **kwargs):
    if FLAG not in parser._option_string_actions:
        parser.add_argument(
            FLAG,
            action=_EnableAction,
            help="Enable sglang-hostsync-plugin (no per-step host syncs in speculative "
            f"decoding). Same as {config.ENV_ENABLE}=1; pick slots with {config.ENV_SLOTS}.",
        )
    return None


def prepare_server_args_hook(original, argv, *args, **kwargs):
    server_args = original(argv, *args, **kwargs)
    if config.plugin_enabled():
        from . import runtime

        plan = runtime.validate(server_args)
        if plan.auto_pending:
            logger.info("hostsync: enabled; slots: auto, picked once SGLang has resolved the server arguments")
        else:
            logger.info("hostsync: enabled; slots: %s", enabled_line(plan))
    return server_args


def enabled_line(plan) -> str:
    """The selected slots that act, then how many selected ones are inert for the server
    arguments or refused (the status block names them)."""
    from .slot import Status

    chosen = [v for v in plan.verdicts if v.selected and not v.left_out_by_auto]
    live = [v.name for v in chosen if v.status in (Status.APPLIED, Status.WOULD_APPLY, Status.UPSTREAM)]
    counts = [(sum(v.status is status for v in chosen), what) for status, what in (
        (Status.SKIPPED, "inert for these server arguments"), (Status.FAILED, "refused"))]
    rest = "; ".join(f"{n} {what}" for n, what in counts if n)
    return (", ".join(live) or "none") + (f" (also selected: {rest})" if rest else "")
