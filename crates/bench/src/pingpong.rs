//! The kernel's floor under every RPC: a 32-byte TCP ping-pong between two processes, with
//! blocking reads or with both sides spinning on non-blocking sockets. Benchmarks of request /
//! response protocols print their latency next to this one, measured in the same run.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Message size of the ping-pong.
pub const MESSAGE_BYTES: usize = 32;

/// Latency summary of a sequential request/response loop.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub ops: usize,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Latency {
    /// Summarizes per-operation latencies measured over `elapsed`.
    pub fn from_samples(samples: &mut [Duration], elapsed: Duration) -> Latency {
        samples.sort_unstable();
        let pick = |q: f64| {
            if samples.is_empty() {
                return 0.0;
            }
            let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[i].as_secs_f64() * 1e6
        };
        Latency {
            ops: samples.len(),
            ops_per_sec: samples.len() as f64 / elapsed.as_secs_f64().max(1e-9),
            p50_us: pick(0.50),
            p99_us: pick(0.99),
        }
    }
}

fn read_exact_spinning(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Child side: echo 32-byte messages on one connection until it closes. Prints the port first.
pub fn serve(spin: bool) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(spin)?;
    let mut buf = [0u8; MESSAGE_BYTES];
    loop {
        let read = if spin {
            read_exact_spinning(&mut stream, &mut buf)
        } else {
            stream.read_exact(&mut buf)
        };
        if read.is_err() {
            return Ok(());
        }
        stream.write_all(&buf)?;
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `iterations` sequential round trips against a child process of this binary.
pub fn measure(spin: bool, iterations: usize) -> anyhow::Result<Latency> {
    let exe = std::env::current_exe().context("locating the mooncake binary")?;
    let mut command = Command::new(exe);
    command.args(["bench", "pingpong-serve"]);
    if spin {
        command.arg("--spin");
    }
    let mut child = KillOnDrop(
        command
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the ping-pong child")?,
    );
    let stdout = child.0.stdout.take().context("child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let port: u16 = line.trim().parse().context("reading the child's port")?;
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(spin)?;
    let message = [7u8; MESSAGE_BYTES];
    let mut answer = [0u8; MESSAGE_BYTES];
    let mut samples = Vec::with_capacity(iterations);
    // Warm up the path, then measure.
    for round in 0..iterations + iterations / 10 {
        let start = Instant::now();
        stream.write_all(&message)?;
        if spin {
            read_exact_spinning(&mut stream, &mut answer)?;
        } else {
            stream.read_exact(&mut answer)?;
        }
        if round >= iterations / 10 {
            samples.push(start.elapsed());
        }
    }
    if answer != message {
        bail!("ping-pong child answered different bytes");
    }
    let elapsed = samples.iter().sum();
    Ok(Latency::from_samples(&mut samples, elapsed))
}
