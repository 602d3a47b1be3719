"""A lazy file system for the crash disk modes: a FUSE passthrough with a page cache of its own (Jepsen's lazyfs model).

The mount shows a backing directory. What survives a power loss is exactly what the backing directory holds:

- **Data.** A write goes to an in-memory cache of unsynced data (per file: the extents written since its last fsync,
  its logical size, and a truncation floor); a read sees the cache over the backing file (read-your-writes); a
  truncate (and an open with O_TRUNC) is cached the same way. ``fsync``/``fdatasync`` of a file writes its cached
  extents and size to the backing file and fsyncs that. Closing a file persists nothing (the page cache outlives it).
- **Names.** create, mknod, symlink, link, mkdir, unlink, rmdir and rename are applied to the backing directory at
  once and recorded in an undo log, each under the directory whose fsync makes it durable: the parent of the name
  made or removed; for a rename, the directory it moved into (a rename is durable as one unit, never half). An
  fsync of a directory (opendir + fsync) makes every recorded operation of that directory durable. An unlinked file
  (or a file a rename replaced) is kept by a hard link in the undo dir, beside the backing dir on the same file
  system, until the operation is durable. Attributes (chmod, chown, utimens, xattrs) are applied at once, never
  undone.
- **drop()** is a power loss: every unsynced extent and truncation is forgotten, and the undo log is replayed
  backwards, so every name operation since its directory's last fsync is undone (a directory whose mkdir is undone
  goes with everything in it). The receipt names the files and bytes dropped and every name operation undone.
- **tear(seed)** is ``drop()`` where the write in flight, the last unsynced write to the mount (the one a boundary
  pause holds), keeps a seeded prefix: ``random.Random(seed).randrange(1, n)`` of its ``n`` bytes (0 for a 1-byte
  write) reach the backing file at the write's offset, as if that write alone had been partly on the platter.
  Earlier unsynced writes are dropped (a hole reads as zeros). The same seed and write give the same prefix.
- **Boundaries.** Every write, fsync (of a file or a directory) and rename is counted from 1 per kind; the hook
  ``on_boundary(kind, n, path)`` is called in the operation's FUSE thread right after the Nth write is cached, right
  before the Nth fsync returns (its data already persisted), right after the Nth rename was applied. A hook that
  blocks holds the caller's system call (a SIGKILLed caller stays in it until release): :class:`Boundaries` arms
  ``(kind, n)`` pauses that a harness waits for, kills at, and releases; drop, tear and unmount release them all.
- **Space.** A write whose unsynced data would not fit in the backing file system's free space is ENOSPC (a size-
  limited volume answers at write time, as a real disk does). Past ``max_dirty_bytes`` of cache (512 MiB) a file is
  written back early, as the kernel's writeback does: unsynced data may survive a crash, only its loss is promised
  never; ``stats()["early_writebacks"]`` counts them.
- **When.** Drop or tear once the volume's users are dead (a power loss kills them too): a process that keeps a
  file open across a drop may still read pages the kernel cached before it; new opens, lookups and stats see the
  backing dir (the mount has no name or attribute cache, and an open drops the file's cached pages).
- **A clean unmount** persists everything (as umount writes back the page cache): call ``drop()`` first for a power
  loss. A killed FUSE process loses its cache with no undo (a harness fault, not a mode).

Not modelled: ``sync(1)``/``syncfs`` (the high-level FUSE API never sees them; only per-file and per-directory fsync
persist), RENAME_EXCHANGE (EINVAL), mmap writes are writes like any other (the kernel sends them as writes).

The FUSE layer runs in its own process, ``python -m fleet.lazyfs serve`` (root, ``allow_other`` and
``default_permissions`` so uid 65534 inside a sandbox can use it, fsname ``sandfleet-lazyfs.<label>``), controlled
through a unix socket in a root-only (0700) dir that a sandbox never sees. :class:`LazyFS` starts, controls and
unmounts it; :class:`LazyOps` is the same logic in-process (the unit tests call it directly, with no kernel).

Rooms:
- `cache`: the records (unsynced extents, open or dirty files, undo entries), constants and errors.
- `boundaries`: armed write/fsync/rename pauses.
- `ops`: `LazyOps`, attributes and directories, composed of `names` (name operations and the undo log), `data`
  (file data and the cache) and `crash` (drop, tear, sync, stats).
- `serve`: the FUSE process and its control socket; `client`: `LazyFS`, the mount and process listings, the CLI
  (`__main__`).
"""
from fleet.lazyfs.boundaries import Boundaries
from fleet.lazyfs.cache import KINDS, MARK, RENAME_EXCHANGE, RENAME_NOREPLACE, Extents, LazyFSError, Node, Undo
from fleet.lazyfs.client import LazyFS, force_unmount, is_mounted, main, mounts, processes
from fleet.lazyfs.ops import LazyOps
from fleet.lazyfs.serve import check_available, printable, serve

__all__ = ["KINDS", "MARK", "RENAME_EXCHANGE", "RENAME_NOREPLACE", "Boundaries", "Extents", "LazyFS", "LazyFSError",
           "LazyOps", "Node", "Undo", "check_available", "force_unmount", "is_mounted", "main", "mounts", "printable",
           "processes", "serve"]
