//! Raw socket I/O straight from / into registered memory: `recv` into the destination range and
//! `sendmsg` (header + payload as two iovecs) from the source range, so no byte is staged.
//!
//! Sockets carry `SO_RCVTIMEO`/`SO_SNDTIMEO` of [`POLL_INTERVAL`]: every time a call waits that
//! long, the caller's `on_wait` decides whether to keep waiting (deadline, shutdown flag).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// How often a blocked socket call wakes up to check deadlines and shutdown.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Why a socket call gave up.
#[derive(Debug)]
pub(crate) enum IoFail {
    /// The peer closed the stream.
    Eof,
    /// `on_wait` decided the deadline passed.
    Timeout,
    /// `on_wait` saw a shutdown request.
    Stopped,
    /// Any other socket error (reset, broken pipe...).
    Os(io::Error),
}

impl std::fmt::Display for IoFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoFail::Eof => write!(f, "peer closed the connection"),
            IoFail::Timeout => write!(f, "timed out"),
            IoFail::Stopped => write!(f, "stopped"),
            IoFail::Os(err) => write!(f, "{err}"),
        }
    }
}

fn should_wait(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Receives exactly `len` bytes into `ptr`. `on_wait(bytes_so_far)` runs each time the socket
/// was silent for a poll interval and returns `Err` to give up.
///
/// # Safety
/// `[ptr, ptr+len)` must be valid for writes for the whole call (pinned registered memory or a
/// local buffer).
pub(crate) unsafe fn recv_exact(
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    mut on_wait: impl FnMut(usize) -> Result<(), IoFail>,
) -> Result<(), IoFail> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: done < len, so the range [ptr+done, ptr+len) is inside the caller's range.
        let n = unsafe { libc::recv(fd, ptr.add(done).cast(), len - done, 0) };
        if n > 0 {
            done += n as usize;
            continue;
        }
        if n == 0 {
            return Err(IoFail::Eof);
        }
        let err = io::Error::last_os_error();
        if should_wait(&err) {
            on_wait(done)?;
        } else if err.kind() != io::ErrorKind::Interrupted {
            return Err(IoFail::Os(err));
        }
    }
    Ok(())
}

/// Sends `head` then `[payload, payload+payload_len)` with as few `sendmsg` calls as the kernel
/// allows, with `MSG_NOSIGNAL` (a closed peer is an error, not a SIGPIPE).
///
/// # Safety
/// `[payload, payload+payload_len)` must be valid for reads for the whole call.
pub(crate) unsafe fn send_all(
    fd: RawFd,
    head: &[u8],
    payload: *const u8,
    payload_len: usize,
    mut on_wait: impl FnMut() -> Result<(), IoFail>,
) -> Result<(), IoFail> {
    let total = head.len() + payload_len;
    let mut sent = 0usize;
    while sent < total {
        let mut iov = [
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
        ];
        let mut count = 0;
        if sent < head.len() {
            iov[0] = libc::iovec {
                iov_base: head[sent..].as_ptr() as *mut libc::c_void,
                iov_len: head.len() - sent,
            };
            count = 1;
        }
        let payload_done = sent.saturating_sub(head.len());
        if payload_done < payload_len {
            iov[count] = libc::iovec {
                // SAFETY: payload_done < payload_len keeps the pointer inside the caller's range.
                iov_base: unsafe { payload.add(payload_done) } as *mut libc::c_void,
                iov_len: payload_len - payload_done,
            };
            count += 1;
        }
        // SAFETY: msghdr is plain data; zeroed is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = count as _;
        // SAFETY: msg points to `count` iovecs over memory valid for reads (head borrowed,
        // payload guaranteed by the caller); the kernel only reads it.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            sent += n as usize;
            continue;
        }
        let err = io::Error::last_os_error();
        if should_wait(&err) {
            on_wait()?;
        } else if err.kind() != io::ErrorKind::Interrupted {
            return Err(IoFail::Os(err));
        }
    }
    Ok(())
}

/// Reads and throws away `len` bytes (the payload of a rejected write), through a small buffer.
pub(crate) fn discard(
    fd: RawFd,
    mut len: u64,
    mut on_wait: impl FnMut(usize) -> Result<(), IoFail>,
) -> Result<(), IoFail> {
    let mut scratch = vec![0u8; 64 << 10];
    while len > 0 {
        let step = scratch
            .len()
            .min(usize::try_from(len).unwrap_or(usize::MAX));
        // SAFETY: scratch is a live Vec of at least `step` bytes.
        unsafe { recv_exact(fd, scratch.as_mut_ptr(), step, &mut on_wait)? };
        len -= step as u64;
    }
    Ok(())
}

/// Sends every `(ptr, len)` piece in order with as few `sendmsg` calls as the kernel allows
/// (several requests of one connection coalesced into one system call).
///
/// # Safety
/// Every piece must be valid for reads for the whole call.
pub(crate) unsafe fn send_pieces(
    fd: RawFd,
    pieces: &[(*const u8, usize)],
    mut on_wait: impl FnMut() -> Result<(), IoFail>,
) -> Result<(), IoFail> {
    // Linux accepts at most IOV_MAX (1024) iovecs per call.
    const MAX_IOV: usize = 1024;
    let mut index = 0usize; // first piece not fully sent
    let mut offset = 0usize; // bytes of pieces[index] already sent
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(pieces.len().min(MAX_IOV));
    while index < pieces.len() {
        iov.clear();
        for (i, &(ptr, len)) in pieces.iter().enumerate().skip(index).take(MAX_IOV) {
            let skip = if i == index { offset } else { 0 };
            iov.push(libc::iovec {
                // SAFETY: skip <= len, so the pointer stays inside (or one past) the piece.
                iov_base: unsafe { ptr.add(skip) } as *mut libc::c_void,
                iov_len: len - skip,
            });
        }
        // SAFETY: msghdr is plain data; zeroed is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: the iovecs describe memory the caller guarantees readable; the kernel only
        // reads it.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            let mut advanced = n as usize;
            while index < pieces.len() && advanced >= pieces[index].1 - offset {
                advanced -= pieces[index].1 - offset;
                index += 1;
                offset = 0;
            }
            offset += advanced;
            continue;
        }
        let err = io::Error::last_os_error();
        if should_wait(&err) {
            on_wait()?;
        } else if err.kind() != io::ErrorKind::Interrupted {
            return Err(IoFail::Os(err));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    #[test]
    fn send_pieces_delivers_every_piece_in_order_across_partial_sends() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::net::TcpStream::connect(addr).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        sender.set_write_timeout(Some(POLL_INTERVAL)).unwrap();
        // 1,500 pieces (more than IOV_MAX) with a few large ones to force partial sends.
        let data: Vec<Vec<u8>> = (0..1500usize)
            .map(|i| vec![(i % 251) as u8; if i % 500 == 0 { 3 << 20 } else { 1 + i % 97 }])
            .collect();
        let expected: Vec<u8> = data.concat();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            receiver.read_to_end(&mut got).unwrap();
            got
        });
        let pieces: Vec<(*const u8, usize)> = data.iter().map(|d| (d.as_ptr(), d.len())).collect();
        // SAFETY: every piece points into `data`, alive for the call.
        unsafe { send_pieces(sender.as_raw_fd(), &pieces, || Ok(())) }.unwrap();
        drop(sender);
        assert!(reader.join().unwrap() == expected);
    }
}
