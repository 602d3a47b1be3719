"""Per-attempt store keys, scoped to the task's prefix at the store itself.

Each attempt gets its own random key whose SeaweedFS identity may only Read,
Write and List under `<bucket>/<task prefix>`; anything else is a real 403 from
the store (and the proxy logs it). When the attempt's lease ends its key is
revoked: a zombie attempt's writes are rejected by the store, so this is also
fencing at the store for black-box runners.

Measured on SeaweedFS 4.48: after a SIGHUP, an identity REMOVED from the file
keeps working (the store never forgets it), while an identity whose key is
REPLACED stops accepting the old key at once. So a revoked identity becomes a
slot holding a fresh unknown key, and slots are reused by later attempts.
"""
from __future__ import annotations

import secrets
import threading
import time

import botocore.exceptions

from storage.credentials import Credentials
from storage.errors import StoreError

READY_TIMEOUT_S = 15.0


def _dead_key() -> Credentials:
    return Credentials("SFREVOKED" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30))


class ScopedKeys:
    def __init__(self, store, admin: Credentials):
        self.store = store  # EmbeddedStore
        self.admin = admin
        self.lock = threading.Lock()
        self.slots: list[dict] = []  # {"name", "creds", "actions", "owner"}
        self.issued = 0
        self.revoked = 0

    def _identities(self) -> list[dict]:
        return [{"name": s["name"], "credentials": [{"accessKey": s["creds"].access_key,
                                                      "secretKey": s["creds"].secret_key}],
                 "actions": s["actions"]} for s in self.slots]

    def _apply(self) -> None:
        self.store.write_identities([self.admin], extra=self._identities())
        self.store.reload_identities()

    def _prober(self, creds: Credentials):
        """One client for every probe of a key (a boto3 client costs 10-30 ms of CPU to build: one per probe, every
        10 ms until the store took the change, was most of the driver's CPU per attempt)."""
        client = self.store.endpoint.client(creds=creds, max_attempts=1, connect_timeout=1, read_timeout=5)
        return lambda bucket, key: self._probe(client, bucket, key)

    @staticmethod
    def _probe(client, bucket: str, key: str) -> str:
        try:
            client.get_object(Bucket=bucket, Key=key)["Body"].read()
            return "ok"
        except botocore.exceptions.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            return "denied" if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied") else "ok"

    def issue(self, owner: str, bucket: str, prefix: str) -> Credentials:
        """A fresh key allowed only under bucket/prefix; returns once the store accepts it."""
        creds = Credentials("SFA" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))
        scope = f"{bucket}/{prefix}*"
        with self.lock:
            slot = next((s for s in self.slots if s["owner"] is None), None)
            if slot is None:
                slot = {"name": f"sandfleet-attempt-{len(self.slots)}"}
                self.slots.append(slot)
            slot.update(creds=creds, owner=owner, actions=[f"Read:{scope}", f"Write:{scope}", f"List:{scope}"],
                        probe=(bucket, f"{prefix}.sandfleet-key-probe"))
            self._apply()
            self.issued += 1
        deadline = time.monotonic() + READY_TIMEOUT_S
        probe = self._prober(creds)
        while probe(*slot["probe"]) != "ok":
            if time.monotonic() > deadline:
                raise StoreError(f"the store did not accept a new attempt key within {READY_TIMEOUT_S:.0f}s")
            time.sleep(0.01)
        return creds

    def revoke(self, owner: str) -> bool:
        """Replace the owner's key by an unknown one (the old key gets 403 InvalidAccessKeyId)."""
        with self.lock:
            slot = next((s for s in self.slots if s["owner"] == owner), None)
            if slot is None:
                return False
            old, probe = slot["creds"], slot["probe"]
            slot.update(creds=_dead_key(), owner=None, actions=[])
            self._apply()
            self.revoked += 1
        deadline = time.monotonic() + READY_TIMEOUT_S
        with_old = self._prober(old)
        while with_old(*probe) != "denied":
            if time.monotonic() > deadline:
                raise StoreError(f"the store still accepted a revoked key after {READY_TIMEOUT_S:.0f}s")
            time.sleep(0.01)
        return True

    def rotate(self, owner: str) -> tuple[Credentials, Credentials] | None:
        """CR1: replace the owner's key at the store by a fresh one with the same scope; returns (old, new)
        once the store rejects the old key and accepts the new one. None when the owner holds no key."""
        with self.lock:
            slot = next((s for s in self.slots if s["owner"] == owner), None)
            if slot is None:
                return None
            old, probe = slot["creds"], slot["probe"]
            new = Credentials("SFA" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))
            slot["creds"] = new
            self._apply()
        deadline = time.monotonic() + READY_TIMEOUT_S
        with_old, with_new = self._prober(old), self._prober(new)
        while with_old(*probe) != "denied" or with_new(*probe) != "ok":
            if time.monotonic() > deadline:
                raise StoreError(f"the store did not switch a rotated key within {READY_TIMEOUT_S:.0f}s")
            time.sleep(0.01)
        return old, new

    def revoke_all(self, prefix: str = "") -> list[str]:
        """Revoke every key whose owner starts with `prefix` (a wave's, on a store many waves share); returns
        the owners revoked."""
        owners = [s["owner"] for s in list(self.slots) if s.get("owner") and s["owner"].startswith(prefix)]
        for owner in owners:
            self.revoke(owner)
        return owners
