#!/usr/bin/env python3
"""The S3 yardstick of ckptd-bench: one file up to or down from an object
store with boto3's transfer manager at its defaults (8 MiB parts, 10
threads), which is what `aws s3 cp` and most Python training code use.

    s3_transfer.py upload   --url s3://bucket/key --file PATH
    s3_transfer.py download --url s3://bucket/key --file PATH
    s3_transfer.py delete   --url s3://bucket/key

Prints one JSON line: {"op", "bytes", "seconds", "gbps"} (GB/s, 1e9 bytes).
The endpoint, region and credentials come from the environment as for the
AWS CLI (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_REGION, AWS_*KEY*);
a non-AWS endpoint is addressed path-style unless CKPTD_S3_ADDRESSING says
virtual, as ckptd does. Exit 1 with a message on stderr on failure.
"""
import argparse
import json
import os
import sys
import time


def client():
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    style = os.environ.get("CKPTD_S3_ADDRESSING") or ("path" if endpoint else "virtual")
    return boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": style}))


def parse_url(url):
    if not url.startswith("s3://") or "/" not in url[5:]:
        raise ValueError(f"{url}: not s3://bucket/key")
    bucket, key = url[5:].split("/", 1)
    if not bucket or not key:
        raise ValueError(f"{url}: not s3://bucket/key")
    return bucket, key


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("op", choices=["upload", "download", "delete"])
    p.add_argument("--url", required=True)
    p.add_argument("--file")
    a = p.parse_args()
    try:
        bucket, key = parse_url(a.url)
        if a.op != "delete" and not a.file:
            raise ValueError(f"{a.op} needs --file")
        s3 = client()
        t0 = time.monotonic()
        if a.op == "upload":
            s3.upload_file(a.file, bucket, key)
            n = os.path.getsize(a.file)
        elif a.op == "download":
            s3.download_file(bucket, key, a.file)
            n = os.path.getsize(a.file)
        else:
            s3.delete_object(Bucket=bucket, Key=key)
            n = 0
        secs = time.monotonic() - t0
    except Exception as e:  # one line for the bench to show
        print(f"s3_transfer.py {a.op} {a.url}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"op": a.op, "bytes": n, "seconds": secs, "gbps": n / secs / 1e9 if secs > 0 else 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
