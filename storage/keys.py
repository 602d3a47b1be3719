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

Every write of the identities also gives a canary identity of this key book a fresh key; weed reloads the whole
file at once, so once the store takes the canary's new key every change of that write is live. One probe per
write then stands for all the keys the write changed (issue 45: at 4,000 sandboxes each caller polling its own
key, on the driver's 6 default threads, delayed an attempt's key by ~30 s, longer than its lease).
"""
from __future__ import annotations

import http.client
import re
import secrets
import threading
import time
import urllib.parse

import botocore.credentials
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

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
        self.tag = f"sandfleet-attempt-{secrets.token_hex(3)}-"  # this key book's identities at the store
        self.slots: list[dict] = []  # {"name", "creds", "actions", "owner"}
        self.issued = 0
        self.revoked = 0
        # group commit: changes made while one write of the identities is under way go out together in the next
        # (each write makes weed reload every identity: per attempt that was O(concurrent attempts) of its CPU)
        self._written = threading.Condition(self.lock)
        self._changes = 0  # changes made to the slots
        self._applied = 0  # of them, how many the store has been given
        self._applying = False
        self.writes = 0
        self._free: list[dict] = []  # slots with no owner (revoked), reused first
        self._owned: dict[str, dict] = {}  # owner -> its slot
        self.canary: dict | None = None  # {"name", "creds", "actions", "probe"}: a fresh key in every write
        self.probes = 0  # writes confirmed by a canary probe (one stands for every change of its write)
        self._revoking: set[str] = set()  # owners whose revoke_all write is under way
        self._failed: tuple[int, str] = (0, "")  # (the last change a failed write carried, why it failed)

    def _identities(self) -> list[dict]:
        slots = self.slots + ([self.canary] if self.canary is not None else [])
        return [{"name": s["name"], "credentials": [{"accessKey": s["creds"].access_key,
                                                      "secretKey": s["creds"].secret_key}],
                 "actions": s["actions"]} for s in slots]

    def _canary_for(self, bucket: str) -> None:
        """With `self.lock` held: the canary identity, made once a bucket is known (it may read only a prefix of
        its own there, where nothing is ever written)."""
        if self.canary is None:
            scope = f"{bucket}/.sandfleet-canary/{self.tag}*"
            self.canary = {"name": f"{self.tag}canary", "creds": _dead_key(), "actions": [f"Read:{scope}"],
                           "probe": (bucket, f".sandfleet-canary/{self.tag}probe")}

    def _apply(self) -> None:
        """With `self.lock` held, after a change to the slots: returns once a write that holds it reached the store.
        One writer at a time; whoever comes while a write is under way waits, and the first of them writes every
        change made meanwhile in one go. A write that failed fails every change it carried at once (its waiters do
        not each write again and wait out the bound in turn); a change made meanwhile gets a write of its own."""
        self._changes += 1
        mine = self._changes
        while self._applied < mine:
            if self._failed[0] >= mine:
                raise StoreError(f"the write of the store's keys that carried this change failed: {self._failed[1]}")
            if self._applying:
                self._written.wait()
                continue
            canary = None
            if self.canary is not None:
                canary = self.canary["creds"] = Credentials("SFC" + secrets.token_hex(9).upper(),
                                                            secrets.token_urlsafe(30))
            self._applying, upto, identities = True, self._changes, self._identities()
            self.lock.release()
            try:
                self.store.update_identities(self.admin, self.tag, identities)
                if canary is not None:
                    self._confirm(canary, self.canary["probe"])
                done = True
            except BaseException as exc:
                with self._written:  # (the lock is released here: taken back to note the failure)
                    self._failed = (upto, f"{type(exc).__name__}: {str(exc)[:200]}")
                raise
            finally:
                self.lock.acquire()
                self._applying = False
                self._written.notify_all()
            if done:
                self._applied = max(self._applied, upto)
                self.writes += 1

    def _confirm(self, canary: Credentials, where: tuple[str, str]) -> None:
        """Without `self.lock`: poll (bounded) until the store takes the canary's new key, i.e. has reloaded this
        write; a reload signal that weed coalesced away is sent again every second."""
        self.probes += 1
        self._await([(self._prober(canary, *where), "ok")],
                    f"the store did not reload its keys within {READY_TIMEOUT_S:.0f}s",
                    nudge=getattr(self.store, "reload_identities", None))

    def _prober(self, creds: Credentials, bucket: str, key: str) -> "_Probe":
        return _Probe(self.store.endpoint.url, self.store.endpoint.region, creds, bucket, key)

    @staticmethod
    def _await(probes: list, error: str, nudge=None) -> None:
        """Poll (bounded, every 10 ms) until each `(probe, wanted)` gives what is wanted of it; closes the probes.
        `nudge()`, if given, is called every second meanwhile."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        resend = time.monotonic() + 1.0
        try:
            while any(probe(deadline) != wanted for probe, wanted in probes):
                now = time.monotonic()
                if now > deadline:
                    raise StoreError(error)
                if nudge is not None and now > resend:
                    nudge()
                    resend = now + 1.0
                time.sleep(0.01)
        finally:
            for probe, _ in probes:
                probe.close()

    def counts(self) -> dict[str, int]:
        """Keys issued and revoked, identity writes and canary probes so far (over a lent fleet's life)."""
        with self.lock:
            return {"issued": self.issued, "revoked": self.revoked, "writes": self.writes, "probes": self.probes}

    def held(self, prefix: str = "") -> int:
        """How many keys whose owner starts with `prefix` may be live now (held, or in a revoke not yet written)."""
        with self.lock:
            return sum(1 for o in (*self._owned, *self._revoking) if o.startswith(prefix))

    def issue(self, owner: str, bucket: str, prefix: str) -> Credentials:
        """A fresh key allowed only under bucket/prefix; returns once the store accepts it."""
        creds = Credentials("SFA" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))
        scope = f"{bucket}/{prefix}*"
        with self.lock:
            # an owner asking again gets its slot back with the new key (the old one dies in this write)
            slot = self._owned.get(owner) or (self._free.pop() if self._free else None)
            if slot is None:
                slot = {"name": f"{self.tag}{len(self.slots)}"}
                self.slots.append(slot)
            slot.update(creds=creds, owner=owner, actions=[f"Read:{scope}", f"Write:{scope}", f"List:{scope}"],
                        probe=(bucket, f"{prefix}.sandfleet-key-probe"))
            self._owned[owner] = slot
            where = slot["probe"]
            confirmed = self.canary is not None
            self._canary_for(bucket)
            self._apply()
            self.issued += 1
        if not confirmed:  # the book's first write: its canary is new too, so this key is checked itself
            self._await([(self._prober(creds, *where), "ok")],
                        f"the store did not accept a new attempt key within {READY_TIMEOUT_S:.0f}s")
        return creds

    def revoke(self, owner: str) -> bool:
        """Replace the owner's key by an unknown one (the old key gets 403 InvalidAccessKeyId)."""
        with self.lock:
            slot = self._owned.pop(owner, None)
            if slot is None:
                return False
            old, probe, actions = slot["creds"], slot["probe"], slot["actions"]
            slot.update(creds=_dead_key(), owner=None, actions=[])
            self._free.append(slot)
            confirmed = self.canary is not None
            try:
                self._apply()
            except BaseException:
                # not known to have reached the store: the key stays its owner's, for a later revoke (the wave's
                # revoke_all at its end) to end, never dropped from the book while it may still work
                if slot["owner"] is None and slot in self._free:
                    self._free.remove(slot)
                    slot.update(creds=old, owner=owner, actions=actions)
                    self._owned[owner] = slot
                raise
            self.revoked += 1
        if not confirmed:
            self._await([(self._prober(old, *probe), "unknown")],
                        f"the store still accepted a revoked key after {READY_TIMEOUT_S:.0f}s")
        return True

    def rotate(self, owner: str) -> tuple[Credentials, Credentials] | None:
        """CR1: replace the owner's key at the store by a fresh one with the same scope; returns (old, new)
        once the store rejects the old key and accepts the new one. None when the owner holds no key."""
        with self.lock:
            slot = self._owned.get(owner)
            if slot is None:
                return None
            old, probe = slot["creds"], slot["probe"]
            new = Credentials("SFA" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))
            slot["creds"] = new
            self._apply()
        self._await([(self._prober(old, *probe), "unknown"), (self._prober(new, *probe), "ok")],
                    f"the store did not switch a rotated key within {READY_TIMEOUT_S:.0f}s")
        return old, new

    def revoke_all(self, prefix: str = "") -> list[str]:
        """Revoke every key whose owner starts with `prefix` (a wave's, on a store many waves share); returns
        the owners revoked."""
        with self.lock:
            owners = [o for o in self._owned if o.startswith(prefix)]
            one_by_one = self.canary is None  # (no write confirmed yet: each revoke is probed itself)
            if owners and not one_by_one:
                self._revoke_many(owners)
        if one_by_one:
            for owner in owners:
                self.revoke(owner)
        return owners

    def _revoke_many(self, owners: list[str]) -> None:
        """With `self.lock` held: the owners' keys replaced by unknown ones in one write (a wave's end, or its
        second Ctrl-C, waits on one write, not one per key)."""
        taken = {o: self._owned.pop(o) for o in owners}
        self._revoking.update(owners)  # (until the write is known to have reached the store)
        kept = {o: (slot["creds"], slot["actions"]) for o, slot in taken.items()}
        for slot in taken.values():
            slot.update(creds=_dead_key(), owner=None, actions=[])
            self._free.append(slot)
        try:
            self._apply()
        except BaseException:
            for o, slot in taken.items():  # not known to have reached the store: each key stays its owner's
                if slot["owner"] is None and slot in self._free:
                    self._free.remove(slot)
                    slot.update(creds=kept[o][0], owner=o, actions=kept[o][1])
                    self._owned[o] = slot
            raise
        finally:
            self._revoking.difference_update(owners)
        self.revoked += len(owners)


