"""Credential source: the file a runner's AWS `credential_process` prints.

The harness publishes the current key by an atomic rewrite (mode 0600), so a
key rotation (CR1, later) is one `publish()` call and every runner picks the new
key up on its next credential refresh.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str


class CredentialSource:
    """A JSON file in the `credential_process` format (Version 1)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def publish(self, creds: Credentials, owner_uid: int | None = None) -> None:
        body = orjson.dumps(
            {"Version": 1, "AccessKeyId": creds.access_key, "SecretAccessKey": creds.secret_key}
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".creds-")
        try:
            os.fchmod(fd, 0o400 if owner_uid is not None else 0o600)
            if owner_uid is not None:  # the sandbox user reads it through credential_process
                os.fchown(fd, owner_uid, owner_uid)
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def current(self) -> Credentials:
        data = orjson.loads(self.path.read_bytes())
        return Credentials(data["AccessKeyId"], data["SecretAccessKey"])

    def write_aws_config(self, config_path: Path, region: str = "us-east-1", source_path: str | None = None) -> Path:
        """An AWS config whose default profile runs `cat` on this source (no Python start-up).

        `source_path` is where the source is seen by the reader (inside a sandbox), if not here."""
        config_path = Path(config_path)
        config_path.write_text(
            "[default]\n"
            f"region = {region}\n"
            f"credential_process = /bin/cat {source_path or self.path}\n"
        )
        os.chmod(config_path, 0o644 if source_path else 0o600)
        return config_path
