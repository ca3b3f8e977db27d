//! Watching the process that owns a peer segment mapped over shared memory.
//!
//! A segment's memory outlives its owner: a writer that still maps the memfd of a SIGKILLed
//! node copies into it without error, and the owner can no longer revoke the control word. So
//! that such a write is not acknowledged (and then lost when the master sweeps the dead node),
//! the writer holds a pidfd of the owner, opened at the handshake from the socket's peer
//! credentials, and checks it after every write: a pidfd polls readable once its process has
//! exited. Without pidfds (a kernel before 5.3, or an owner in another pid namespace, whose pid
//! reads as 0) nothing is watched and writes behave as before.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A pidfd of a segment's owner, or nothing when none could be opened.
#[derive(Debug)]
pub(crate) struct OwnerWatch {
    pidfd: Option<OwnedFd>,
}

impl OwnerWatch {
    /// Watches the process at the other end of the connected Unix socket `sock`. Called right
    /// after connecting and before the handshake request is sent: the owner answers that
    /// request, so it was alive when the pidfd was opened and the pid was not reused.
    pub(crate) fn of_socket_peer(sock: RawFd) -> OwnerWatch {
        let pidfd = peer_pid(sock).and_then(pidfd_open);
        OwnerWatch { pidfd }
    }

    /// A watch that never reports an exit (tests, and owners that cannot be watched).
    #[cfg(test)]
    pub(crate) fn none() -> OwnerWatch {
        OwnerWatch { pidfd: None }
    }

    /// Whether a pidfd is held.
    #[cfg(test)]
    pub(crate) fn is_watching(&self) -> bool {
        self.pidfd.is_some()
    }

    /// True once the owner process has exited (its pidfd polls readable).
    pub(crate) fn exited(&self) -> bool {
        let Some(fd) = &self.pidfd else { return false };
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut poll, 1, 0) };
        n == 1 && poll.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// The pid of the process that created the listening end of `sock` (SO_PEERCRED).
fn peer_pid(sock: RawFd) -> Option<libc::pid_t> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred of `len` bytes for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::time::{Duration, Instant};

    #[test]
    fn a_live_owner_is_watched_and_not_exited() {
        let dir = std::env::temp_dir().join(format!("mc-owner-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let stream = UnixStream::connect(&path).unwrap();
        let watch = OwnerWatch::of_socket_peer(stream.as_raw_fd());
        // This very process is the owner here: pidfds exist on every kernel we run on.
        assert!(watch.is_watching());
        assert!(!watch.exited());
        assert!(!OwnerWatch::none().exited());
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_exited_owner_is_seen() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let watch = OwnerWatch {
            pidfd: pidfd_open(pid),
        };
        assert!(watch.is_watching());
        assert!(!watch.exited());
        child.kill().unwrap();
        // Readable once the process has exited, reaped or not; bounded poll.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !watch.exited() {
            assert!(Instant::now() < deadline, "pidfd never reported the exit");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.wait();
        assert!(watch.exited());
    }
}
