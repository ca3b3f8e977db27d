//! Shared-memory transport for same-host peers.
//!
//! The segment owner listens on a Unix socket. A peer connects, asks for one segment by id, and
//! receives the segment's memfd (SCM_RIGHTS) plus its size; it maps the fd once and from then
//! on copies directly. The socket file's permissions decide who may connect (default 0600: the
//! same user), and only segments registered as shareable are handed out.
//!
//! Handshake messages (little-endian, byte layout in docs/transfer.md):
//! request  16 bytes: magic "MCSH", version 1, op 1 (map), 2 reserved zero bytes, segment id u64;
//!          or 48 bytes: the same with op 2 (map with capability), then the segment's 32-byte
//!          capability (`auth.rs`). An owner started with the cluster's token answers op 1, and
//!          op 2 with a capability that does not open the segment, with ILLEGAL_CLIENT (-601).
//! response 32 bytes: magic "MCSH", version 1, 3 reserved, status i32, 4 reserved,
//!          size u64, control offset u64; the fd rides along as ancillary data when status is 0.
//!
//! Every shareable segment carries a control word (u64 at `control offset`, past the usable
//! bytes, on its own page): 1 while registered, 0 once unregistered. Peers check it before each
//! copy, so a stale mapping is refused instead of silently written. An owner that was killed
//! cannot clear its word: peers also hold a pidfd of the owner (`owner.rs`) and fail a write
//! that finishes after the owner exited.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::ErrorCode;

use crate::auth::{Capability, DataPortAuth, CAPABILITY_BYTES};
use crate::error::TransferError;
use crate::memory::Mapping;
use crate::owner::OwnerWatch;
use crate::registry::{RegionKind, Registry};

pub(crate) const SHM_MAGIC: [u8; 4] = *b"MCSH";
pub(crate) const SHM_VERSION: u8 = 1;
pub(crate) const SHM_OP_MAP: u8 = 1;
pub(crate) const SHM_OP_MAP_WITH_CAPABILITY: u8 = 2;
pub(crate) const REQUEST_BYTES: usize = 16;
pub(crate) const RESPONSE_BYTES: usize = 32;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Control word values.
pub(crate) const CONTROL_LIVE: u64 = 1;
pub(crate) const CONTROL_REVOKED: u64 = 0;

/// Byte offset of the control word for a segment of `len_bytes`: the next page boundary.
pub(crate) fn control_offset(len_bytes: usize, page_bytes: usize) -> usize {
    len_bytes.div_ceil(page_bytes) * page_bytes
}

/// The control word of a mapping.
///
/// # Safety
/// `[base + offset, +8)` must be inside a live mapping and 8-byte aligned.
pub(crate) unsafe fn control_word<'a>(base: *mut u8, offset: usize) -> &'a AtomicU64 {
    // SAFETY: guaranteed by the caller; AtomicU64 has the layout of u64.
    unsafe { &*(base.add(offset).cast::<AtomicU64>()) }
}

/// A peer segment mapped into this process.
#[derive(Debug)]
pub(crate) struct PeerMapping {
    pub mapping: Mapping,
    pub size_bytes: u64,
    pub control_offset: usize,
    /// The owner process, watched so that a write into a dead owner's memory fails.
    pub owner: OwnerWatch,
}

impl PeerMapping {
    pub(crate) fn is_live(&self) -> bool {
        // SAFETY: the handshake checked control_offset + 8 <= mapped length and page alignment.
        let word = unsafe { control_word(self.mapping.as_ptr(), self.control_offset) };
        word.load(Ordering::Acquire) == CONTROL_LIVE
    }

    /// True once the owner process is known to have exited.
    pub(crate) fn owner_exited(&self) -> bool {
        self.owner.exited()
    }
}

