//! `sandfleet-relay forward --control-fd FD [--max-conns N] [--linger-ms MS] [--conn-buf BYTES]`: a sandbox host's loopback relay
//! (fleet/netns.py, which passes both from its own constants), compiled.
//!
//! The host makes each sandbox's network namespace and its listening sockets on 127.0.0.1 inside it, then hands
//! the listeners here, one a packet on the control socket (SOCK_SEQPACKET, the listener in SCM_RIGHTS):
//!   `L<group>\t<max>\t<host:port>\t<preface>` + fd   relay this listener's connections to host:port, at most
//!                                                    `max` open at once (one more is closed at once, unread),
//!                                                    each upstream connection opened with `preface` (the
//!                                                    head's gate line, fleet/gateway.py; empty for none)
//!   `X<group>`                                        the sandbox ended: close its listeners and connections
//!   `P<nonce>`                                        a ping, answered with the same packet
//! and sends one, `R`, when it starts: the host hands it nothing before that (a binary without this mode never
//! answers, and the host relays in its event loop instead).
//! Bytes pass both ways untouched; an end's EOF is passed on as a half close, as the host's asyncio relay does. An
//! error on either end (a reset, a write that fails) ends the connection both ways at once, and once the service's
//! end has closed the sandbox's end gets `LINGER` to close too: a runner that jams or idles a connection never
//! keeps its slot past its service's own end.
//! Caps: `max` per listener; `MAX_CONNS` over the relay, and past half of it (`SOFT`) a connection only from a
//! sandbox holding less than its fair share (`SOFT` / the sandboxes relayed now): a few sandboxes that open all
//! they may cannot shut the others out. Nothing a message carries is logged (a preface holds the wave's relay token).
//! The relay exits when the host's end of the control socket closes (the host process ended, however it died).
//!
//! std only: a thread per listener and two per connection, blocking sockets.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{IoVec, MsgHdr};

extern "C" {
    fn recvmsg(fd: i32, msg: *mut MsgHdr, flags: i32) -> isize;
    fn shutdown(fd: i32, how: i32) -> i32;
}

// each relayed socket's kernel buffers, set (the kernel doubles it) rather than autotuned up to tcp_rmem's and
// tcp_wmem's maximum: a runner that never reads what it asked for pinned about 5 MiB of TCP memory per connection
// here, charged to no sandbox (`--conn-buf`)
static CONN_BUF: AtomicUsize = AtomicUsize::new(256 * 1024);

fn cap_buffers(s: &TcpStream) {
    crate::cap_buffers(s, CONN_BUF.load(Ordering::SeqCst) as i32);
}

const SHUT_RDWR: i32 = 2;
const MSG_CMSG_CLOEXEC: i32 = 0x40000000;
const BUF: usize = 64 * 1024;
const STACK: usize = 128 * 1024;
// connections this relay holds at once over all sandboxes (two threads each; `--max-conns`); past it a new one is
// closed at once, as past a listener's `max`: thousands of threads would reach vm.max_map_count. Past SOFT (half of
// it) a connection is taken only from a sandbox holding less than SOFT / (sandboxes relayed now).
static MAX_CONNS: AtomicUsize = AtomicUsize::new(2048);
// once the service's end of a connection has closed, how long the sandbox's end may keep it open (`--linger-ms`)
static LINGER_MS: AtomicU64 = AtomicU64::new(10_000);

/// One sandbox's listeners and open connections.
struct Group {
    closed: AtomicBool,
    listeners: Mutex<Vec<RawFd>>, // shut down on close (that wakes their accept), closed by their own thread
    conns: Mutex<HashMap<u64, TcpStream>>, // a handle of each open connection's two ends, shut down on close
    next: AtomicU64,
    open: AtomicUsize, // this sandbox's connections open now, over its listeners
}

impl Group {
    fn close(&self) {
        let listeners = self.listeners.lock().unwrap();
        self.closed.store(true, Ordering::SeqCst);
        for &fd in listeners.iter() {
            unsafe { shutdown(fd, SHUT_RDWR) };
        }
        drop(listeners);
        for s in self.conns.lock().unwrap().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn track(&self, s: &TcpStream) -> Option<u64> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let handle = s.try_clone().ok()?;
        self.conns.lock().unwrap().insert(id, handle);
        if self.closed.load(Ordering::SeqCst) {
            let _ = s.shutdown(Shutdown::Both); // closed while it was being opened
        }
        Some(id)
    }

