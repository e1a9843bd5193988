"""A real S3-compatible server on loopback for tests: ``moto_server`` (moto[server]) in a subprocess.

Authentication is enforced (``INITIAL_NO_AUTH_ACTION_COUNT``): the first requests create an IAM user
allowed ``s3:*``; every later request must be signed with that user's key, so a wrong key is
refused as a real S3 would (ACCESS_DENIED / INVALID_ACCESS_KEY_ID).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SETUP_ACTIONS = 3  # create_user, create_access_key, put_user_policy: unauthenticated, then auth is on


@dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    access_key: str
    secret_key: str
    process: subprocess.Popen

    @property
    def host_port(self) -> str:
        return self.endpoint.removeprefix("http://")

    def env(self) -> dict[str, str]:
        """The standard AWS variables petal's S3 client reads (credentials, endpoint, region)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def uri(self, bucket_path: str) -> str:
        return f"s3://{bucket_path}?endpoint_override={self.host_port}&scheme=http"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_s3(log: Path) -> S3Server:
    import boto3

    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS)}
    server = Path(sys.executable).parent / "moto_server"
    with open(log, "w") as out:
        process = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                       aws_secret_access_key="setup")
    iam.create_user(UserName="petal")
    key = iam.create_access_key(UserName="petal")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="petal", PolicyName="s3", PolicyDocument=json.dumps(policy))
    return S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], process)
