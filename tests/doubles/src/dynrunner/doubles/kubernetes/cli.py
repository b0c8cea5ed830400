"""`dynrunner-kube-double serve`: the Kubernetes API, scheduler, kubelet and SPIRE doubles as a process.

Prints one JSON line once it serves — `{"url", "kubeconfig", "nodes": {name: {"uid",
"workloadApiSocket"}}, "trustDomain"}` — and serves until SIGTERM or SIGINT. Images given
with `--image REF` run with this Python environment's bin directory first on PATH (so a Pod
whose command is `dynrunner-executor` runs this venv's executor); `--image REF=PROGRAM`
also sets the image's entrypoint.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path

from dynrunner.doubles.kubernetes.cluster import Cluster, NodeSpec
from dynrunner.doubles.kubernetes.images import Image, this_environment
from dynrunner.doubles.spire.double import SpireOptions


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynrunner-kube-double", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve until SIGTERM/SIGINT")
    serve.add_argument("--state-dir", type=Path, required=True, help="Pod directories, logs and the kubeconfig")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--node", action="append", default=[], help="a node name (repeatable; default node-a)")
    serve.add_argument("--namespace", action="append", default=[], help="namespaces to create besides default")
    serve.add_argument(
        "--image", action="append", default=[], metavar="REF[=PROGRAM]", help="an image the kubelet can run"
    )
    serve.add_argument("--pull-seconds", type=float, default=0.0, help="how long each image pull takes")
    serve.add_argument("--trust-domain", default="example.org")
    serve.add_argument("--cluster", default="ci", help="the k8s_psat cluster name of the SPIRE agents")
    serve.add_argument("--issue-delay", type=float, default=0.0, help="seconds before a new entry reaches the agents")
    serve.add_argument("--token", help="require this bearer token")
    return parser


def _images(specs: list[str], pull_seconds: float) -> dict[str, Image]:
    images = {}
    for spec in specs:
        ref, _, program = spec.partition("=")
        images[ref] = this_environment(*((program,) if program else ()), pull_seconds=pull_seconds)
    return images


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    nodes = [NodeSpec(name) for name in args.node or ["node-a"]]
    api = {"port": args.port, "namespaces": ["default", "kube-system", *args.namespace]}
    if args.token:
        api["tokens"] = [args.token]
    spire = SpireOptions(trust_domain=args.trust_domain, cluster=args.cluster, issue_delay=args.issue_delay)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with Cluster.running(
        args.state_dir, nodes=nodes, images=_images(args.image, args.pull_seconds), api=api, spire=spire
    ) as cluster:
        kubeconfig = cluster.api.write_kubeconfig(args.state_dir / "kubeconfig", token=args.token)
        sockets = {name: str(agent.socket_path) for name, agent in cluster.spire.agents.items()}
        nodes_out = {
            name: {"uid": cluster.node_uid(name), "workloadApiSocket": sockets[name]} for name in cluster.kubelets
        }
        print(
            json.dumps(
                {
                    "url": cluster.api.url,
                    "kubeconfig": str(kubeconfig),
                    "nodes": nodes_out,
                    "trustDomain": args.trust_domain,
                }
            ),
            flush=True,
        )
        stop.wait()


if __name__ == "__main__":
    main()
