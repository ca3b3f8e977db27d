//! Standalone mode: a long-running **real client** process (`mooncake_client`, upstream's name
//! and flags) contributes this host's memory to the cluster, and **dummy** clients in other
//! processes of the host attach to it by address (the Python binding's
//! `setup_dummy(mem_pool_size, local_buffer_size, "host:port")`).
//!
//! A dummy is a [`StoreClient`] of its own without a segment. One attach round trip tells it
//! the master, the tenant and the real client's segment; from then on it calls the master
//! directly and moves bytes to and from the real client's segment over shared memory (its
//! transfer engine maps the segment's memfd, as with any same-host peer). Nothing is forwarded
//! through the real client, so every call keeps the embedded client's code path and speed, and
//! a dummy goes on working (with the rest of the cluster) if the real client restarts.
//!
//! Attach protocol, over TCP to the real client's `--port` (default 50052), one exchange per
//! connection, answered within [`ATTACH_TIMEOUT`]:
//!
//! ```text
//! request   "MCRS-ATTACH 1\n"
//! response  "MCRS-OK 1\tmaster=ADDR\ttenant=T\tsegment=HOST:PORT\tprotocol=tcp\thost_id=ID\n"
//! refusal   "MCRS-ERR MESSAGE\n"
//! ```
//!
//! Values never hold a tab or a newline (the real client refuses such flags); a response is at
//! most [`MAX_ATTACH_LINE`] bytes.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::store::{StoreClient, StoreConfig, StoreError};

/// Upstream's real-client RPC port.
pub const DEFAULT_PORT: u16 = 50052;
/// Longest attach request or response line.
pub const MAX_ATTACH_LINE: usize = 4096;
/// Bound of one attach exchange (connect, request, response).
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);
/// Attach connections served at once; more are closed at once.
const MAX_ATTACH_CONNECTIONS: usize = 64;

const ATTACH_REQUEST: &str = "MCRS-ATTACH 1";
const ATTACH_OK: &str = "MCRS-OK 1";

/// The real client's flags (upstream's `mooncake_client`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealClientArgs {
    pub master_server_address: String,
    /// Host (or `host:port`) of the transfer server; the attach server listens on its host.
    pub host: String,
    /// Port of the attach server (upstream's RPC port).
    pub port: u16,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub protocol: String,
    pub tenant_id: String,
    /// Runtime worker threads.
    pub threads: usize,
}

impl Default for RealClientArgs {
    fn default() -> Self {
        RealClientArgs {
            master_server_address: "127.0.0.1:50051".into(),
            // Loopback unless told otherwise (upstream binds 0.0.0.0): the data port serves this
            // host's memory (docs/security.md).
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            global_segment_size: 4 << 30,
            local_buffer_size: 0,
            protocol: "tcp".into(),
            tenant_id: "default".into(),
            threads: 1,
        }
    }
}

/// Why the flags were not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgsError {
    /// `--help`: the usage text (exit 0).
    Help(String),
    /// A bad or unknown flag (exit 2).
    Bad(String),
}

/// Flags upstream's `mooncake_client` takes that have no effect here (accepted and ignored).
const IGNORED_FLAGS: [&str; 3] = ["metadata_server", "device_names", "http_port"];

impl RealClientArgs {
    /// The usage text.
    pub fn usage() -> String {
        "Usage: mooncake_client [--flag=value ...]   (flags also take `-` for `_`)\n\
         \x20 --master_server_address=ADDR  the master's RPC address (127.0.0.1:50051)\n\
         \x20 --host=HOST[:PORT]            transfer server host (127.0.0.1); the attach server \
         listens on HOST too\n\
         \x20 --port=N                      attach port for setup_dummy clients (50052)\n\
         \x20 --global_segment_size=SIZE    memory contributed (\"4 GB\")\n\
         \x20 --local_buffer_size=SIZE      cap on this process's own unregistered objects (0)\n\
         \x20 --protocol=tcp                tcp (rdma falls back to tcp)\n\
         \x20 --tenant_id=ID                tenant of the dummies' keys (default)\n\
         \x20 --threads=N                   runtime threads (1)\n\
         \x20 --metadata_server, --device_names, --http_port: accepted, no effect\n\
         \x20 --enable_offload, --enable_http_server: refused when true\n"
            .to_string()
    }

