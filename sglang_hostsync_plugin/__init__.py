"""sglang-hostsync-plugin: no per-step host syncs in SGLang speculative decoding.

Entry point ``[sglang.srt.plugins] hostsync = sglang_hostsync_plugin:register``.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _registered(target: str, hook) -> bool:
    from sglang.srt.plugins.hook_registry import HookRegistry

    return any(h is hook for _, h, _ in HookRegistry._hooks.get(target, ()))


def register() -> None:
    """Called by SGLang's ``load_plugins()`` in the launcher and every process.

    Idempotent. While the plugin is disabled it registers only the CLI shim and the
    launcher gate (which checks a plugin enabled after this call, and says so); so does a
    launcher (``runtime.defer``), whose schedulers run in processes of their own. SGLang's
    scheduler processes register the selected slots and the scheduler gate only (nothing
    while disabled); its detokenizer and DP controller, which run no slot code, nothing.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import cli, config, runtime

    role = runtime.process_role()
    if role in runtime.NO_SLOT_ROLES:
        return
    scheduler = role == "scheduler"  # parses no arguments and launches nothing
    if scheduler:
        if _registered(runtime.SCHEDULER_INIT, runtime._scheduler_gate):
            return
    else:
        if _registered(cli.ADD_CLI_ARGS, cli.add_cli_args_hook):
            return
        HookRegistry.register(cli.ADD_CLI_ARGS, cli.add_cli_args_hook, HookType.AFTER)
        HookRegistry.register(cli.PREPARE_SERVER_ARGS, cli.prepare_server_args_hook, HookType.AROUND)
    try:
        enabled = config.plugin_enabled()
    except config.HostsyncConfigError as exc:
        # A malformed switch must not start the server silently without the plugin.
        runtime.activate(error=exc, launcher_gate=not scheduler)
        return
    if enabled and not scheduler and runtime.launcher_defers():
        runtime.defer()
    elif enabled:
        runtime.activate(launcher_gate=not scheduler)
    elif not scheduler:
        runtime.register_launcher_gate()