    fn untrack(&self, ids: &[u64]) {
        let mut conns = self.conns.lock().unwrap();
        for id in ids {
            conns.remove(id);
        }
    }
}

/// One listener: where its connections go.
struct Port {
    target: SocketAddr,
    preface: Vec<u8>,
    max: usize,
    open: AtomicUsize,
}

static LIVE: AtomicUsize = AtomicUsize::new(0);
static GROUPS: AtomicUsize = AtomicUsize::new(0); // sandboxes relayed now

/// Counts a connection while it lives (its listener's, its sandbox's and the relay's), whatever way its thread ends.
struct Open(Arc<Port>, Arc<Group>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.1.open.fetch_sub(1, Ordering::SeqCst);
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether a new connection of `group` on `port` is taken now (see the caps above).
fn admit(group: &Group, port: &Port) -> bool {
    let (live, max) = (LIVE.load(Ordering::SeqCst), MAX_CONNS.load(Ordering::SeqCst));
    let soft = max / 2;
    let fair = soft / GROUPS.load(Ordering::SeqCst).max(1);
    port.open.load(Ordering::SeqCst) < port.max
        && live < max
        && (live < soft || group.open.load(Ordering::SeqCst) < fair)
}

/// Copy `from` to `to` until `from`'s EOF, passed on as a half close (true); on an error of either end both are
/// shut down both ways, which ends the other direction's pump too (false).
fn pump(mut from: TcpStream, mut to: TcpStream) -> bool {
    let mut buf = vec![0u8; BUF];
    let clean = loop {
        match from.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if clean {
        let _ = to.shutdown(Shutdown::Write);
    } else {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
    clean
}

fn serve(group: Arc<Group>, port: Arc<Port>, client: TcpStream, _open: Open) {
    let Some(cid) = group.track(&client) else { return };
    let mut ids = vec![cid];
    cap_buffers(&client);
    if let Ok(mut upstream) = TcpStream::connect(port.target) {
        cap_buffers(&upstream);
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        if let Some(uid) = group.track(&upstream) {
            ids.push(uid);
            let up = (port.preface.is_empty() || upstream.write_all(&port.preface).is_ok())
                .then(|| (upstream.try_clone().ok(), client.try_clone().ok(), client.try_clone().ok()));
            if let Some((Some(u2), Some(c2), Some(c3))) = up {
                let (done, ended) = channel::<()>();
                let back = std::thread::Builder::new().stack_size(STACK).spawn(move || {
                    // the service's end closed (or failed): the sandbox's end gets LINGER to close its own
                    let linger = Duration::from_millis(LINGER_MS.load(Ordering::SeqCst));
                    if pump(u2, c2) && ended.recv_timeout(linger) == Err(RecvTimeoutError::Timeout) {
                        let _ = c3.shutdown(Shutdown::Both);
                    }
                });
                if let Ok(back) = back {
                    pump(client, upstream);
                    drop(done);
                    let _ = back.join();
                }
            }
        }
    }
    group.untrack(&ids);
}

fn accept(group: Arc<Group>, port: Arc<Port>, listener: TcpListener) {
    let fd = listener.as_raw_fd();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                if group.closed.load(Ordering::SeqCst) {
                    break;
                }
                if !admit(&group, &port) {
                    continue; // dropped: closed before a byte is relayed
                }
                port.open.fetch_add(1, Ordering::SeqCst);
                group.open.fetch_add(1, Ordering::SeqCst);
                LIVE.fetch_add(1, Ordering::SeqCst);
                let open = Open(port.clone(), group.clone());
                let (g, p) = (group.clone(), port.clone());
                // should no thread start, the closure (and so the connection and its count) is dropped
                let _ = std::thread::Builder::new().stack_size(STACK).spawn(move || serve(g, p, s, open));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) if group.closed.load(Ordering::SeqCst) => break,
            Err(_) => std::thread::sleep(Duration::from_millis(10)), // out of descriptors: no busy loop meanwhile
        }
    }
    group.listeners.lock().unwrap().retain(|&l| l != fd); // (under the lock close() shuts them down with)
}