    /// Parses upstream's gflags-style flags (`--name=value`, `--name value`, `-name=value`,
    /// `--flag` / `--noflag` for booleans). `argv` excludes the program name.
    pub fn parse<I: IntoIterator<Item = String>>(argv: I) -> Result<RealClientArgs, ArgsError> {
        let mut args = RealClientArgs::default();
        let mut argv = argv.into_iter();
        while let Some(raw) = argv.next() {
            if raw == "--help" || raw == "-h" || raw == "-help" {
                return Err(ArgsError::Help(Self::usage()));
            }
            let Some(body) = raw.strip_prefix("--").or_else(|| raw.strip_prefix('-')) else {
                return Err(ArgsError::Bad(format!("unexpected argument {raw:?}")));
            };
            let (name, inline) = match body.split_once('=') {
                Some((name, value)) => (name.replace('-', "_"), Some(value.to_string())),
                None => (body.replace('-', "_"), None),
            };
            let boolean = |inline: &Option<String>| -> Result<bool, ArgsError> {
                match inline.as_deref() {
                    None => Ok(true),
                    Some(v) => match v.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" => Ok(true),
                        "false" | "0" | "no" => Ok(false),
                        _ => Err(ArgsError::Bad(format!("--{name}: {v:?} is not a boolean"))),
                    },
                }
            };
            match name.as_str() {
                "enable_offload" | "enable_http_server" => {
                    if boolean(&inline)? {
                        return Err(ArgsError::Bad(format!(
                            "--{name}=true is not supported by mooncake-rs"
                        )));
                    }
                    continue;
                }
                "noenable_offload" | "noenable_http_server" => continue,
                _ => {}
            }
            let value = match inline {
                Some(value) => value,
                None => argv
                    .next()
                    .ok_or_else(|| ArgsError::Bad(format!("--{name} needs a value")))?,
            };
            let size = |v: &str| {
                mooncake_common::parse_size(v).map_err(|e| ArgsError::Bad(format!("--{name}: {e}")))
            };
            match name.as_str() {
                "master_server_address" => args.master_server_address = value,
                "host" => args.host = value,
                "port" => {
                    args.port = value
                        .parse()
                        .map_err(|_| ArgsError::Bad(format!("--port: {value:?} is not a port")))?
                }
                "global_segment_size" => args.global_segment_size = size(&value)?,
                "local_buffer_size" => args.local_buffer_size = size(&value)?,
                "protocol" => args.protocol = value.trim().to_ascii_lowercase(),
                "tenant_id" => args.tenant_id = value,
                "threads" => {
                    args.threads = value
                        .parse()
                        .ok()
                        .filter(|&n: &usize| (1..=1024).contains(&n))
                        .ok_or_else(|| {
                            ArgsError::Bad(format!("--threads: {value:?} is not 1..=1024"))
                        })?
                }
                other if IGNORED_FLAGS.contains(&other) => {}
                other => return Err(ArgsError::Bad(format!("unknown flag --{other}"))),
            }
        }
        if !matches!(args.protocol.as_str(), "tcp" | "rdma") {
            return Err(ArgsError::Bad(format!(
                "--protocol {:?} is not supported (tcp; rdma falls back to tcp)",
                args.protocol
            )));
        }
        for (flag, value) in [
            ("master_server_address", &args.master_server_address),
            ("tenant_id", &args.tenant_id),
            ("host", &args.host),
        ] {
            if value.is_empty() || value.contains(['\t', '\n', '\r']) {
                return Err(ArgsError::Bad(format!(
                    "--{flag} must be non-empty, without tabs or newlines"
                )));
            }
        }
        Ok(args)
    }

    /// The host part of `--host` (without a port).
    fn bare_host(&self) -> String {
        match self.host.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() && !host.contains(':') => {
                host.to_string()
            }
            _ => self
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        }
    }
}

/// What a dummy learns when it attaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachInfo {
    /// The master's RPC address.
    pub master: String,
    pub tenant: String,
    /// The real client's segment name (`host:port`; a dummy's `get_hostname`).
    pub segment: String,
    pub protocol: String,
    /// The real client's host id (a dummy on another host cannot share its memory).
    pub host_id: String,
}

impl AttachInfo {
    fn encode(&self) -> String {
        format!(
            "{ATTACH_OK}\tmaster={}\ttenant={}\tsegment={}\tprotocol={}\thost_id={}\n",
            self.master, self.tenant, self.segment, self.protocol, self.host_id
        )
    }

    fn decode(line: &str) -> Result<AttachInfo, StoreError> {
        let bad = |why: &str| StoreError::InvalidParams(format!("attach answer refused: {why}"));
        let line = line.trim_end_matches(['\n', '\r']);
        if let Some(message) = line.strip_prefix("MCRS-ERR ") {
            return Err(bad(message));
        }
        let mut fields = line.split('\t');
        if fields.next() != Some(ATTACH_OK) {
            return Err(bad("not a mooncake-rs real client (or another version)"));
        }
        let mut info = AttachInfo {
            master: String::new(),
            tenant: String::new(),
            segment: String::new(),
            protocol: String::new(),
            host_id: String::new(),
        };
        for field in fields {
            let (name, value) = field
                .split_once('=')
                .ok_or_else(|| bad("malformed field"))?;
            let slot = match name {
                "master" => &mut info.master,
                "tenant" => &mut info.tenant,
                "segment" => &mut info.segment,
                "protocol" => &mut info.protocol,
                "host_id" => &mut info.host_id,
                _ => continue, // fields of a later version
            };
            *slot = value.to_string();
        }
        if info.master.is_empty() {
            return Err(bad("no master address"));
        }
        Ok(info)
    }
}

