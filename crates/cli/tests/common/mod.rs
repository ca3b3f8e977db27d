//! Helpers for tests that start the real `mooncake` binary on 127.0.0.1 with free ports.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `mooncake master` child process; killed on drop if still running.
pub struct MasterProcess {
    pub child: Child,
    pub rpc: SocketAddr,
    pub metrics: SocketAddr,
    pub metadata: Option<SocketAddr>,
}

impl MasterProcess {
    /// Starts `mooncake master` on loopback with free ports plus `extra` flags, and waits (at
    /// most 20 s) for its "listening" line.
    pub fn start(extra: &[&str]) -> MasterProcess {
        MasterProcess::start_with_stderr(extra, Stdio::inherit())
    }

    /// [`MasterProcess::start`] with the master's stderr sent to `stderr` (a file to read back).
    pub fn start_with_stderr(extra: &[&str], stderr: Stdio) -> MasterProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mooncake"))
            .arg("master")
            .args([
                "--rpc_address=127.0.0.1",
                "--port=0",
                "--metrics_host=127.0.0.1",
                "--metrics_port=0",
                "--http_metadata_server_host=127.0.0.1",
                "--http_metadata_server_port=0",
            ])
            .args(extra)
            .env("MOONCAKE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start mooncake master");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("master did not start in 20 s");
        let words: Vec<&str> = line.split_whitespace().collect();
        let find = |tag: &str| {
            words
                .iter()
                .position(|w| *w == tag)
                .and_then(|i| words.get(i + 1))
                .map(|w| {
                    w.trim_start_matches("http://")
                        .trim_end_matches("/metadata")
                })
                .and_then(|w| w.parse::<SocketAddr>().ok())
        };
        MasterProcess {
            rpc: find("rpc").unwrap_or_else(|| panic!("no rpc address in {line:?}")),
            metrics: find("metrics").unwrap_or_else(|| panic!("no metrics address in {line:?}")),
            metadata: find("metadata"),
            child,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the master in KiB (from /proc).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Sends SIGTERM and waits (at most `limit`) for the exit status.
    pub fn terminate(mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for MasterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request with `Connection: close`; returns (status, body).
pub fn http(method: &str, addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    http_with_headers(method, addr, path, &[], body)
}

/// [`http`] with extra header lines (`("Authorization", "Bearer …")`).
pub fn http_with_headers(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP response {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
