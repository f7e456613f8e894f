"""Keep an engine that loads weights from disk current: patch its checkpoint
directory in place, then ask it to reload over HTTP after each commit.

    python examples/receive_http.py --store /shared/refit-store --member r0 \
        --checkpoint /models/r0 --url http://127.0.0.1:30000/update_weights_from_disk \
        [--payload '{"model_path": "{checkpoint}", "load_format": "auto"}']

SGLang's POST /update_weights_from_disk takes {"model_path": DIR}; the
payload is configurable for other engines ({checkpoint} and {version} are
filled in). Runs on NumPy alone (no PyTorch).
"""

import argparse
import json
import time

import refit
from refit.adapters import HttpReload


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--member", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--payload", default='{"model_path": "{checkpoint}"}')
    ap.add_argument("--until", type=int, default=0, help="stop at this version (0: never)")
    ap.add_argument("--poll", type=float, default=0.5)
    args = ap.parse_args()

    template = json.loads(args.payload)

    def payload(report):
        return {k: (v.replace("{checkpoint}", report.checkpoint_dir)
                    .replace("{version}", str(report.active_version))
                    if isinstance(v, str) else v) for k, v in template.items()}

    reload = HttpReload(args.url, payload)
    rcv = refit.Receiver(args.store, member=args.member, checkpoint_dir=args.checkpoint,
                         on_commit=reload)
    while not args.until or rcv.active_version < args.until:
        report = rcv.sync()  # apply, vote, commit, then POST to the engine
        if report.committed_versions:
            print(f"version {report.active_version}: {len(report.changed_tensors)} tensors "
                  f"changed; engine answered {reload.last_response}")
        else:
            time.sleep(args.poll)


if __name__ == "__main__":
    main()