/// Asks the real client at `server_address` (`host:port`) what a dummy needs to join.
pub async fn attach(server_address: &str) -> Result<AttachInfo, StoreError> {
    let unreachable = |addr: SocketAddr, why: String| {
        StoreError::Master(crate::master_client::MasterError::Rpc(
            mooncake_rpc::RpcError::Connect {
                addr,
                message: format!("real client: {why}"),
            },
        ))
    };
    let addr = server_address
        .to_socket_addrs()
        .map_err(|e| StoreError::InvalidParams(format!("server_address {server_address:?}: {e}")))?
        .next()
        .ok_or_else(|| {
            StoreError::InvalidParams(format!(
                "server_address {server_address:?} resolves to nothing"
            ))
        })?;
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(format!("{ATTACH_REQUEST}\n").as_bytes())
            .await?;
        let mut line = String::new();
        BufReader::new(stream)
            .take(MAX_ATTACH_LINE as u64)
            .read_line(&mut line)
            .await?;
        Ok::<String, std::io::Error>(line)
    };
    let line = tokio::time::timeout(ATTACH_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            unreachable(
                addr,
                format!("no answer within {} s", ATTACH_TIMEOUT.as_secs()),
            )
        })?
        .map_err(|e| unreachable(addr, e.to_string()))?;
    AttachInfo::decode(&line)
}

/// A running real client: its store client (with the host's segment) and the attach server.
#[derive(Debug)]
pub struct RealClient {
    client: StoreClient,
    attach_addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl RealClient {
    /// Joins the cluster (mounting `--global_segment_size`) and starts the attach server on
    /// `host:port` (port 0: any free port). Must be called inside a tokio runtime.
    pub async fn start(args: &RealClientArgs) -> Result<RealClient, StoreError> {
        if args.protocol == "rdma" {
            tracing::warn!("protocol rdma is not available in mooncake-rs: using tcp");
        }
        let config = StoreConfig {
            master_addr: args.master_server_address.clone(),
            local_hostname: args.host.clone(),
            global_segment_size: args.global_segment_size,
            local_buffer_size: args.local_buffer_size,
            tenant: args.tenant_id.clone(),
            ..StoreConfig::default()
        };
        let bind = (args.bare_host().as_str(), args.port)
            .to_socket_addrs()
            .map_err(|e| StoreError::InvalidParams(format!("--host {:?}: {e}", args.host)))?
            .next()
            .ok_or_else(|| StoreError::InvalidParams(format!("--host {:?}", args.host)))?;
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| StoreError::InvalidParams(format!("attach port {bind}: {e}")))?;
        let attach_addr = listener
            .local_addr()
            .map_err(|e| StoreError::InvalidParams(format!("attach port {bind}: {e}")))?;
        let client = StoreClient::connect(config).await?;
        let host_id = mooncake_transfer::Endpoint::parse(&client.endpoint())
            .ok()
            .and_then(|e| e.host_id().map(str::to_string))
            .unwrap_or_default();
        let info = AttachInfo {
            master: args.master_server_address.clone(),
            tenant: args.tenant_id.clone(),
            segment: client.segment_name(),
            protocol: "tcp".into(),
            host_id,
        };
        let server = tokio::spawn(serve_attach(listener, Arc::new(info.encode())));
        Ok(RealClient {
            client,
            attach_addr,
            server,
        })
    }

    /// Where dummies attach.
    pub fn attach_addr(&self) -> SocketAddr {
        self.attach_addr
    }

    /// The real client's store client.
    pub fn client(&self) -> &StoreClient {
        &self.client
    }

    /// Stops the attach server and unmounts the segment (objects stored only there are gone).
    pub async fn close(self) -> Result<(), StoreError> {
        self.server.abort();
        self.client.close().await
    }
}

async fn serve_attach(listener: TcpListener, answer: Arc<String>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_ATTACH_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or similar: let the condition pass instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            continue; // too many at once: dropping the stream closes it
        };
        let answer = Arc::clone(&answer);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(ATTACH_TIMEOUT, answer_attach(stream, &answer)).await;
            drop(slot);
        });
    }
}

async fn answer_attach(stream: TcpStream, answer: &str) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read)
        .take(MAX_ATTACH_LINE as u64)
        .read_line(&mut line)
        .await?;
    if line.trim_end_matches(['\n', '\r']) == ATTACH_REQUEST {
        write.write_all(answer.as_bytes()).await?;
    } else {
        write.write_all(b"MCRS-ERR unknown request\n").await?;
    }
    write.shutdown().await
}

