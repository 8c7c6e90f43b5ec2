"""The object store on a host of its own (run in its namespace by the fault harness):

    python -m loadtests.netfaults.store_host ROOT ADDRESS BUCKET

Starts SeaweedFS (``thaw.embedded_store``) listening on ADDRESS, S3 on port 8333, with
its credentials in ROOT/credentials.json; prints ``ready`` once the bucket exists, and
stops the store when its standard input closes."""

from __future__ import annotations

import sys
from pathlib import Path

from thaw.embedded_store import EmbeddedStore

S3_PORT = 8333


def main() -> None:
    root, address, bucket = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    store = EmbeddedStore(root, s3_port=S3_PORT, bucket=bucket, host=address)
    store.start(timeout_s=120)
    try:
        print("ready", flush=True)
        sys.stdin.read()  # until the harness closes it
    finally:
        store.stop()


if __name__ == "__main__":
    main()