/// The Unix-socket server handing out memfds.
#[derive(Debug)]
pub(crate) struct ShmServer {
    path: PathBuf,
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ShmServer {
    /// Binds `<dir>/<name>/transfer.sock`. The per-engine directory is created 0700, the socket
    /// chmod-ed to `socket_mode`, and only then the directory opened to 0755, so nobody can
    /// connect through a window with looser permissions.
    pub(crate) fn start(
        base_dir: &Path,
        name: &str,
        socket_mode: u32,
        registry: Arc<Registry>,
        auth: Option<DataPortAuth>,
    ) -> Result<ShmServer, TransferError> {
        let io = |what: &str, e: std::io::Error| TransferError::Io(format!("{what}: {e}"));
        if !base_dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(base_dir)
                .map_err(|e| io("create shm socket dir", e))?;
            // Shared by every user's engines, like /tmp (sticky: nobody removes others' dirs).
            let _ = std::fs::set_permissions(base_dir, std::fs::Permissions::from_mode(0o1777));
        }
        remove_stale_sockets(base_dir);
        let dir = base_dir.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io("create engine socket dir", e))?;
        let path = dir.join("transfer.sock");
        let listener = UnixListener::bind(&path).map_err(|e| io("bind shm socket", e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(socket_mode))
            .map_err(|e| io("chmod shm socket", e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("chmod shm socket dir", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("mc-shm-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if thread_stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let _ = serve_handshake(stream, &registry, auth.as_ref());
                    }
                }
            })
            .map_err(|e| io("spawn shm thread", e))?;
        Ok(ShmServer {
            path,
            dir,
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Drop for ShmServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

/// Removes engine directories left by processes that died without cleaning up (SIGKILL): a
/// socket nobody listens on refuses connections. Anything else (live, not ours) is left alone.
fn remove_stale_sockets(base_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(base_dir) else {
        return;
    };
    for entry in entries.flatten().take(4096) {
        let dir = entry.path();
        let socket = dir.join("transfer.sock");
        // A socket between bind() and listen() also refuses: only consider old files.
        let old = std::fs::metadata(&socket)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(5));
        if !old {
            continue;
        }
        if let Err(err) = UnixStream::connect(&socket) {
            if err.kind() == std::io::ErrorKind::ConnectionRefused {
                let _ = std::fs::remove_file(&socket);
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// Decodes the first 16 bytes of a handshake request: `(op, segment id)`; `None` when
/// malformed. Op 2 is followed by the capability.
pub(crate) fn decode_request(bytes: &[u8; REQUEST_BYTES]) -> Option<(u8, u64)> {
    let op = bytes[5];
    let ok = bytes[0..4] == SHM_MAGIC
        && bytes[4] == SHM_VERSION
        && (op == SHM_OP_MAP || op == SHM_OP_MAP_WITH_CAPABILITY);
    let reserved_zero = bytes[6] == 0 && bytes[7] == 0;
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[8..16]);
    (ok && reserved_zero).then(|| (op, u64::from_le_bytes(id)))
}

/// The handshake request for `segment_id`: op 1 (16 bytes), or op 2 with the capability (48).
pub(crate) fn encode_request(segment_id: u64, capability: Option<&Capability>) -> Vec<u8> {
    let mut out = vec![0u8; REQUEST_BYTES];
    out[0..4].copy_from_slice(&SHM_MAGIC);
    out[4] = SHM_VERSION;
    out[5] = SHM_OP_MAP;
    out[8..16].copy_from_slice(&segment_id.to_le_bytes());
    if let Some(capability) = capability {
        out[5] = SHM_OP_MAP_WITH_CAPABILITY;
        out.extend_from_slice(capability.as_bytes());
    }
    out
}

pub(crate) fn encode_response(
    status: ErrorCode,
    size_bytes: u64,
    control: u64,
) -> [u8; RESPONSE_BYTES] {
    let mut out = [0u8; RESPONSE_BYTES];
    out[0..4].copy_from_slice(&SHM_MAGIC);
    out[4] = SHM_VERSION;
    out[8..12].copy_from_slice(&status.as_i32().to_le_bytes());
    out[16..24].copy_from_slice(&size_bytes.to_le_bytes());
    out[24..32].copy_from_slice(&control.to_le_bytes());
    out
}

/// (status, size, control offset); `None` when malformed.
pub(crate) fn decode_response(bytes: &[u8; RESPONSE_BYTES]) -> Option<(ErrorCode, u64, u64)> {
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let status = i32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let ok = bytes[0..4] == SHM_MAGIC && bytes[4] == SHM_VERSION;
    let reserved_zero = bytes[5..8].iter().chain(&bytes[12..16]).all(|&b| b == 0);
    if !(ok && reserved_zero) {
        return None;
    }
    Some((ErrorCode::from_i32(status)?, word(16), word(24)))
}

fn serve_handshake(
    mut stream: UnixStream,
    registry: &Registry,
    auth: Option<&DataPortAuth>,
) -> Result<(), TransferError> {
    let io = |e: std::io::Error| TransferError::Io(e.to_string());
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    let mut request = [0u8; REQUEST_BYTES];
    stream.read_exact(&mut request).map_err(io)?;
    let Some((op, segment_id)) = decode_request(&request) else {
        let reply = encode_response(ErrorCode::INVALID_PARAMS, 0, 0);
        return stream.write_all(&reply).map_err(io);
    };
    let mut presented = None;
    if op == SHM_OP_MAP_WITH_CAPABILITY {
        let mut capability = [0u8; CAPABILITY_BYTES];
        stream.read_exact(&mut capability).map_err(io)?;
        presented = Some(capability);
    }
    if let Some(auth) = auth {
        let granted = presented.is_some_and(|cap| auth.verify(segment_id, &cap));
        if !granted {
            let reply = encode_response(ErrorCode::ILLEGAL_CLIENT, 0, 0);
            return stream.write_all(&reply).map_err(io);
        }
    }
    let region = registry.get(segment_id);
    let answer = match region {
        Some(region) => match (region.kind(), region.mapping()) {
            (RegionKind::Segment { shareable: true }, Some(mapping)) => match mapping.fd() {
                Some(fd) => Ok((region.len_bytes(), fd.as_raw_fd())),
                None => Err(ErrorCode::INVALID_PARAMS),
            },
            (RegionKind::Segment { .. }, _) => Err(ErrorCode::INVALID_PARAMS),
            _ => Err(ErrorCode::SEGMENT_NOT_FOUND),
        },
        None => Err(ErrorCode::SEGMENT_NOT_FOUND),
    };
    match answer {
        Ok((len, fd)) => {
            let control = control_offset(len, page_bytes()) as u64;
            let reply = encode_response(ErrorCode::OK, len as u64, control);
            send_with_fd(stream.as_raw_fd(), &reply, fd)
        }
        Err(code) => stream.write_all(&encode_response(code, 0, 0)).map_err(io),
    }
}

fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> Result<(), TransferError> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; zeroed means "no name, no iov, no control".
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points to `space` bytes, enough for one cmsg carrying one fd; the
    // CMSG_* helpers stay within it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(TransferError::Io("no room for SCM_RIGHTS".into()));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: msg references live buffers (bytes, control) for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n as usize == bytes.len() {
        Ok(())
    } else {
        Err(TransferError::Io(format!(
            "sendmsg with fd: {}",
            std::io::Error::last_os_error()
        )))
    }
}

/// Receives exactly `buf.len()` bytes and at most one fd.
fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> Result<Option<OwnedFd>, TransferError> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain data, see send_with_fd.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg points to live, writable buffers of the stated sizes; MSG_WAITALL makes the
    // kernel fill the whole iov unless the stream ends or times out.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
    let mut received: Option<OwnedFd> = None;
    if n > 0 {
        // SAFETY: the kernel filled msg_control/msg_controllen; we walk it with the CMSG macros
        // and take ownership only of descriptors it says it passed.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..payload / std::mem::size_of::<RawFd>() {
                        let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                        // Keep the first; extra descriptors are closed by dropping them.
                        if received.is_none() {
                            received = Some(fd);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    if n as usize != buf.len() {
        return Err(TransferError::Io(format!(
            "short handshake reply ({n} bytes): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(received)
}

/// Connects to a peer's shm socket and maps segment `segment_id`, presenting its capability
/// when the endpoint carried one.
pub(crate) fn map_peer_segment(
    socket: &Path,
    segment_id: u64,
    capability: Option<&Capability>,
) -> Result<PeerMapping, TransferError> {
    let io = |e: std::io::Error| TransferError::Io(format!("{}: {e}", socket.display()));
    let mut stream = UnixStream::connect(socket).map_err(io)?;
    let owner = OwnerWatch::of_socket_peer(stream.as_raw_fd());
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    stream
        .write_all(&encode_request(segment_id, capability))
        .map_err(io)?;
    let mut reply = [0u8; RESPONSE_BYTES];
    let fd = recv_with_fd(stream.as_raw_fd(), &mut reply)?;
    let (status, size_bytes, control) = decode_response(&reply)
        .ok_or_else(|| TransferError::Io("malformed shm handshake reply".into()))?;
    match status {
        ErrorCode::OK => {}
        ErrorCode::SEGMENT_NOT_FOUND => return Err(TransferError::SegmentNotFound { segment_id }),
        ErrorCode::INVALID_PARAMS => return Err(TransferError::NotShareable { segment_id }),
        ErrorCode::ILLEGAL_CLIENT => return Err(TransferError::Unauthorized { segment_id }),
        code => return Err(TransferError::Rejected { code }),
    }
    let fd = fd.ok_or_else(|| TransferError::Io("handshake reply carried no fd".into()))?;
    let page = page_bytes() as u64;
    let expected_control = (size_bytes.div_ceil(page)) * page;
    if control != expected_control || size_bytes == 0 {
        return Err(TransferError::Io(format!(
            "inconsistent shm reply: size {size_bytes}, control offset {control}"
        )));
    }
    let control_offset = usize::try_from(control)
        .map_err(|_| TransferError::Io("segment too large for this process".into()))?;
    let mapping = Mapping::map_received(fd, control_offset + page as usize)?;
    Ok(PeerMapping {
        mapping,
        size_bytes,
        control_offset,
        owner,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn handshake_messages_round_trip_and_reject_garbage() {
        let request: [u8; REQUEST_BYTES] = encode_request(42, None).try_into().unwrap();
        assert_eq!(decode_request(&request), Some((SHM_OP_MAP, 42)));
        let mut bad = request;
        bad[6] = 1;
        assert_eq!(decode_request(&bad), None);
        let reply = encode_response(ErrorCode::OK, 4096, 4096);
        assert_eq!(decode_response(&reply), Some((ErrorCode::OK, 4096, 4096)));
        let mut bad = reply;
        bad[0] = b'X';
        assert_eq!(decode_response(&bad), None);
    }

    /// The handshake examples of docs/transfer.md, byte by byte.
    #[test]
    fn handshake_matches_the_documented_bytes() {
        #[rustfmt::skip]
        let request: [u8; REQUEST_BYTES] = [
            0x4d, 0x43, 0x53, 0x48, // "MCSH"
            0x01,                   // version 1
            0x01,                   // op 1: map
            0x00, 0x00,             // reserved
            0x03, 0, 0, 0, 0, 0, 0, 0, // segment id 3
        ];
        assert_eq!(decode_request(&request), Some((SHM_OP_MAP, 3)));
        assert_eq!(encode_request(3, None), request);

        // With a capability (the owner has the cluster's token): op 2, then the 32 bytes.
        let capability = Capability::from_bytes([0xab; CAPABILITY_BYTES]);
        #[rustfmt::skip]
        let with_capability: [u8; REQUEST_BYTES + CAPABILITY_BYTES] = [
            0x4d, 0x43, 0x53, 0x48, // "MCSH"
            0x01,                   // version 1
            0x02,                   // op 2: map with capability
            0x00, 0x00,             // reserved
            0x03, 0, 0, 0, 0, 0, 0, 0, // segment id 3
            0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, // capability (32 bytes)
            0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
            0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
            0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
        ];
        assert_eq!(encode_request(3, Some(&capability)), with_capability);
        let head: [u8; REQUEST_BYTES] = with_capability[..REQUEST_BYTES].try_into().unwrap();
        assert_eq!(decode_request(&head), Some((SHM_OP_MAP_WITH_CAPABILITY, 3)));

        // Refused for a missing or wrong capability: ILLEGAL_CLIENT (-601 = a7 fd ff ff).
        let mut unauthorized = [0u8; RESPONSE_BYTES];
        unauthorized[..8].copy_from_slice(&[0x4d, 0x43, 0x53, 0x48, 0x01, 0, 0, 0]);
        unauthorized[8..12].copy_from_slice(&[0xa7, 0xfd, 0xff, 0xff]);
        assert_eq!(
            encode_response(ErrorCode::ILLEGAL_CLIENT, 0, 0),
            unauthorized
        );
        assert_eq!(
            decode_response(&unauthorized),
            Some((ErrorCode::ILLEGAL_CLIENT, 0, 0))
        );

        #[rustfmt::skip]
        let granted: [u8; RESPONSE_BYTES] = [
            0x4d, 0x43, 0x53, 0x48, // "MCSH"
            0x01,                   // version 1
            0x00, 0x00, 0x00,       // reserved
            0x00, 0x00, 0x00, 0x00, // status 0 (OK): the memfd travels as SCM_RIGHTS
            0x00, 0x00, 0x00, 0x00, // reserved
            0x00, 0x00, 0x10, 0, 0, 0, 0, 0, // size 1 MiB
            0x00, 0x00, 0x10, 0, 0, 0, 0, 0, // control word at byte 1 MiB
        ];
        assert_eq!(
            decode_response(&granted),
            Some((ErrorCode::OK, 1 << 20, 1 << 20))
        );
        assert_eq!(encode_response(ErrorCode::OK, 1 << 20, 1 << 20), granted);

        #[rustfmt::skip]
        let refused: [u8; RESPONSE_BYTES] = [
            0x4d, 0x43, 0x53, 0x48, 0x01, 0x00, 0x00, 0x00,
            0xa8, 0xfd, 0xff, 0xff, // status -600 INVALID_PARAMS (not shareable)
            0x00, 0x00, 0x00, 0x00,
            0, 0, 0, 0, 0, 0, 0, 0, // size 0
            0, 0, 0, 0, 0, 0, 0, 0, // control offset 0
        ];
        assert_eq!(
            decode_response(&refused),
            Some((ErrorCode::INVALID_PARAMS, 0, 0))
        );
        assert_eq!(encode_response(ErrorCode::INVALID_PARAMS, 0, 0), refused);

        // Each rule of the decoders: wrong op, version, reserved bytes, a status no code has.
        for (at, value) in [(5, 3), (5, 0), (4, 2), (7, 1), (0, b'm')] {
            let mut bad = request;
            bad[at] = value;
            assert_eq!(decode_request(&bad), None, "request byte {at} = {value}");
        }
        for (at, value) in [(4, 2), (5, 1), (13, 1), (8, 0x01)] {
            let mut bad = granted;
            bad[at] = value;
            assert_eq!(decode_response(&bad), None, "response byte {at} = {value}");
        }
    }

    #[test]
    fn control_offset_is_the_next_page_boundary() {
        assert_eq!(control_offset(1, 4096), 4096);
        assert_eq!(control_offset(4096, 4096), 4096);
        assert_eq!(control_offset(4097, 4096), 8192);
    }
}
