//! Helpers for tests that start the real `mooncake` binary on 127.0.0.1 with free ports.
#![allow(dead_code, clippy::unwrap_used)]

pub mod cluster;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `mooncake` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mooncake");

/// Waits (at most `limit`) for the first line `child` prints on stdout, then keeps draining its
/// stdout so it never blocks on a full pipe. `None`: stdout closed first (the process ended).
pub fn first_line(child: &mut Child, limit: Duration) -> Option<String> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    let line = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no first line on stdout within {limit:?}"));
    (!line.is_empty()).then_some(line)
}

/// The word after `tag` in `line` (e.g. the address after `rpc`).
pub fn word_after<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == tag)?;
    words.next()
}

/// Sends `signal` to our own child.
pub fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
}

/// The child's exit status, waiting at most `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// How to start a `mooncake master`.
pub struct MasterOptions<'a> {
    /// RPC port (0: any free one).
    pub port: u16,
    pub extra: &'a [&'a str],
    pub stderr: Stdio,
    /// `MOONCAKE_LOG`.
    pub log: &'a str,
    /// More environment variables.
    pub env: &'a [(&'a str, &'a str)],
}

impl Default for MasterOptions<'_> {
    fn default() -> Self {
        MasterOptions {
            port: 0,
            extra: &[],
            stderr: Stdio::inherit(),
            log: "warn",
            env: &[],
        }
    }
}

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
        let options = MasterOptions {
            extra,
            stderr,
            ..MasterOptions::default()
        };
        MasterProcess::spawn(options).unwrap_or_else(|status| panic!("master exited: {status}"))
    }

    /// Starts a master as `options` say and waits (at most 30 s) for its "listening" line;
    /// `Err` with its exit status when it ended before printing it.
    pub fn spawn(options: MasterOptions<'_>) -> Result<MasterProcess, ExitStatus> {
        let mut child = Command::new(BIN)
            .arg("master")
            .args([
                "--rpc_address=127.0.0.1".to_string(),
                format!("--port={}", options.port),
                "--metrics_host=127.0.0.1".into(),
                "--metrics_port=0".into(),
                "--http_metadata_server_host=127.0.0.1".into(),
                "--http_metadata_server_port=0".into(),
            ])
            .args(options.extra)
            .env("MOONCAKE_LOG", options.log)
            .envs(options.env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(options.stderr)
            .spawn()
            .expect("start mooncake master");
        let Some(line) = first_line(&mut child, Duration::from_secs(30)) else {
            return Err(wait_exit(&mut child, Duration::from_secs(10)).expect("master exit"));
        };
        let find = |tag: &str| {
            word_after(&line, tag)
                .map(|w| {
                    w.trim_start_matches("http://")
                        .trim_end_matches("/metadata")
                })
                .and_then(|w| w.parse::<SocketAddr>().ok())
        };
        Ok(MasterProcess {
            rpc: find("rpc").unwrap_or_else(|| panic!("no rpc address in {line:?}")),
            metrics: find("metrics").unwrap_or_else(|| panic!("no metrics address in {line:?}")),
            metadata: find("metadata"),
            child,
        })
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
    pub fn terminate(mut self, limit: Duration) -> Option<ExitStatus> {
        signal(&self.child, libc::SIGTERM);
        wait_exit(&mut self.child, limit)
    }
}

impl Drop for MasterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `mooncake store` node; killed on drop.
pub struct StoreNode {
    pub child: Child,
    /// The transfer endpoint it printed.
    pub endpoint: String,
    /// Its segment's name (`host:port`), as copy, move and drain name it.
    pub name: String,
}

impl StoreNode {
    /// Starts `mooncake store --master MASTER --segment-size SEGMENT EXTRA…` (no access token
    /// from this process's environment: a token comes only from `extra`) and waits (at most
    /// 20 s) for its first line, which names its endpoint.
    pub fn start(master: &str, segment: &str, extra: &[&str]) -> StoreNode {
        StoreNode::start_logging(master, segment, extra, "error", Stdio::inherit())
    }

    /// [`StoreNode::start`] with `MOONCAKE_LOG=log` and the node's stderr sent to `stderr` (a
    /// file to read back).
    pub fn start_logging(
        master: &str,
        segment: &str,
        extra: &[&str],
        log: &str,
        stderr: Stdio,
    ) -> StoreNode {
        let mut child = Command::new(BIN)
            .args(["store", "--master", master, "--segment-size", segment])
            .args(extra)
            .env_remove("MC_AUTH_TOKEN")
            .env_remove("MC_AUTH_TOKEN_FILE")
            .env("MOONCAKE_LOG", log)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start mooncake store");
        let line = first_line(&mut child, Duration::from_secs(20)).expect("store node exited");
        let endpoint = word_after(&line, "endpoint")
            .unwrap_or_else(|| panic!("no endpoint in {line:?}"))
            .to_string();
        let name = word_after(&line, "name").unwrap_or_default().to_string();
        StoreNode {
            child,
            endpoint,
            name,
        }
    }

    pub fn signal(&self, sig: i32) {
        signal(&self.child, sig);
    }

    /// The exit status, waiting at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.child, limit)
    }

    /// SIGKILL, and waits (at most 10 s) for the exit.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        self.wait(Duration::from_secs(10)).expect("node exit");
    }
}

impl Drop for StoreNode {
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

/// `len` pseudo-random bytes, the same for the same `seed` (xorshift64).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Polls (at most `limit`) until every object reads back through `c`; asserts each is
/// byte-exact.
pub async fn wait_readable_within(
    c: &mooncake_client::StoreClient,
    objects: &[(String, Vec<u8>)],
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    for (key, value) in objects {
        loop {
            match c.get(key).await {
                Ok(got) => {
                    assert!(got == *value, "{key}: other bytes than were put");
                    break;
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{key} not readable within {limit:?}: {e}"),
            }
        }
    }
}

/// Runs a `mooncake` verb with a time limit.
pub fn verb(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("MOONCAKE_LOG", "error")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut o = Vec::new();
        let mut e = Vec::new();
        let _ = out.read_to_end(&mut o);
        let _ = err.read_to_end(&mut e);
        let _ = tx.send((o, e));
    });
    let (stdout, stderr) = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("mooncake {args:?} did not finish in 30 s"));
    let status = child.wait().unwrap();
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Runs `mooncake ARGS` with no stdin; its stdout, after asserting it exited 0 (stdout and stderr
/// in the message otherwise).
pub fn verb_ok(args: &[&str]) -> String {
    let out = verb(args, None);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
