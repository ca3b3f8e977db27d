//! Helpers shared by the transfer integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mooncake_transfer::{Endpoint, TransferConfig, TransferEngine, TransportMode};

/// An engine on 127.0.0.1:0 with the given transport and entry timeout.
pub fn engine(transport: TransportMode, entry_timeout_ms: u64) -> TransferEngine {
    TransferEngine::start(TransferConfig {
        transport,
        entry_timeout_ms,
        ..TransferConfig::default()
    })
    .unwrap()
}

/// `len` bytes of a random 4093-byte block repeated (fast to build even in debug builds;
/// the prime period catches any misplacement that is not a multiple of 4093).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut block = vec![0u8; 4093];
    rng.fill_bytes(&mut block);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = block.len().min(len - out.len());
        out.extend_from_slice(&block[..take]);
    }
    out
}

/// The pattern the peer binary writes into its segment.
pub fn peer_pattern_byte(i: usize) -> u8 {
    ((i * 31 + 7) % 251) as u8
}

/// A `mooncake-transfer-peer` child process serving one segment.
pub struct PeerProcess {
    pub child: Child,
    pub endpoint: Arc<Endpoint>,
    pub segment_id: u64,
    _stdin: ChildStdin,
}

impl PeerProcess {
    pub fn spawn(segment_bytes: usize) -> PeerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mooncake-transfer-peer"))
            .arg(segment_bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("peer did not start");
        let mut parts = line.split_whitespace();
        assert_eq!(parts.next(), Some("READY"), "peer said {line:?}");
        let endpoint = Arc::new(Endpoint::parse(parts.next().unwrap()).unwrap());
        let segment_id = parts.next().unwrap().parse().unwrap();
        PeerProcess {
            child,
            endpoint,
            segment_id,
            _stdin: stdin,
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// SIGSTOP, then waits (bounded) until the kernel reports the process stopped.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let stat = format!("/proc/{}/stat", self.child.id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let text = std::fs::read_to_string(&stat).unwrap_or_default();
            // Field 3, after the parenthesised command name, is the state.
            let state = text
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            if state == Some("T") {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("peer did not stop");
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
