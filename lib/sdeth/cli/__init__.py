"""Command line: `python -m sdeth run|worker|prepare|calibrate|render|down` (also installed as `sdeth`):
the top layer, which wires the others together. `main` dispatches: the worker (cli.worker) and the benches with
parsers of their own first, then `build_parser` (cli.parser) and a handler of cli.measure, cli.admin or cli.records."""
from __future__ import annotations

import sys

from . import admin, measure, records
from .parser import build_parser
from .worker import worker_main


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    if argv[:2] == ["bench", "link"]:        # what Ethernet costs on the CPU testbed: the link curve (own parser)
        from ..study.bench import link_cpu
        link_cpu.main(argv[2:])
        return 0
    if argv[:2] == ["bench", "ssd-cpu"]:     # the verdict cache on the CPU, modelled for the H200 (own parser)
        from ..study.streambench import ssd_cpu
        ssd_cpu.main(argv[2:])
        return 0
    if argv[:2] in (["bench", "targets"], ["bench", "wire"], ["bench", "streams"], ["bench", "vllm"]):   # own parsers
        from ..study.bench import targets as bigtargets, wire as wirebench
        from ..study import streambench
        from ..study.vllm import study as vllm_study
        return ({"targets": bigtargets, "wire": wirebench, "streams": streambench,
                 "vllm": vllm_study}[argv[1]].main(argv[2:]) or 0)
    a = build_parser().parse_args(argv)
    from ..models.embedded import ModelError
    from ..models.prompts import PromptError
    from ..study.config import ConfigError
    try:
        return _command(a)(a)
    except (ConfigError, ModelError, PromptError) as e:
        print(f"sdeth: error: {e}", file=sys.stderr)
        return 2


def _command(a):
    """The handler of a parsed command line (each takes the argparse namespace, returns the exit status)."""
    if a.cmd in ("down", "render", "reap") or (a.cmd == "status" and a.cluster):
        return admin.cluster_command
    return {**measure.COMMANDS, **admin.COMMANDS, **records.COMMANDS}[a.cmd]