class _Probe:
    """Whether the store takes a key: a GET, signed with it, of a key under its scope that does not exist, sent on
    one plain HTTP connection. "ok" is a 2xx or the store's 404 NoSuchKey (it took the key); "unknown" its
    InvalidAccessKeyId (the key is gone: what a revoked key must get); "denied" another refusal of the key
    (SignatureDoesNotMatch, AccessDenied); anything else (a 5xx, a 400, another 4xx, no error code) is "unsure", so
    neither an issue nor a revoke is taken on it. Signed by hand (botocore's SigV4 signer): a boto3 client costs
    4-30 ms of CPU to build, and two per attempt (issue, revoke) were the largest per-attempt item of the driver's
    own CPU."""

    BODY_MAX = 64 * 1024  # an answer is read up to this; a longer one (the runner's object) closes the connection

    def __init__(self, url: str, region: str, creds: Credentials, bucket: str, key: str):
        self.parts = urllib.parse.urlsplit(url)
        self.path = f"/{bucket}/{urllib.parse.quote(key)}"
        self.signer = S3SigV4Auth(botocore.credentials.Credentials(creds.access_key, creds.secret_key), "s3", region)
        self.conn = http.client.HTTPConnection(self.parts.hostname, self.parts.port, timeout=5)

    def __call__(self, deadline: float | None = None) -> str:
        req = AWSRequest(method="GET", url=f"{self.parts.scheme}://{self.parts.netloc}{self.path}")
        self.signer.add_auth(req)
        for tries_left in (1, 0):  # a kept-alive connection the store closed meanwhile is retried once, fresh
            left = 5.0 if deadline is None else deadline - time.monotonic()
            self.conn.timeout = max(0.2, min(5.0, left))  # one probe never runs far past the caller's bound
            if self.conn.sock is not None:
                self.conn.sock.settimeout(self.conn.timeout)
            try:
                self.conn.request("GET", self.path, headers=dict(req.headers.items()))
                resp = self.conn.getresponse()
                body = resp.read(self.BODY_MAX)
                if not resp.isclosed():  # more than BODY_MAX: what is left must never be read as the next answer
                    self.conn.close()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.conn.close()
                if not tries_left or left <= 0.2:
                    raise StoreError(f"the store did not answer a key probe ({exc})") from None
        code = re.search(rb"<Code>([^<]*)</Code>", body)
        code = code.group(1).decode(errors="replace") if code else ""
        if 200 <= resp.status < 300 or (resp.status == 404 and code == "NoSuchKey"):
            return "ok"
        if resp.status == 403 and code == "InvalidAccessKeyId":
            return "unknown"
        if resp.status == 403 and code in ("SignatureDoesNotMatch", "AccessDenied"):
            return "denied"
        return "unsure"

    def close(self) -> None:
        self.conn.close()
