//! sandfleet-relay: the S3 fault proxy's compiled front.
//!
//! It owns the proxy's port on 127.0.0.1. While no fault rule is open it relays each request to the store
//! itself, byte for byte, and logs it as the Python proxy (`storage/proxy.py`) would: the same JSON line with
//! the same fields. Whenever it is not sure it would do exactly what the proxy does (a rule is open, the
//! request is chunked, malformed, large, the health probe, a byte it does not parse the same way), it hands the
//! client's socket and every byte read from it to the proxy (SCM_RIGHTS over the unix socket it was given), and
//! the proxy serves that connection for the rest of its life.
//!
//! The control socket (a SOCK_SEQPACKET socket the proxy passes as `--control-fd`) carries one message a packet:
//!   relay -> proxy  `R<port>`          listening
//!                   `C<bytes>` + fd    a client connection handed over, with what was read from it
//!                   `A<count>`         answer to `M`: mode set, log written, requests relayed so far
//!   proxy -> relay  `M1`               every request to the proxy from now on
//!                   `M0`               relay every plain request again (no rule open)
//!                   `MS<slots>`        only requests in these slots go to the proxy: `bucket/seg0/seg1`, one a
//!                                      line, the proxy's RuleSet slots (a rule pinned to a task's prefix)
//!                   `MW<any of those>` the same, and every write (any method but GET and HEAD) to the proxy: a
//!                                      store quota is on and only the proxy counts a task's objects and bytes
//! The relay writes its log and exits when the proxy's end closes (the proxy stopped or died).
//!
//! std only (no crates): threads, one per client connection, blocking sockets.
//!
//! `sandfleet-relay forward --control-fd FD [--max-conns N] [--linger-ms MS] [--conn-buf BYTES]` is the other binary in this one: a sandbox host's loopback relay
//! (src/forward.rs).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::io::{AsRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod forward;

const MAX_HEAD: usize = 64 * 1024; // as storage/proxy.py
const HOLD_MAX: usize = 1024 * 1024;
const SMALL_BODY: usize = 64 * 1024;
const CHUNK: usize = 256 * 1024;
const READ: usize = 64 * 1024;
const HEALTH_PATH: &[u8] = b"/.sandfleet/health";
const LOG_FLUSH: Duration = Duration::from_millis(10);
// connections the relay serves at once, a thread each; the next ones go to the proxy, whose event loop holds any
// number (thousands of threads would reach vm.max_map_count, and a thread that cannot start aborts the relay)
const MAX_CONNS: usize = 512;

// ------------------------------------------------------------------ the little libc this needs
#[repr(C)]
struct IoVec {
    base: *const u8,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut u8,
    namelen: u32,
    iov: *const IoVec,
    iovlen: usize,
    control: *mut u8,
    controllen: usize,
    flags: i32,
}

extern "C" {
    fn pipe2(fds: *mut i32, flags: i32) -> i32;
    fn splice(fd_in: i32, off_in: *mut i64, fd_out: i32, off_out: *mut i64, len: usize, flags: u32) -> isize;
    fn fcntl(fd: i32, cmd: i32, ...) -> i32;
    fn sendmsg(fd: i32, msg: *const MsgHdr, flags: i32) -> isize;
    fn recv(fd: i32, buf: *mut u8, len: usize, flags: i32) -> isize;
    fn close(fd: i32) -> i32;
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const i32, len: u32) -> i32;
}

const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
const MSG_NOSIGNAL: i32 = 0x4000;
const O_CLOEXEC: i32 = 0o2000000;
const F_SETPIPE_SZ: i32 = 1031;
const SPLICE_F_MOVE: u32 = 1;
const SPLICE_F_MORE: u32 = 4;
const SPLICE_MIN: usize = 256 * 1024; // a body this large goes socket -> pipe -> socket, never through our memory

const SO_SNDBUF: i32 = 7;
const SO_RCVBUF: i32 = 8;
// the proxy front's sockets' kernel buffers (set, so not autotuned up to tcp_rmem's and tcp_wmem's maximum): a
// client that asks for a large object and never reads it pinned about 8 MiB of TCP memory per connection here
const PROXY_BUF: i32 = 256 * 1024;

/// Set a socket's send and receive buffers to `bytes` (the kernel doubles it); 0 leaves them autotuned.
pub(crate) fn cap_buffers(s: &TcpStream, bytes: i32) {
    if bytes > 0 {
        for name in [SO_SNDBUF, SO_RCVBUF] {
            unsafe { setsockopt(s.as_raw_fd(), SOL_SOCKET, name, &bytes, 4) };
        }
    }
}