/// One packet from the control socket and the fd that came with it; None when the host's end closed.
fn recv_packet(ctl: RawFd, buf: &mut [u8]) -> Option<(usize, Option<RawFd>)> {
    loop {
        let iov = IoVec { base: buf.as_mut_ptr(), len: buf.len() };
        let mut cbuf = [0u8; 64];
        let mut msg = MsgHdr {
            name: std::ptr::null_mut(),
            namelen: 0,
            iov: &iov,
            iovlen: 1,
            control: cbuf.as_mut_ptr(),
            controllen: cbuf.len(),
            flags: 0,
        };
        let n = unsafe { recvmsg(ctl, &mut msg, MSG_CMSG_CLOEXEC) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return None;
        }
        // struct cmsghdr { size_t len; int level; int type; } then the fds
        let mut fd = None;
        if msg.controllen >= 20 {
            let len = usize::from_ne_bytes(cbuf[0..8].try_into().unwrap()).min(msg.controllen);
            let level = i32::from_ne_bytes(cbuf[8..12].try_into().unwrap());
            let kind = i32::from_ne_bytes(cbuf[12..16].try_into().unwrap());
            if level == crate::SOL_SOCKET && kind == crate::SCM_RIGHTS {
                let fds: Vec<RawFd> =
                    cbuf[16..len].chunks_exact(4).map(|b| i32::from_ne_bytes(b.try_into().unwrap())).collect();
                fd = fds.first().copied();
                for &extra in fds.iter().skip(1) {
                    unsafe { crate::close(extra) }; // one fd a packet: any more are not kept open
                }
            }
        }
        return Some((n as usize, fd));
    }
}

fn listen(groups: &mut HashMap<String, Arc<Group>>, body: &str, fd: RawFd) -> Result<(), String> {
    let listener = unsafe { TcpListener::from_raw_fd(fd) }; // ours now: closed on every way out
    let mut f = body.splitn(4, '\t');
    let (name, max, target, preface) = (f.next(), f.next(), f.next(), f.next().unwrap_or(""));
    let (Some(name), Some(max), Some(target)) = (name, max, target) else {
        return Err(format!("bad L message ({} bytes)", body.len())) // (never its text: a preface holds a token)
    };
    let max: usize = max.parse().map_err(|_| format!("bad max {max:?}"))?;
    let target = target.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or(format!("bad target {target:?}"))?;
    let group = groups.entry(name.to_string()).or_insert_with(|| {
        GROUPS.fetch_add(1, Ordering::SeqCst);
        Arc::new(Group {
            closed: AtomicBool::new(false),
            listeners: Mutex::new(Vec::new()),
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            open: AtomicUsize::new(0),
        })
    });
    let port = Arc::new(Port { target, preface: preface.as_bytes().to_vec(), max, open: AtomicUsize::new(0) });
    let _ = listener.set_nonblocking(false);
    group.listeners.lock().unwrap().push(listener.as_raw_fd());
    let g = group.clone();
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || accept(g, port, listener))
        .map(|_| ())
        .map_err(|e| format!("no thread for a listener: {e}"))
}

pub fn main(ctl: RawFd, max_conns: usize, linger_ms: u64, conn_buf: usize) {
    MAX_CONNS.store(max_conns.max(1), Ordering::SeqCst);
    CONN_BUF.store(conn_buf.min(i32::MAX as usize), Ordering::SeqCst);
    LINGER_MS.store(linger_ms, Ordering::SeqCst);
    if crate::send_packet(ctl, b"R", None).is_err() {
        std::process::exit(1); // the host is gone already
    }
    let mut groups: HashMap<String, Arc<Group>> = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    while let Some((n, fd)) = recv_packet(ctl, &mut buf) {
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        match (msg.as_bytes().first(), fd) {
            (Some(b'L'), Some(fd)) => {
                if let Err(why) = listen(&mut groups, &msg[1..], fd) {
                    eprintln!("sandfleet-relay forward: {why}");
                }
            }
            (Some(b'P'), fd) => {
                // a ping: the host's watch that this relay still serves (a stopped one never answers)
                if let Some(fd) = fd {
                    unsafe { crate::close(fd) };
                }
                if crate::send_packet(ctl, &buf[..n.min(64)], None).is_err() {
                    break;
                }
            }
            (Some(b'X'), fd) => {
                if let Some(fd) = fd {
                    unsafe { crate::close(fd) };
                }
                if let Some(g) = groups.remove(&msg[1..]) {
                    GROUPS.fetch_sub(1, Ordering::SeqCst);
                    g.close();
                }
            }
            (_, fd) => {
                eprintln!("sandfleet-relay forward: unknown message ({n} bytes)"); // (never its text)
                if let Some(fd) = fd {
                    unsafe { crate::close(fd) };
                }
            }
        }
    }
    for g in groups.values() {
        g.close(); // the host is gone: so are its sandboxes
    }
    std::process::exit(0);
}
