#!/usr/bin/env python3
"""Runs the command blocks of docs/tutorial.md in order, so it stays true.

Every block fenced as ```sh is run, in order of appearance, by one bash
process (as if pasted into one terminal) under `set -euo pipefail`, in a
temporary directory: the first failing command fails the test, naming the
block. Blocks fenced otherwise (```text for output, ```shell for installing
and building) are not run. Blocks fenced as ```sh s3 need moto_server: when
it is not on PATH they are left out, and the test says so loudly (as the S3
tests of the C++ suite skip without it).

The tutorial honors REFIT_BIN_DIR (the folder holding the refit binary) and
FIXTURES (the qwen2-tiny folder); this test points them at the build and at
REFIT_FIXTURES_DIR. Background processes the tutorial starts share the
bash process's session, which is killed as a whole at the end, also on a
failure or a timeout.

usage: tutorial_test.py --refit PATH/TO/refit [--tutorial docs/tutorial.md]
                        [--timeout S] [--synthetic] [-v]
"""

import argparse
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^```(.*)$")


def blocks(text):
    """Yields (line, info, body) for every fenced block of the markdown."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info, start, body = m.group(1).strip(), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            sys.exit(f"tutorial: the block at line {start} is not closed")
        i += 1
        yield start, info, "\n".join(body)


def script(tutorial, with_s3):
    """The bash script: every runnable block, each announced on stderr."""
    parts = [
        "set -euo pipefail",
        "trap 'rc=$?; echo \"tutorial_test: FAILED (exit $rc) in the block at "
        "line $TUTORIAL_LINE: $BASH_COMMAND\" >&2' ERR",
    ]
    ran, left_out = 0, 0
    for line, info, body in blocks(tutorial.read_text()):
        words = info.split()
        if not words or words[0] != "sh":
            continue
        if "s3" in words[1:] and not with_s3:
            left_out += 1
            continue
        parts.append(f"TUTORIAL_LINE={line}")
        parts.append(f"echo '--- tutorial_test: block at line {line}' >&2")
        parts.append(body)
        ran += 1
    return "\n".join(parts) + "\n", ran, left_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refit", required=True, help="the refit binary")
    ap.add_argument("--tutorial",
                    default=str(pathlib.Path(__file__).resolve().parent.parent /
                                "docs" / "tutorial.md"))
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--synthetic", action="store_true",
                    help="no fixtures: the tutorial generates its checkpoints")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print the tutorial's output also when it passes")
    args = ap.parse_args()

    refit = pathlib.Path(args.refit).resolve()
    if not os.access(refit, os.X_OK):
        sys.exit(f"tutorial_test: no refit binary at {refit}")
    with_s3 = shutil.which("moto_server") is not None
    text, ran, left_out = script(pathlib.Path(args.tutorial), with_s3)

    with tempfile.TemporaryDirectory(prefix="refit-tutorial-") as tmp:
        env = dict(os.environ)
        env["TMPDIR"] = tmp  # the tutorial's `mktemp -d` lands in here
        env["REFIT_BIN_DIR"] = str(refit.parent)
        fixtures = os.environ.get("REFIT_FIXTURES_DIR", "")
        env["FIXTURES"] = (os.path.join(tmp, "no-fixtures") if args.synthetic or not fixtures
                           else os.path.join(fixtures, "qwen2-tiny"))
        source = ("fixtures" if os.path.isfile(os.path.join(env["FIXTURES"], "step0.safetensors"))
                  else "synthetic checkpoints")
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                  "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.pop(k, None)
        out_path = os.path.join(tmp, "tutorial.out")
        t0 = time.monotonic()
        with open(out_path, "w") as out:
            proc = subprocess.Popen(["bash", "-c", text], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            timed_out = False
            try:
                rc = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                timed_out, rc = True, None
            finally:
                # The session holds the receivers, publishers and moto_server the
                # tutorial started in the background: none outlives the test.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        elapsed = time.monotonic() - t0
        output = pathlib.Path(out_path).read_text(errors="replace")
        ok = not timed_out and rc == 0
        if not ok or args.verbose:
            print(output)
        if timed_out:
            last = re.findall(r"--- tutorial_test: block at line (\d+)", output)
            print(f"tutorial_test: FAILED: still running after {args.timeout:.0f} s, "
                  f"in the block at line {last[-1] if last else '?'}")
            return 1
        if rc != 0:
            print(f"tutorial_test: FAILED: exit {rc}")
            return 1
        print(f"tutorial_test: {ran} blocks of {args.tutorial} ran in {elapsed:.1f} s ({source})")
        if left_out:
            print(f"tutorial_test: SKIPPED {left_out} S3 block(s): moto_server is not on PATH")
        return 0


if __name__ == "__main__":
    sys.exit(main())
