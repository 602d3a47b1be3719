"""The embedded store's failures say what is wrong and show the log tail."""
import pytest

from storage.errors import StoreError
from storage.store import EmbeddedStore


def test_missing_weed_binary_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist or is not executable"):
        EmbeddedStore(tmp_path, weed_bin=str(tmp_path / "no-weed")).start()


def test_store_that_exits_shows_its_log_tail(tmp_path):
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'port allocation failed: boom' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(StoreError) as e:
        EmbeddedStore(tmp_path / "s", weed_bin=str(fake)).start(timeout_s=10)
    assert "exited with code 3" in str(e.value) and "boom" in str(e.value)


def test_identities_file_is_private(tmp_path):
    st = EmbeddedStore(tmp_path)
    st.write_identities([st.generate_credentials()])
    assert (st.identities_path.stat().st_mode & 0o777) == 0o600
