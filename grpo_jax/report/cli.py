"""``python -m grpo_jax.report``: its command line (`main`)."""

import argparse
import sys

from grpo_jax import paths, run_files
from grpo_jax.report.markdown import write_report
from grpo_jax.report.runs import collect_runs


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.report", description=(
        "Writes report.md and PNG plots of the runs a grpo_jax.sweep left in DIR."))
    parser.add_argument("root", metavar="DIR", help="the sweep's --workdir_root")
    parser.add_argument("--out", default=None, help="where report.md and the PNGs go "
                        "(default: DIR)")
    parser.add_argument("--collect_into", default=None, metavar="OUT", help=(
        f"first copy the runs' {run_files.RUN_RECORD} and {run_files.METRICS} (gzipped) into "
        "OUT, then report there from the copies: a sweep's small files, e.g. to commit"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        for flag, location in (("DIR", args.root), ("--out", args.out),
                               ("--collect_into", args.collect_into)):
            paths.check_reachable(location or "", flag)
        if args.collect_into:
            collect_runs(args.root, args.collect_into)
        path = write_report(args.collect_into or args.root, args.out)
    except (FileNotFoundError, ImportError, ValueError) as error:
        print(f"grpo_jax.report: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
