"""``nodehealth nccl``: the NCCL self-test now, and the NCCL parsers.

    nodehealth nccl run [--mode nvlink|ib_loopback|both] [--runner auto|nccl-tests|builtin]
                        [--timeout S] [--format text|json] [--config FILE]
    nodehealth nccl parse FILE|-        (nccl-tests output)
    nodehealth nccl transport FILE|-    (an NCCL_DEBUG=INFO log)

``run`` runs the ``nccl_selftest`` check now, whatever ``enabled`` says, with the config's
settings and these overrides, and prints its verdict. It never drains, resumes or calls Slurm
(it needs no Slurm probe). Exit 0 healthy (warnings allowed), 1 FAIL, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from nodehealth import SCHEMA_VERSION
from nodehealth.commands.common import UsageError, fail_usage, load_config, use_color
from nodehealth.commands.options import ExitCode, add_config, add_format

CHECK = "nccl_selftest"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "nccl",
        help="the NCCL self-test (run) and the NCCL parsers (parse, transport)",
        description="The NCCL all-reduce self-test and the parsers of nccl-tests output and NCCL_DEBUG logs.",
    )
    nsub = p.add_subparsers(dest="nccl_command", metavar="COMMAND", parser_class=type(p))
    r = nsub.add_parser(
        "run",
        help="run the NCCL self-test now (never touches Slurm)",
        description="Run the nccl_selftest check now and print its verdict. Never drains or "
        "calls Slurm. Exit 0 healthy (warnings allowed), 1 FAIL, 2 usage or config "
        "error.",
    )
    add_config(r)
    r.add_argument(
        "--mode",
        choices=("nvlink", "ib_loopback", "both"),
        help="mode(s) to run (default: the config's [checks.nccl_selftest] modes)",
    )
    r.add_argument("--runner", choices=("auto", "nccl-tests", "builtin"), help="runner (default: the config's)")
    r.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="deadline of the whole self-test in seconds (default: the config's timeout_s)",
    )
    add_format(r)
    r.set_defaults(func=run)
    try:
        from nodehealth.nccl import cli_parse
    except ImportError:  # pragma: no cover - the parsers ship with the package
        cli_parse = None  # type: ignore[assignment]
    if cli_parse is not None:
        cli_parse.add_commands(nsub)

    def usage(args: argparse.Namespace) -> int:
        p.print_help(sys.stderr)
        return ExitCode.USAGE

    p.set_defaults(func=usage)


def run(args: argparse.Namespace) -> int:
    from nodehealth import render, runner
    from nodehealth.commands.check import exit_code

    try:
        cfg = load_config(args)
    except UsageError as exc:
        return fail_usage(exc)
    settings = cfg.checks[CHECK]
    changes: dict[str, object] = {}
    if args.mode:
        changes["modes"] = ("nvlink", "ib_loopback") if args.mode == "both" else (args.mode,)
    if args.runner:
        changes["runner"] = args.runner
    if args.timeout is not None:
        if not 1 <= args.timeout <= 600:
            return fail_usage(UsageError("--timeout: between 1 and 600 seconds"))
        changes["timeout_s"] = args.timeout
    settings = dataclasses.replace(settings, **changes)  # type: ignore[arg-type]
    cfg = dataclasses.replace(cfg, checks={**cfg.checks, CHECK: settings})
    outcome = runner.execute(cfg, phase="manual", only=(CHECK,), own_budget_s=settings.timeout_s + 1.0)
    report = outcome.report
    if args.format == "json":
        res = report.results[0]
        sys.stdout.write(
            json.dumps({"schema_version": SCHEMA_VERSION, **res.to_json()}, indent=2, sort_keys=True) + "\n"
        )
    else:
        sys.stdout.write(render.text(report, color=use_color(sys.stdout)))
    return exit_code(report.status, cfg.policy.unknown)
