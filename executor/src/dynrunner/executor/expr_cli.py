"""`dynrunner-executor expr`: evaluate expressions from the shell or from tooling.

    dynrunner-executor expr --context ctx.json "github.ref == 'refs/heads/main'"
    dynrunner-executor expr --if --status failure "failure()"
    dynrunner-executor expr --batch < requests.jsonl

The single form prints the value as JSON and exits 2 with the error on stderr. `--batch`
reads one JSON object per line, `{"expr": ..., "context": {...}}` (optional `"if": true`,
`"status"`, `"where"`), and writes one line per request, `{"result": ...}` or
`{"error": "..."}`, never stopping at an error.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from dynrunner.executor.hashfiles import hash_files
from dynrunner.proto.expressions.availability import ALLOWED_CONTEXTS
from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.evaluator import JOB_STATUSES, EvalEnv, evaluate
from dynrunner.proto.expressions.templates import evaluate_if


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("expression", nargs="?", help="the expression (without ${{ }}; with it for --if)")
    parser.add_argument("--context", type=Path, help='JSON file with the contexts, e.g. {"github": {...}}')
    parser.add_argument("--if", dest="as_if", action="store_true", help="evaluate as an if: condition")
    parser.add_argument("--status", choices=JOB_STATUSES, default="success", help="job status for status functions")
    parser.add_argument(
        "--where",
        choices=sorted(ALLOWED_CONTEXTS),
        metavar="WORKFLOW_KEY",
        help="allow only the contexts available at this workflow key, e.g. jobs.<job_id>.steps.if",
    )
    parser.add_argument("--workspace", type=Path, help="workspace directory for hashFiles()")
    parser.add_argument("--batch", action="store_true", help="read JSON lines from stdin, write one result per line")


def plain(value: Any) -> Any:
    """JSON-ready copy: objects to dicts, whole floats to ints (GitHub prints 1, not 1.0)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _evaluate(
    expression: Any, contexts: Any, *, as_if: bool, status: str, where: str | None, workspace: Path | None
) -> Any:
    if not isinstance(contexts, Mapping):
        raise ExpressionError("The context must be a JSON object of contexts")
    if where is not None and where not in ALLOWED_CONTEXTS:
        raise ExpressionError(f"Unknown workflow key '{where}'")
    env = EvalEnv(
        contexts=contexts,
        allowed=ALLOWED_CONTEXTS[where] if where else None,
        job_status=status,
        hash_files=functools.partial(hash_files, workspace) if workspace is not None else None,
    )
    if as_if:
        return evaluate_if(expression, env)
    if not isinstance(expression, str):
        raise ExpressionError("The expression must be a string")
    return evaluate(expression, env)


def _dump(value: Any) -> str:
    return json.dumps(plain(value), ensure_ascii=False)


def run_batch(source: IO[str], sink: IO[str], args: argparse.Namespace) -> None:
    for line in source:
        if not line.strip():
            continue
        try:
            try:
                request = json.loads(line)
            except ValueError as error:
                raise ExpressionError(f"The request is not valid JSON: {error}") from None
            if not isinstance(request, Mapping) or "expr" not in request:
                raise ExpressionError('A request is a JSON object {"expr": ..., "context": {...}}')
            status = request.get("status", args.status)
            if status not in JOB_STATUSES:
                raise ExpressionError(f"Unknown job status '{status}', expected one of {', '.join(JOB_STATUSES)}")
            result = _evaluate(
                request["expr"],
                request.get("context") or {},
                as_if=bool(request.get("if", args.as_if)),
                status=status,
                where=request.get("where", args.where),
                workspace=args.workspace,
            )
            out = _dump({"result": result})
        except ExpressionError as error:
            out = _dump({"error": str(error)})
        sink.write(out + "\n")
        sink.flush()


def main(args: argparse.Namespace) -> int:
    if args.batch:
        run_batch(sys.stdin, sys.stdout, args)
        return 0
    if args.expression is None:
        print("expr: an expression is required (or --batch)", file=sys.stderr)
        return 2
    try:
        contexts: Any = {}
        if args.context is not None:
            try:
                contexts = json.loads(args.context.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ExpressionError(f"Cannot read the contexts from {args.context}: {error}") from None
        result = _evaluate(
            args.expression,
            contexts,
            as_if=args.as_if,
            status=args.status,
            where=args.where,
            workspace=args.workspace,
        )
    except ExpressionError as error:
        print(str(error), file=sys.stderr)
        return 2
    print(_dump(result))
    return 0
