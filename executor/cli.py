"""The ``agentsafe`` console script.

Subcommands import what they need lazily, so ``agentsafe verify intent`` works without starting
anything. Packages that add subcommands (the operator adds ``operator`` and ``crds``) register a
callable under the ``agentsafe.commands`` entry-point group that receives the subparsers object;
the executor itself never imports them.

Exit statuses: 0 success, 1 a check failed, 2 usage, 78 configuration invalid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]

Runner = Callable[[argparse.Namespace], int]


def _serve(args: argparse.Namespace) -> int:
    from .serve import main as serve_main

    return serve_main()


def _demo(args: argparse.Namespace) -> int:
    from .tools.demo import main as demo_main

    return demo_main(keep_serving=not args.no_wait)


def _config(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from .config import load_config
    from .errors import AgentSafeError, ConfigError
    from .policy.policy import compile_policy, load_policy
    from .tools.config_view import describe_config, render_config_table
    from .tools.doctor import read_environment

    environ = read_environment(args.env_file)
    try:
        rows = describe_config(environ)
    except ConfigError as exc:
        if args.output == "json":
            error = {"code": exc.code, "variable": exc.variable, "message": str(exc)}
            sys.stdout.write(json.dumps({"valid": False, "error": error}, indent=2) + "\n")
        print(f"agentsafe: configuration invalid: {exc}", file=sys.stderr)
        return exc.exit_status
    try:
        # serve would refuse this policy at start-up: the same code and the same status.
        compile_policy(load_policy(load_config(environ).executor_policy_file))
        problem = None
    except AgentSafeError as exc:
        problem = exc
    if args.output == "json":
        body: dict[str, Any] = {"valid": problem is None, "variables": [asdict(r) for r in rows]}
        if problem is not None:
            body["error"] = {
                "code": problem.code,
                "variable": "EXECUTOR_POLICY_FILE",
                "message": str(problem),
            }
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(render_config_table(rows))
    if problem is not None:
        print(f"agentsafe: policy invalid: {problem.code}: {problem}", file=sys.stderr)
        return ConfigError.exit_status
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        return version("agentsafe")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return __version__


def _verify_intent(args: argparse.Namespace) -> int:
    from .tools.verify_intent import run

    return run(Path(args.path))


_GENESIS_HELP = (
    "also report REMOVED when a stream does not start at its genesis line (a whole log, not a"
    " window cut from one)"
)


def _verify_chain(args: argparse.Namespace) -> int:
    from .evidence.chainverify import main as chain_main

    return chain_main([*(["--require-genesis"] if args.require_genesis else []), args.path])


def _verify_bundle(args: argparse.Namespace) -> int:
    from .evidence.bundle import main as bundle_main

    return bundle_main([args.path])


def _verify_provider(args: argparse.Namespace) -> int:
    from .provider import main as provider_main

    return provider_main([args.path])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentsafe",
        description=(
            "agentsafe: the execution boundary between AI agents and the systems they change. "
            "An agent proposes; the executor authenticates it, pins the exact intent, asks the "
            "policy authority, and on ALLOW executes once under a single-use grant."
        ),
        epilog="Configuration is read from EXECUTOR_* and DOWNSTREAM_* variables; "
        "see docs/configuration.md, or run 'agentsafe config'.",
    )
    parser.add_argument(
        "--version", action="version", version=f"agentsafe {_version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the executor from the environment's configuration",
        description="Run the trusted executor. Start order: audit hook, configuration, posture, "
        "secrets, journal, evidence chains, use store, startup reconciliation, listener. "
        "SIGTERM drains in-flight work and exits 0; SIGHUP re-reads secret files.",
    )
    serve.set_defaults(run=_serve)

    demo = sub.add_parser(
        "demo",
        help="run the whole lifecycle against a loopback synthetic provider",
        description="Start a synthetic provider and an executor on loopback with the bundled "
        "example policy, drive a scripted agent through ALLOW, replay, BLOCK, ESCALATE, shadow "
        "and a crash with reconciliation, print the results, then keep serving until Ctrl-C.",
    )
    demo.add_argument(
        "--no-wait", action="store_true", help="exit after the scripted run instead of serving"
    )
    demo.set_defaults(run=_demo)

    config = sub.add_parser(
        "config",
        help="print the resolved configuration and where each value came from",
        description="Print every configuration key, its resolved value and its source "
        "(env, file, default), then load and compile the policy file as serve does. Secrets "
        "are shown only as <set>. Exit 78 if the configuration or the policy is invalid.",
    )
    config.add_argument(
        "--env-file", help="a KEY=VALUE file (as agentsafe init writes) over the environment"
    )
    config.add_argument("-o", "--output", choices=["text", "json"], default="text")
    config.set_defaults(run=_config)

    verify = sub.add_parser(
        "verify", help="offline verifiers (need nothing from a running process)"
    )
    vsub = verify.add_subparsers(dest="what", metavar="WHAT", required=True)
    vi = vsub.add_parser(
        "intent",
        help="check agent-safe.intent/1 vectors, or print a binding's canonical bytes and hash",
    )
    vi.add_argument("path", help="a vector file, a directory of vectors, or a plain binding file")
    vi.set_defaults(run=_verify_intent)
    vc = vsub.add_parser("chain", help="walk an evidence or security log's hash chain")
    vc.add_argument("path", help="a JSON-lines file captured from the executor's stdout or stderr")
    vc.add_argument("--require-genesis", action="store_true", help=_GENESIS_HELP)
    vc.set_defaults(run=_verify_chain)
    vb = vsub.add_parser(
        "bundle",
        help="verify an evidence bundle (key from AGENTSAFE_EVIDENCE_PUBLIC_KEY, never the bundle)",
    )
    vb.add_argument("path", help="the bundle directory written by evidence-export")
    vb.set_defaults(run=_verify_bundle)
    alias_chain = sub.add_parser("verify-chain", help="the same as 'verify chain'")
    alias_chain.add_argument("path")
    alias_chain.add_argument("--require-genesis", action="store_true", help=_GENESIS_HELP)
    alias_chain.set_defaults(run=_verify_chain)
    alias_bundle = sub.add_parser("verify-bundle", help="the same as 'verify bundle'")
    alias_bundle.add_argument("path")
    alias_bundle.set_defaults(run=_verify_bundle)
    vp = vsub.add_parser("provider-request", help="run a verifying-provider test vector")
    vp.add_argument("path", help="a provider request vector (JSON)")
    vp.set_defaults(run=_verify_provider)

    from .tools.approvals_cli import add_approvers_parser
    from .tools.approvals_cli import add_parser as add_approvals

    add_approvals(sub)
    add_approvers_parser(sub)

    from .tools.policy_cli import add_parser as add_policy

    add_policy(sub)

    from .tools.store_cli import add_parser as add_store

    add_store(sub)

    from .tools.init_cli import add_parser as add_init

    add_init(sub)

    from .tools.doctor import add_parser as add_doctor

    add_doctor(sub)

    from .tools.status_cli import add_parser as add_status

    add_status(sub)

    from .tools.selftest import add_parser as add_test

    add_test(sub)

    from .tools.mcp_bridge import add_parser as add_mcp

    add_mcp(sub)

    from .proxy import add_parser as add_proxy

    add_proxy(sub)

    for ep in entry_points(group="agentsafe.commands"):
        register: Callable[[Any], None] = ep.load()
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        runner: Runner = args.run
        return runner(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