/// Runs a real client with `args` until SIGINT or SIGTERM, then unmounts its segment. Prints
/// `mooncake_client: attach ADDR segment NAME endpoint EP master ADDR` once serving. Returns
/// the exit code: 0 after a clean shutdown, 1 when it could not start.
pub fn run_until_signal(args: RealClientArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mooncake_client: {error}");
            return 1;
        }
    };
    runtime.block_on(async move {
        // Handlers first: a signal right after the ready line must still unmount.
        use tokio::signal::unix::{signal, SignalKind};
        let (mut terminate, mut interrupt) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("mooncake_client: signal handlers: {e}");
                return 1;
            }
        };
        let real = match RealClient::start(&args).await {
            Ok(real) => real,
            Err(error) => {
                eprintln!(
                    "mooncake_client: joining the cluster of master {}: {error}",
                    args.master_server_address
                );
                return 1;
            }
        };
        println!(
            "mooncake_client: attach {} segment {} endpoint {} master {}",
            real.attach_addr(),
            real.client().segment_name(),
            real.client().endpoint(),
            args.master_server_address
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        match real.close().await {
            Ok(()) => {
                println!("mooncake_client: unmounted, bye");
                0
            }
            Err(error) => {
                eprintln!("mooncake_client: unmounting at shutdown: {error}");
                1
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(args: &[&str]) -> Result<RealClientArgs, ArgsError> {
        RealClientArgs::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_take_upstream_names_and_forms() {
        let args = parse(&[
            "--master_server_address=10.0.0.1:50051",
            "--host",
            "127.0.0.1",
            "-port=50053",
            "--global-segment-size=1 GB",
            "--local_buffer_size",
            "16MB",
            "--protocol=RDMA",
            "--tenant_id=t1",
            "--metadata_server=http://x/metadata",
            "--device_names=mlx5_0",
            "--threads=2",
            "--enable_offload=false",
            "--noenable_http_server",
        ])
        .unwrap();
        assert_eq!(args.master_server_address, "10.0.0.1:50051");
        assert_eq!(args.host, "127.0.0.1");
        assert_eq!(args.port, 50053);
        assert_eq!(args.global_segment_size, 1 << 30);
        assert_eq!(args.local_buffer_size, 16 << 20);
        assert_eq!(args.protocol, "rdma");
        assert_eq!(args.tenant_id, "t1");
        assert_eq!(args.threads, 2);
        assert_eq!(parse(&[]).unwrap(), RealClientArgs::default());
        assert_eq!(RealClientArgs::default().port, 50052);
    }

    #[test]
    fn bad_flags_are_refused_by_name() {
        for (argv, needle) in [
            (&["--nope=1"][..], "--nope"),
            (&["--port=99999"][..], "--port"),
            (&["--port"][..], "needs a value"),
            (&["--protocol=ucx"][..], "ucx"),
            (&["--enable_offload"][..], "enable_offload"),
            (&["--enable_http_server=true"][..], "enable_http_server"),
            (&["--global_segment_size=lots"][..], "global_segment_size"),
            (&["--tenant_id=a\tb"][..], "tenant_id"),
            (&["stray"][..], "stray"),
        ] {
            match parse(argv) {
                Err(ArgsError::Bad(message)) => assert!(message.contains(needle), "{message}"),
                other => panic!("{argv:?}: {other:?}"),
            }
        }
        assert!(matches!(parse(&["--help"]), Err(ArgsError::Help(_))));
    }

    #[test]
    fn attach_answers_round_trip_and_refusals_are_errors() {
        let info = AttachInfo {
            master: "127.0.0.1:1".into(),
            tenant: "t".into(),
            segment: "127.0.0.1:12345".into(),
            protocol: "tcp".into(),
            host_id: "h".into(),
        };
        assert_eq!(AttachInfo::decode(&info.encode()).unwrap(), info);
        assert!(AttachInfo::decode("MCRS-ERR nope\n").is_err());
        assert!(AttachInfo::decode("HTTP/1.1 200 OK\r\n").is_err());
        assert!(
            AttachInfo::decode("MCRS-OK 1\ttenant=t\n").is_err(),
            "no master"
        );
        let later = format!("{}\textra=1\n", info.encode().trim_end());
        assert_eq!(AttachInfo::decode(&later).unwrap(), info);
    }

    #[test]
    fn bare_host_drops_a_port() {
        let mut args = RealClientArgs::default();
        for (host, bare) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.1:17000", "127.0.0.1"),
            ("[::1]", "::1"),
            ("localhost", "localhost"),
        ] {
            args.host = host.into();
            assert_eq!(args.bare_host(), bare);
        }
    }
}
