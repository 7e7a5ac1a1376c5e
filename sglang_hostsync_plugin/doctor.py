"""``python -m sglang_hostsync_plugin doctor``: the slot table against the installed
SGLang, no GPU needed. Exit 0 when every slot is consistent with it, 1 on drift,
2 when the configuration itself is bad (unsupported SGLang, bad slot list)."""

from __future__ import annotations

import argparse
import sys

from . import config, registry, report, version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-hostsync")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="check every slot against the installed sglang")
    doc.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    installed = version.installed_sglang()
    try:
        version.check_sglang_version(installed)  # raises unless pinned or overridden
        catalogue = registry.catalogue()
        selection = config.selected_slots(catalogue)
    except (config.HostsyncConfigError, registry.SlotRegistryError) as exc:
        print(f"hostsync doctor: {exc}", file=sys.stderr)
        return 2
    rows = report.doctor_rows(catalogue)
    ok = report.rows_ok(rows)
    if args.json:
        print(
            report.doctor_json(
                rows,
                sglang=installed,
                supported_sglang=version.SUPPORTED_SGLANG,
                selected=list(selection.names),
                ok=ok,
            )
        )
    else:
        header = (
            f"sglang-hostsync-plugin doctor: sglang {installed} "
            f"(supported {version.SUPPORTED_SGLANG}); "
            f"{config.ENV_SLOTS}={selection.spec!r} selects: {', '.join(selection.names) or 'none'}"
        )
        print(report.format_doctor(rows, header))
        print("OK: every slot is consistent with the installed sglang" if ok else "DRIFT: see the status column")
    return 0 if ok else 1