/// A pipe for splice(2), closed when dropped.
struct Pipe([i32; 2]);

impl Drop for Pipe {
    fn drop(&mut self) {
        unsafe {
            close(self.0[0]);
            close(self.0[1]);
        }
    }
}

/// Move exactly `n` bytes from socket `src` to socket `dst` in the kernel.
fn splice_exact(src: RawFd, dst: RawFd, n: usize) -> io::Result<()> {
    let mut fds = [0i32; 2];
    if unsafe { pipe2(fds.as_mut_ptr(), O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let pipe = Pipe(fds);
    unsafe { fcntl(pipe.0[1], F_SETPIPE_SZ, 1i32 << 20) }; // fewer rounds; the default 64 KiB works too
    let mut left = n;
    let null = std::ptr::null_mut();
    while left > 0 {
        let got = unsafe { splice(src, null, pipe.0[1], null, left.min(1 << 20), SPLICE_F_MOVE | SPLICE_F_MORE) };
        if got == 0 {
            return Err(bad("closed inside a body"));
        }
        if got < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let mut inside = got as usize;
        while inside > 0 {
            let put = unsafe { splice(pipe.0[0], null, dst, null, inside, SPLICE_F_MOVE | SPLICE_F_MORE) };
            if put <= 0 {
                let err = io::Error::last_os_error();
                if put < 0 && err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(if put == 0 { bad("the client's side closed") } else { err });
            }
            inside -= put as usize;
        }
        left -= got as usize;
    }
    Ok(())
}

/// One packet on the control socket, with `fd` in its ancillary data when given.
fn send_packet(ctl: RawFd, data: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let iov = IoVec { base: data.as_ptr(), len: data.len() };
    // struct cmsghdr { size_t len; int level; int type; } + one int, padded to 8: CMSG_SPACE(4) = 24
    let mut cbuf = [0u8; 24];
    let mut msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &iov,
        iovlen: 1,
        control: std::ptr::null_mut(),
        controllen: 0,
        flags: 0,
    };
    if let Some(fd) = fd {
        cbuf[0..8].copy_from_slice(&(20usize).to_ne_bytes()); // CMSG_LEN(4)
        cbuf[8..12].copy_from_slice(&SOL_SOCKET.to_ne_bytes());
        cbuf[12..16].copy_from_slice(&SCM_RIGHTS.to_ne_bytes());
        cbuf[16..20].copy_from_slice(&fd.to_ne_bytes());
        msg.control = cbuf.as_mut_ptr();
        msg.controllen = cbuf.len();
    }
    loop {
        let n = unsafe { sendmsg(ctl, &msg, MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

// ------------------------------------------------------------------ shared state
/// Which requests go to the proxy, from the rules it has open.
enum Route {
    Direct,                 // none open
    All,                    // a rule that could match any request (no bucket and prefix pinning two segments)
    Slots(HashSet<String>), // only rules pinned to these `bucket/seg0/seg1`
}

/// The route and whether every write goes to the proxy too (a store quota is on: only the proxy counts a task's
/// objects and bytes, so no PUT, POST or DELETE may pass it here). `MW<route>` sets it; an older relay reads `W` as
/// anything else, the safe side (`All`).
struct Routing {
    route: Route,
    writes: bool,
}

impl Routing {
    fn parse(msg: &[u8]) -> Routing {
        match msg {
            [b'W', rest @ ..] => Routing { route: Route::parse(rest), writes: true },
            _ => Routing { route: Route::parse(msg), writes: false },
        }
    }
}

impl Route {
    fn parse(msg: &[u8]) -> Route {
        match msg {
            b"0" => Route::Direct,
            [b'S', slots @ ..] => match std::str::from_utf8(slots) {
                Ok(text) => Route::Slots(text.split('\n').filter(|l| !l.is_empty()).map(str::to_string).collect()),
                Err(_) => Route::All,
            },
            _ => Route::All, // anything else: the safe side
        }
    }

    /// RuleSet._slot of the request: the bucket and the first two segments of its key (or listing prefix).
    fn takes(&self, req: &S3Req) -> bool {
        match self {
            Route::Direct => false,
            Route::All => true,
            Route::Slots(slots) => {
                let key = if req.key.is_empty() { req.prefix.as_deref().unwrap_or("") } else { &req.key };
                let segs: Vec<&str> = key.splitn(3, '/').collect();
                !key.is_empty() && segs.len() == 3 && slots.contains(&format!("{}/{}/{}", req.bucket, segs[0], segs[1]))
            }
        }
    }
}

struct State {
    upstream: SocketAddr,
    ctl: RawFd,
    route: RwLock<Arc<Routing>>, // which requests the proxy must serve (the rules it has open, a quota)
    relayed: AtomicU64,
    live: AtomicUsize, // connections served by a thread of the relay now
    log: Mutex<Vec<u8>>,
    logged: Condvar, // the first line pending: the writer wakes, waits LOG_FLUSH, writes the batch
    log_file: Mutex<Option<File>>,
}

impl State {
    fn note(&self, line: &[u8]) {
        let mut pending = self.log.lock().unwrap();
        if pending.is_empty() {
            self.logged.notify_one();
        }
        pending.extend_from_slice(line);
    }

    /// The log's writer: no wake-up while nothing is pending.
    fn writer(&self) {
        loop {
            {
                let mut pending = self.log.lock().unwrap();
                while pending.is_empty() {
                    pending = self.logged.wait(pending).unwrap();
                }
            }
            std::thread::sleep(LOG_FLUSH);
            self.flush_log();
        }
    }

    /// Write what is pending. The file's lock is held from taking the batch to writing it, so a flush that
    /// returns (the answer to `M`) has every line noted before it on disk, a batch another thread took included.
    fn flush_log(&self) {
        let mut file = self.log_file.lock().unwrap();
        let batch = std::mem::take(&mut *self.log.lock().unwrap());
        if let (Some(f), false) = (file.as_mut(), batch.is_empty()) {
            let _ = f.write_all(&batch); // O_APPEND: one write of whole lines, never torn by the proxy's
        }
    }
}

/// A connection a thread serves: counted while it lives.
struct Live(Arc<State>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

// ------------------------------------------------------------------ a buffered socket
/// A socket and what was read from it and not yet used: `buf[pos..end]` (the buffer is zeroed once, when it
/// grows, never per read).
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl Conn {
    fn new(s: TcpStream) -> Conn {
        Conn { s, buf: vec![0; READ], pos: 0, end: 0 }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    /// Put `data` back in front of what is pending (the head the proxy must read again).
    fn unread(&mut self, data: &[u8]) {
        let mut buf = data.to_vec();
        buf.extend_from_slice(self.pending());
        self.end = buf.len();
        self.pos = 0;
        self.buf = buf;
    }

    /// Read at most `limit` more bytes (never more than the caller needs: what is pending when a connection
    /// is handed over stays within one packet); false at EOF.
    fn fill(&mut self, limit: usize) -> io::Result<bool> {
        let limit = limit.clamp(1, CHUNK);
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        } else if self.pos > 0 && self.buf.len() - self.end < limit {
            self.buf.copy_within(self.pos..self.end, 0); // what is pending to the front: the buffer grows
            self.end -= self.pos; // only past what is pending and the next read
            self.pos = 0;
        }
        if self.buf.len() - self.end < limit {
            let grown = (self.buf.len() * 2).max(self.end + limit);
            self.buf.resize(grown, 0);
        }
        loop {
            match self.s.read(&mut self.buf[self.end..self.end + limit]) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next head, up to and with its blank line; `Eof` at a clean EOF before any byte of it, an error for
    /// EOF inside one. `TooLong` when its blank line is not within MAX_HEAD (the proxy's own limit decides
    /// what then: it is handed the bytes).
    fn read_head(&mut self) -> io::Result<Got> {
        let mut from = 0;
        loop {
            let p = self.pending();
            if let Some(i) = find(&p[from..], b"\r\n\r\n") {
                let end = from + i + 4;
                if end > MAX_HEAD {
                    return Ok(Got::TooLong);
                }
                let head = p[..end].to_vec();
                self.pos += end;
                return Ok(Got::Head(head));
            }
            if p.len() >= MAX_HEAD {
                return Ok(Got::TooLong);
            }
            from = p.len().saturating_sub(3);
            if !self.fill(MAX_HEAD - p.len())? {
                if self.pending().iter().all(|b| b.is_ascii_whitespace()) {
                    return Ok(Got::Eof);
                }
                return Err(bad("closed inside a head"));
            }
        }
    }

    fn read_exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.pending().len() < n {
            if !self.fill(n - self.pending().len())? {
                return Err(bad("closed inside a body"));
            }
        }
        let out = self.pending()[..n].to_vec();
        self.pos += n;
        Ok(out)
    }

    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut from = 0;
        loop {
            let p = self.pending();
            if let Some(i) = find(&p[from..], b"\r\n") {
                let end = from + i + 2;
                let line = p[..end].to_vec();
                self.pos += end;
                return Ok(line);
            }
            if p.len() > MAX_HEAD {
                return Err(bad("line too long"));
            }
            from = p.len().saturating_sub(1);
            if !self.fill(READ)? {
                return Err(bad("closed inside a chunk line"));
            }
        }
    }

    /// Copy `n` bytes (or to EOF when `n` is None) to `dst`; the bytes copied.
    fn copy_to(&mut self, dst: &mut TcpStream, n: Option<usize>) -> io::Result<usize> {
        let mut left = n.unwrap_or(usize::MAX);
        let mut total = 0;
        while left > 0 {
            if self.pending().is_empty() && n.is_some() && left >= SPLICE_MIN {
                splice_exact(self.s.as_raw_fd(), dst.as_raw_fd(), left)?;
                return Ok(total + left);
            }
            if self.pending().is_empty() && !self.fill(left)? {
                if n.is_none() {
                    return Ok(total);
                }
                return Err(bad("closed inside a body"));
            }
            let take = self.pending().len().min(left).min(CHUNK);
            dst.write_all(&self.pending()[..take])?;
            self.pos += take;
            left -= take;
            total += take;
        }
        Ok(total)
    }
}

enum Got {
    Head(Vec<u8>),
    Eof,
    TooLong,
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// ------------------------------------------------------------------ heads
struct Head {
    raw: Vec<u8>,
    start: String,
    headers: Vec<(String, String)>,
}

impl Head {
    /// None when the head holds a byte the proxy would read otherwise (non-ASCII, control bytes, a bare CR
    /// or LF): such a request is the proxy's.
    fn parse(raw: Vec<u8>) -> Option<Head> {
        Head::parse_as(raw, true)
    }

    /// A response head: every byte read as latin-1, as the proxy reads it.
    fn response(raw: Vec<u8>) -> Head {
        Head::parse_as(raw, false).expect("a lenient parse always reads")
    }

    fn parse_as(raw: Vec<u8>, strict: bool) -> Option<Head> {
        let body = &raw[..raw.len() - 4];
        if !strict {
            let text: String = body.iter().map(|&b| b as char).collect();
            return Some(Head::from_text(&text, raw));
        }
        for (i, &b) in body.iter().enumerate() {
            let ok = match b {
                b'\r' => body.get(i + 1) == Some(&b'\n'),
                b'\n' => i > 0 && body[i - 1] == b'\r',
                b'\t' => true,
                0x20..=0x7e => true,
                _ => false,
            };
            if !ok {
                return None;
            }
        }
        let text = std::str::from_utf8(body).ok()?.to_string();
        if !framing_ok(&text) {
            return None;
        }
        let head = Head::from_text(&text, raw);
        if read_once_repeated(&head.headers) {
            return None;
        }
        Some(head)
    }

    fn from_text(text: &str, raw: Vec<u8>) -> Head {
        let mut lines = text.split("\r\n");
        let start = lines.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        for line in lines {
            if line.is_empty() {
                continue;
            }
            let (name, value) = match line.find(':') {
                Some(i) => (&line[..i], &line[i + 1..]),
                None => (line, ""),
            };
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        Head { raw, start, headers }
    }

    fn get(&self, name: &str) -> &str {
        // the first one wins, as the proxy (and Go's Header.Get) reads it
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).unwrap_or("")
    }

    fn chunked(&self) -> bool {
        self.get("transfer-encoding").to_ascii_lowercase().contains("chunked")
    }

    fn length(&self) -> Option<usize> {
        let v = self.get("content-length");
        if !v.is_empty() && v.len() < 19 && v.bytes().all(|b| b.is_ascii_digit()) {
            v.parse().ok()
        } else {
            None
        }
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The proxy's `framing_problem` is None (RFC 9112 2.2, 3, 5.1, 5.2, 6.1): a request line of a token, one space,
/// a target, one space and HTTP/1.x; field lines of a token, a colon and a value, none folded (obs-fold); at
/// most one Content-Length value, never with Transfer-Encoding, which is exactly `chunked` once. Anything else
/// another reader (SeaweedFS is Go's net/http) may frame otherwise: the proxy refuses it (400, logged).
fn framing_ok(text: &str) -> bool {
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap_or("");
    let mut parts = start.splitn(3, ' ');
    let (method, target, version) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
    if !is_token(method) || target.is_empty() || !target.bytes().all(|b| (0x21..=0x7e).contains(&b))
        || !matches!(version, Some("HTTP/1.1") | Some("HTTP/1.0")) {
        return false;
    }
    let mut length: Option<&str> = None;
    let mut codings = 0;
    let mut chunked = false;
    for line in lines {
        if line.starts_with(' ') || line.starts_with('\t') {
            return false; // obs-fold
        }
        let (name, value) = match line.find(':') {
            Some(i) => (&line[..i], line[i + 1..].trim_matches(|c| c == ' ' || c == '\t')),
            None => return false,
        };
        if !is_token(name) {
            return false;
        }
        if name.eq_ignore_ascii_case("content-length") {
            if value.is_empty() || value.len() >= 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            match length {
                Some(v) if v.parse::<u64>().ok() != value.parse::<u64>().ok() => return false,
                _ => length = Some(value),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            codings += 1;
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    codings == 0 || (length.is_none() && codings == 1 && chunked)
}

/// The proxy's READ_ONCE: fields it or its quota reads; given twice, the proxy refuses the request (the store
/// reads the first, another reader the last), so such a head is the proxy's.
const READ_ONCE: [&str; 11] = ["content-length", "transfer-encoding", "expect", "authorization",
    "x-amz-copy-source", "x-amz-copy-source-range", "x-amz-content-sha256", "x-amz-decoded-content-length",
    "content-encoding", "x-amz-sdk-checksum-algorithm", "x-amz-trailer"];

fn read_once_repeated(headers: &[(String, String)]) -> bool {
    READ_ONCE.iter().any(|name| headers.iter().filter(|(n, _)| n == name).count() > 1)
}

// ------------------------------------------------------------------ what the log says of a request
fn unhex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// urllib.parse.unquote (or unquote_plus): None when the bytes are not UTF-8 (the proxy would replace them).
fn unquote(s: &str, plus: bool) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (unhex(b[i + 1]), unhex(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(if plus && b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).ok()
}

struct S3Req {
    bucket: String,
    key: String,
    part: Option<u64>,
    upload_id: Option<String>,
    prefix: Option<String>,
}

/// The query names the proxy (and the store) reads as numbers: their values must be 1-9 ASCII digits.
const NUMERIC_PARAMS: [&str; 5] = ["partNumber", "max-keys", "max-parts", "max-uploads", "part-number-marker"];

/// The proxy's `go_query` raises for this query (a `;`, a bad percent escape, an escape that is not UTF-8, a
/// number that is not 1-9 ASCII digits in any of a name's values): the request is the proxy's to refuse.
fn query_refused(query: &str) -> bool {
    for pair in query.split('&') {
        if pair.is_empty() {
            continue;
        }
        if pair.contains(';') {
            return true;
        }
        let (n, v) = match pair.find('=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, ""),
        };
        for s in [n, v] {
            let b = s.as_bytes();
            let bad = (0..b.len()).any(|i| {
                b[i] == b'%' && !(i + 2 < b.len() && unhex(b[i + 1]).is_some() && unhex(b[i + 2]).is_some())
            });
            if bad {
                return true;
            }
        }
        let (n, v) = match (unquote(n, true), unquote(v, true)) {
            (Some(n), Some(v)) => (n, v),
            _ => return true,
        };
        if NUMERIC_PARAMS.contains(&n.as_str())
            && !(!v.is_empty() && v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit())) {
            return true;
        }
    }
    false
}

/// S3Request.parse for a target the proxy would split the same way; None otherwise.
fn parse_target(target: &str) -> Option<S3Req> {
    if target.starts_with("//") || target.contains('#') {
        return None; // urlsplit reads a netloc or a fragment there
    }
    let (path, query) = match target.find('?') {
        Some(i) => (&target[..i], &target[i + 1..]),
        None => (target, ""),
    };
    let path = unquote(path, false)?;
    let path = path.trim_start_matches('/');
    let (bucket, key) = match path.find('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (path, ""),
    };
    if key.starts_with('/') || key.contains("//") {
        return None; // the proxy may read it as the store will hold it (`--merge-slashes`)
    }
    if query_refused(query) {
        return None; // the proxy answers it 400, as it alone would
    }
    let mut first: Vec<(String, String)> = Vec::new();
    for field in query.split('&') {
        if field.is_empty() {
            continue;
        }
        let (n, v) = match field.find('=') {
            Some(i) => (&field[..i], &field[i + 1..]),
            None => (field, ""),
        };
        let (n, v) = (unquote(n, true)?, unquote(v, true)?);
        if !first.iter().any(|(m, _)| *m == n) {
            first.push((n, v));
        }
    }
    let q = |name: &str| first.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let part = match q("partNumber") {
        Some(p) if !p.is_ascii() => return None, // str.isdecimal reads other digits too
        Some(p) if !p.is_empty() && p.len() < 10 && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok(),
        _ => None,
    };
    Some(S3Req {
        bucket: bucket.to_string(),
        key: key.to_string(),
        part,
        upload_id: q("uploadId"),
        prefix: if key.is_empty() { q("prefix") } else { None },
    })
}

/// The access key id after `marker` (`Credential=` in the header, `X-Amz-Credential=` in a presigned query):
/// 8 to 128 letters and digits, then `/` (or `%2F` in the query), as the proxy's two regexes.
fn akid_after(s: &str, marker: &str, query: bool) -> Option<String> {
    let mut from = 0;
    while let Some(i) = s[from..].find(marker) {
        let at = from + i;
        if query && !(at > 0 && matches!(s.as_bytes()[at - 1], b'?' | b'&')) {
            from = at + 1;
            continue;
        }
        let rest = &s[at + marker.len()..];
        let n = rest.bytes().take_while(|b| b.is_ascii_alphanumeric()).count();
        let after = &rest[n..];
        let ends = after.starts_with('/') || (query && after.starts_with("%2F"));
        if (8..=128).contains(&n) && ends {
            return Some(rest[..n].to_string());
        }
        from = at + 1;
    }
    None
}

fn access_key_id(authorization: &str, target: &str) -> Option<String> {
    akid_after(authorization, "Credential=", false).or_else(|| akid_after(target, "X-Amz-Credential=", true))
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_opt(out: &mut String, s: &Option<String>) {
    match s {
        Some(v) => json_str(out, v),
        None => out.push_str("null"),
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

// ------------------------------------------------------------------ one client connection
enum Next {
    Again,
    Close,
    HandOff,
}

fn hand_off(st: &State, client: Conn) {
    let mut data = Vec::with_capacity(1 + client.pending().len());
    data.push(b'C');
    data.extend_from_slice(client.pending());
    let fd = client.s.as_raw_fd();
    let _ = send_packet(st.ctl, &data, Some(fd)); // the proxy holds its own copy of the socket now
}

fn serve(st: Arc<State>, s: TcpStream) {
    let _ = s.set_nodelay(true);
    cap_buffers(&s, PROXY_BUF);
    let mut client = Conn::new(s);
    let mut upstream: Option<Conn> = None;
    loop {
        let raw = match client.read_head() {
            Ok(Got::Head(raw)) => raw,
            Ok(Got::TooLong) => return hand_off(&st, client),
            _ => return,
        };
        // should the proxy take the connection, the head goes back in front of what is pending
        let route = st.route.read().unwrap().clone();
        if matches!(route.route, Route::All) {
            client.unread(&raw);
            return hand_off(&st, client);
        }
        let head = match Head::parse(raw.clone()) {
            Some(h) => h,
            None => {
                client.unread(&raw);
                return hand_off(&st, client);
            }
        };
        match relay_one(&st, &route, &head, &mut client, &mut upstream) {
            Ok(Next::Again) => continue,
            Ok(Next::HandOff) => {
                client.unread(&raw);
                if let Some(u) = upstream.take() {
                    let _ = u.s.shutdown(Shutdown::Both);
                }
                return hand_off(&st, client);
            }
            Ok(Next::Close) | Err(_) => return, // both sockets close as they drop, as the proxy closes them
        }
    }
}

/// One request relayed as the proxy's `_relay` does with no rule; HandOff before anything is read or sent when
/// the proxy must serve it.
fn relay_one(st: &State, route: &Routing, head: &Head, client: &mut Conn, upstream: &mut Option<Conn>)
    -> io::Result<Next> {
    let mut parts = head.start.splitn(3, ' ');
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let cl = head.get("content-length");
    let length = head.length();
    let plain = !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_alphabetic())
        && target.starts_with('/')
        && !target.contains('\t')
        && target.as_bytes() != HEALTH_PATH
        && !head.chunked()
        && (cl.is_empty() || length.map_or(false, |n| n <= HOLD_MAX));
    if !plain || (route.writes && method != "GET" && method != "HEAD") {
        return Ok(Next::HandOff); // a write under a quota: the proxy counts it before the store sees it
    }
    let req = match parse_target(target) {
        Some(r) if !route.route.takes(&r) => r,
        _ => return Ok(Next::HandOff),
    };
    let t0 = now();
    let started = Instant::now();
    let akid = access_key_id(head.get("authorization"), target);
    let sha = head.get("x-amz-content-sha256");
    let expect = head.get("expect").to_ascii_lowercase() == "100-continue";
    if upstream.is_none() {
        let u = TcpStream::connect(st.upstream)?;
        let _ = u.set_nodelay(true);
        cap_buffers(&u, PROXY_BUF);
        *upstream = Some(Conn::new(u));
    }
    let up = upstream.as_mut().unwrap();
    let held = match length {
        Some(n) if n > 0 => {
            // a small body is held whole before the store sees the request (see the proxy's _relay)
            if expect {
                client.s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
            }
            Some(client.read_exact(n)?)
        }
        _ => None,
    };
    let mut sent_body: Option<usize> = match &held {
        Some(body) if !expect => {
            let mut one = Vec::with_capacity(head.raw.len() + body.len());
            one.extend_from_slice(&head.raw);
            one.extend_from_slice(body);
            up.s.write_all(&one)?;
            Some(body.len())
        }
        Some(_) => {
            up.s.write_all(&head.raw)?;
            None
        }
        None => {
            up.s.write_all(&head.raw)?;
            Some(0)
        }
    };
    let (rhead, status) = loop {
        let raw = match up.read_head()? {
            Got::Head(raw) => raw,
            Got::Eof => return Err(bad("upstream closed before answering")),
            Got::TooLong => return Err(bad("upstream head too large")),
        };
        let rhead = Head::response(raw);
        let status: u16 = rhead
            .start
            .splitn(3, ' ')
            .nth(1)
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| bad("upstream status unreadable"))?;
        if (100..200).contains(&status) {
            match (&held, sent_body) {
                (Some(body), None) if expect => {
                    up.s.write_all(body)?; // our own 100 went to the client already
                    sent_body = Some(body.len());
                }
                _ => client.s.write_all(&rhead.raw)?,
            }
            continue;
        }
        break (rhead, status);
    };
    let no_body = method == "HEAD" || status == 204 || status == 304;
    let mut closing = rhead.get("connection").to_ascii_lowercase() == "close"
        || head.get("connection").to_ascii_lowercase() == "close";
    let rlen = rhead.length();
    let rchunked = rhead.chunked();
    let small = !rchunked && (no_body || rlen.map_or(false, |n| n <= SMALL_BODY));
    let answered: io::Result<usize> = (|| {
        if small {
            let body = if no_body { Vec::new() } else { up.read_exact(rlen.unwrap())? };
            let mut one = Vec::with_capacity(rhead.raw.len() + body.len());
            one.extend_from_slice(&rhead.raw);
            one.extend_from_slice(&body);
            client.s.write_all(&one)?;
            Ok(body.len())
        } else {
            client.s.write_all(&rhead.raw)?;
            if no_body {
                Ok(0) // a HEAD, 204 or 304 has no body, whatever its framing says
            } else if rchunked {
                copy_chunked(up, &mut client.s)
            } else {
                up.copy_to(&mut client.s, rlen)
            }
        }
    })();
    // the store has answered: the line is written even when its answer does not reach the client whole (a write
    // it applied is never missing from the log), and the connection then closes
    let (resp_bytes, lost) = match &answered {
        Ok(n) => (*n, false),
        Err(_) => (0, true),
    };
    let req_bytes = match sent_body {
        Some(n) => n,
        None => {
            closing = true; // the store answered without taking the body
            0
        }
    };
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut line = String::with_capacity(320);
    line.push_str(&format!("{{\"t\":{},\"method\":", t0));
    json_str(&mut line, method);
    line.push_str(",\"bucket\":");
    json_str(&mut line, &req.bucket);
    line.push_str(",\"key\":");
    json_str(&mut line, &req.key);
    match req.part {
        Some(p) => line.push_str(&format!(",\"part\":{}", p)),
        None => line.push_str(",\"part\":null"),
    }
    line.push_str(",\"upload_id\":");
    json_opt(&mut line, &req.upload_id);
    line.push_str(",\"prefix\":");
    json_opt(&mut line, &req.prefix);
    line.push_str(",\"akid\":");
    json_opt(&mut line, &akid);
    if sha.len() == 64 {
        line.push_str(",\"sha\":");
        json_str(&mut line, sha);
    }
    line.push_str(&format!(
        ",\"status\":{},\"req_bytes\":{},\"resp_bytes\":{},\"rule\":null,\"fault\":null,\"ms\":{:.3}{}}}\n",
        status, req_bytes, resp_bytes, ms, if lost { ",\"answer_lost\":true" } else { "" }
    ));
    st.note(line.as_bytes());
    st.relayed.fetch_add(1, Ordering::Relaxed);
    answered?;
    let until_eof = rlen.is_none() && !rchunked && !no_body;
    Ok(if closing || until_eof { Next::Close } else { Next::Again })
}

/// A chunked body relayed as it comes, trailers included; the body's bytes (chunk data only).
fn copy_chunked(src: &mut Conn, dst: &mut TcpStream) -> io::Result<usize> {
    let mut total = 0;
    loop {
        let line = src.read_line()?;
        dst.write_all(&line)?;
        let text = std::str::from_utf8(&line).map_err(|_| bad("chunk size unreadable"))?;
        let size = text.split(';').next().unwrap_or("").trim();
        let size = if size.is_empty() { 0 } else {
            usize::from_str_radix(size, 16).map_err(|_| bad("chunk size unreadable"))?
        };
        if size == 0 {
            loop {
                let trailer = src.read_line()?;
                dst.write_all(&trailer)?;
                if trailer == b"\r\n" {
                    return Ok(total);
                }
            }
        }
        src.copy_to(dst, Some(size.saturating_add(2)))?;
        total += size;
    }
}

// ------------------------------------------------------------------ main
fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn control(st: Arc<State>) {
    let mut buf = vec![0u8; 1 << 20]; // the proxy sends at most 150 KiB of slots (else M1)
    loop {
        let n = unsafe { recv(st.ctl, buf.as_mut_ptr(), buf.len(), 0) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            st.flush_log(); // the proxy is gone: what was relayed is written, and no one serves a rule now
            std::process::exit(0);
        }
        let msg = &buf[..n as usize];
        if msg.len() >= 2 && msg[0] == b'M' {
            *st.route.write().unwrap() = Arc::new(Routing::parse(&msg[1..]));
            st.flush_log();
            let answer = format!("A{}", st.relayed.load(Ordering::SeqCst));
            let _ = send_packet(st.ctl, answer.as_bytes(), None);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("forward") {
        let ctl: RawFd = arg(&args, "--control-fd").and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: sandfleet-relay forward --control-fd FD: FD must be an open unix socket's number");
            std::process::exit(2)
        });
        let num = |name: &str, default: u64| -> u64 {
            arg(&args, name).map_or(default, |v| {
                v.parse().unwrap_or_else(|_| {
                    eprintln!("sandfleet-relay forward: {name} must be a whole number, not {v:?}");
                    std::process::exit(2)
                })
            })
        };
        forward::main(ctl, num("--max-conns", 2048) as usize, num("--linger-ms", 10_000),
                      num("--conn-buf", 256 * 1024) as usize);
    }
    let usage = "usage: sandfleet-relay --upstream HOST:PORT --control-fd FD [--port N] [--log FILE]";
    let upstream = arg(&args, "--upstream")
        .and_then(|u| u.to_socket_addrs().ok())
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| {
            eprintln!("{usage}: --upstream must be HOST:PORT");
            std::process::exit(2)
        });
    let ctl: RawFd = arg(&args, "--control-fd").and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        eprintln!("{usage}: --control-fd must be an open unix socket's number");
        std::process::exit(2)
    });
    let port: u16 = arg(&args, "--port").and_then(|v| v.parse().ok()).unwrap_or(0);
    let log_file = arg(&args, "--log").map(|p| {
        OpenOptions::new().create(true).append(true).open(&p).unwrap_or_else(|e| {
            eprintln!("sandfleet-relay: --log {p}: {e}");
            std::process::exit(2)
        })
    });
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
        eprintln!("sandfleet-relay: cannot listen on 127.0.0.1:{port}: {e}");
        std::process::exit(2)
    });
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let st = Arc::new(State {
        upstream,
        ctl,
        route: RwLock::new(Arc::new(Routing { route: Route::Direct, writes: false })),
        relayed: AtomicU64::new(0),
        live: AtomicUsize::new(0),
        log: Mutex::new(Vec::with_capacity(64 * 1024)),
        logged: Condvar::new(),
        log_file: Mutex::new(log_file),
    });
    {
        let st = st.clone();
        std::thread::spawn(move || control(st));
    }
    {
        let st = st.clone();
        std::thread::spawn(move || st.writer());
    }
    if send_packet(ctl, format!("R{port}").as_bytes(), None).is_err() {
        std::process::exit(1);
    }
    for s in listener.incoming() {
        let s = match s {
            Ok(s) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10)); // out of descriptors: no busy loop meanwhile
                continue;
            }
        };
        if st.live.load(Ordering::SeqCst) >= MAX_CONNS {
            hand_off(&st, Conn::new(s));
            continue;
        }
        let spare = s.try_clone(); // should no thread start: the proxy takes the connection, never dropped
        st.live.fetch_add(1, Ordering::SeqCst);
        let ours = st.clone();
        let spawned = std::thread::Builder::new().stack_size(256 * 1024).spawn(move || {
            let _live = Live(ours.clone());
            serve(ours, s)
        });
        if spawned.is_err() {
            st.live.fetch_sub(1, Ordering::SeqCst);
            if let Ok(spare) = spare {
                hand_off(&st, Conn::new(spare));
            }
        }
    }
    let _ = unsafe { close(listener.into_raw_fd()) };
}
