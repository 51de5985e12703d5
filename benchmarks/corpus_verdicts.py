"""The corpora's verdicts, now and at an earlier revision, side by side: the same kernels and tasks (this tree's
files) judged by this tree's evaluator and by the one at --before, in one run.

Corpora: tests/corpus/real (JAX's own kernels), bad (every trick and broken kernel), third_party (honest kernels in
the style other pipelines write) and kernelbench (KernelBench-style modules). The earlier revision is checked out
in a temporary git worktree and evaluates through its own code, in a process of its own. Printed per kernel: the
task, the verdict before and now (verdict stage:kind), and whether it changed; then the counts per corpus.

    .venv/bin/python benchmarks/corpus_verdicts.py [--before REV] [--only NAME,NAME] [--workers 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"
TASKS = REPO / "tasks"
EVAL_TIMEOUT_S = "120"  # the hanging kernel is stopped at this; every honest kernel here takes far less


def entries() -> list[dict[str, str]]:
    """Every corpus kernel with its task (the mappings the corpus tests keep)."""
    sys.path.insert(0, str(REPO))
    from tests.tpu_runner.test_evaluate_corpus import BAD, THIRD_PARTY
    from tests.tpu_runner.test_evaluate_real import REAL

    def entry(corpus: str, name: str, task: Path) -> dict[str, str]:
        return {"corpus": corpus, "name": name, "kernel": str(CORPUS / corpus / f"{name}.py"), "task": str(task)}

    out = [entry("real", n, TASKS / t) for n, t in REAL.items()]
    out += [entry("bad", n, TASKS / t[0]) for n, t in BAD.items()]
    out += [entry("third_party", n, TASKS / t) for n, t in THIRD_PARTY.items()]
    out.append(entry("third_party", "center_production_width", CORPUS / "third_party" / "center_task"))
    out += [entry("kernelbench", n, CORPUS / "kernelbench" / "suite" / "19_Gemm_ReLU.py")
            for n in ("gemm_relu_new", "gemm_relu_other_weights")]
    return out


def judge(requests: list[dict[str, str]], out: Path, workers: int) -> None:
    """Driver mode, run with the evaluator under test first on sys.path: every request's verdict to `out`."""
    from storage.settings import load_settings
    from tpu_runner.evaluation import EvalRequest, evaluate_many

    settings = load_settings(dict(os.environ))
    reqs = [EvalRequest(Path(r["task"]), Path(r["kernel"]), "v6e") for r in requests]
    verdicts = []
    for r, result in zip(requests, evaluate_many(reqs, settings, workers=workers), strict=True):
        if isinstance(result, Exception):
            verdicts.append({**r, "verdict": "error", "kind": type(result).__name__,
                             "message": str(result).splitlines()[0][:300] if str(result) else ""})
            continue
        verdicts.append({**r, "verdict": result.verdict, "stage": result.stage,
                         "kind": result.error.kind if result.error else "", "message": result.message[:300]})
    out.write_text(json.dumps(verdicts))


def run_at(code_root: Path, requests: list[dict[str, str]], home: Path, workers: int) -> list[dict[str, str]]:
    """The verdicts of the evaluator at `code_root`, in a process of its own."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "requests.json").write_text(json.dumps(requests))
    env = {**os.environ, "KERNELBOT_HOME": str(home), "KERNELBOT_EVAL_TIMEOUT": EVAL_TIMEOUT_S,
           "PYTHONPATH": os.pathsep.join(p for p in (str(code_root), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("KERNELBOT_CONFIG", None)
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--driver", str(home / "requests.json"),
                    str(home / "verdicts.json"), "--code", str(code_root), "--workers", str(workers)],
                   env=env, check=True, cwd=code_root)
    return json.loads((home / "verdicts.json").read_text())


def said(v: dict[str, str] | None) -> str:
    if v is None:
        return "-"
    if v["verdict"] == "error":
        return f"error: {v['kind']}: {v['message'][:60]}"
    stage = "" if v.get("stage") == "done" else f" {v['stage']}"
    return f"{v['verdict']}{stage}" + (f":{v['kind']}" if v.get("kind") else "")


def table(before: list[dict[str, str]] | None, now: list[dict[str, str]], rev: str | None) -> str:
    then = {(v["corpus"], v["name"]): v for v in before or []}
    lines = [f"{'corpus/kernel':<44} {'task':<24} {('at ' + rev) if rev else '':<44} now"]
    for v in now:
        old = then.get((v["corpus"], v["name"])) if before is not None else None
        changed = " *" if old is not None and said(old) != said(v) else ""
        lines.append(f"{v['corpus'] + '/' + v['name']:<44} {Path(v['task']).name[:24]:<24} "
                     f"{said(old) if before is not None else '':<44} {said(v)}{changed}")
    for corpus in dict.fromkeys(v["corpus"] for v in now):
        def counts(vs: list[dict[str, str]], corpus: str = corpus) -> str:
            n: dict[str, int] = {}
            for v in vs:
                if v["corpus"] == corpus:
                    n[v["verdict"]] = n.get(v["verdict"], 0) + 1
            return ", ".join(f"{k} {c}" for k, c in sorted(n.items()))
        lines.append(f"{corpus}: " + (f"at {rev}: {counts(before)}; " if before is not None else "")
                     + f"now: {counts(now)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a git revision to judge the same corpus with (default: now only)")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write both runs' verdicts here")
    parser.add_argument("--driver", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        sys.path.insert(0, str(args.code))
        judge(json.loads(args.driver[0].read_text()), args.driver[1], args.workers)
        return
    only = {n for n in args.only.split(",") if n}
    requests = [e for e in entries() if not only or e["name"] in only]
    with tempfile.TemporaryDirectory(prefix="kb-corpus-") as tmp:
        before = None
        if args.before:
            tree = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), args.before],
                           check=True)
            try:
                t0 = time.perf_counter()
                before = run_at(tree, requests, Path(tmp) / "home-before", args.workers)
                print(f"at {args.before}: {len(before)} kernels judged in {time.perf_counter() - t0:.0f} s", flush=True)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        t0 = time.perf_counter()
        now = run_at(REPO, requests, Path(tmp) / "home-now", args.workers)
        print(f"now: {len(now)} kernels judged in {time.perf_counter() - t0:.0f} s\n", flush=True)
    print(table(before, now, args.before))
    if args.json:
        args.json.write_text(json.dumps({"before": before, "now": now, "revision": args.before}, indent=1))


if __name__ == "__main__":
    main()
