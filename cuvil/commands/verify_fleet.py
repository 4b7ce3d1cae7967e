"""``cuvil verify-fleet``: the verification checks over a fleet of models and targets, one report."""

from __future__ import annotations

import argparse
import sys

from cuvil.commands.common import cache_dir


def _cmd_verify_fleet(args: argparse.Namespace) -> int:
    """Run the fleet's jobs; exit 0 when every job passed, 1 when one did not (2: usage errors)."""
    from cuvil.verify.fleet import verify_fleet

    try:
        report = verify_fleet(args.fleet, executor=args.executor, jobs=args.jobs, ray_address=args.ray_address,
                              report_dir=args.report_dir, resume=args.resume, max_failures=args.max_failures,
                              baseline_run=args.baseline_run, cache_dir=cache_dir())
    except KeyboardInterrupt:  # the running jobs were ended; the finished ones are in the report folder
        print(f"cancelled; the jobs done are reported in {args.report_dir}", file=sys.stderr)
        return 130
    print(f"reports in {args.report_dir}: index.html, fleet.json, junit.xml, summary.md", file=sys.stderr)
    print(report.verdict)
    return report.exit_status


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the command's parser to the ``cuvil`` command line."""
    v = sub.add_parser("verify-fleet", help="run the verification checks over a fleet of models and targets",
                       description="Every (model, target, check group) of the fleet file is a job run by cuvil "
                                   "verify in a process of its own, under its time and memory limits.",
                       epilog="exit status: 0 every job passed, 1 a job failed, crashed, hung or ran out of memory "
                              "(or jobs were left unrun by --max-failures), 2 a usage error; environment: "
                              "CUVIL_CACHE_DIR is the build cache folder. The fleet file's format and the cluster "
                              "set-up: docs/fleet.md")
    v.add_argument("fleet", metavar="FLEET.toml", help="the fleet file: [defaults] and [[model]] entries")
    v.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: processes on this machine (the default); ray: Ray tasks (pip install 'cuvil[ray]')")
    v.add_argument("--ray-address", metavar="ADDR",
                   help="with --executor ray: the cluster to join (auto, or ray://HOST:10001); default: start a "
                        "local one")
    v.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="jobs run at a time (default: local, every core this process may use; ray, the "
                        "cluster's CPUs)")
    v.add_argument("--report-dir", metavar="DIR", default="fleet-report",
                   help="the results folder and the fleet report (default fleet-report)")
    v.add_argument("--resume", action="store_true",
                   help="take the results folder's stored result of every job whose inputs did not change")
    v.add_argument("--max-failures", type=int, metavar="N", help="start no job after N jobs failed")
    v.add_argument("--baseline-run", metavar="FLEET_JSON",
                   help="the fleet.json the dashboard's trends compare with (default: the report folder's own, "
                        "from its last sweep)")
    v.set_defaults(fn=_cmd_verify_fleet)
