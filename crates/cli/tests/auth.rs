//! Access control with real processes on loopback: a `mooncake master` and a `mooncake store`
//! started with `--auth_token_file`, clients in this process and the `mooncake` verbs with
//! `MC_AUTH_TOKEN` / `MC_AUTH_TOKEN_FILE`. The admin HTTP port refuses mutations and data reads
//! without the bearer token, the master refuses clients without the token, the node's data
//! port refuses a peer guessing segment ids, and everything works with the token. Also: the
//! one-line warning for a non-loopback bind without a token. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{http, http_with_headers, MasterProcess, StoreNode, BIN};
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{AuthToken, ErrorCode, ReplicaKind, ReplicateConfig};
use mooncake_transfer::wire::{Header, Kind, HEADER_BYTES};
use mooncake_transfer::Endpoint;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SECRET: &str = "5f0c8a6e1d2b4c3a9e8f7d6c5b4a3928";

/// A directory with the token file (and scratch files); removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("mc-auth-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), format!("{SECRET}\n")).unwrap();
        Scratch(dir)
    }

    fn token_file(&self) -> String {
        self.0.join("token").display().to_string()
    }

    fn file(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a `mooncake` verb (30 s limit) with exactly the given auth environment.
fn verb(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("MC_AUTH_TOKEN")
        .env_remove("MC_AUTH_TOKEN_FILE")
        .env("MOONCAKE_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn client(master: SocketAddr, auth_token: Option<AuthToken>) -> Result<StoreClient, String> {
    StoreClient::connect(StoreConfig {
        master_addr: master.to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        auth_token,
        ..StoreConfig::default()
    })
    .await
    .map_err(|error| format!("{} {error}", error.code().name()))
}

fn token() -> AuthToken {
    AuthToken::from_bytes(SECRET.as_bytes()).unwrap()
}

#[test]
fn admin_http_needs_the_bearer_token_except_for_monitoring() {
    let scratch = Scratch::new("http");
    let token_flag = format!("--auth_token_file={}", scratch.token_file());
    let master = MasterProcess::start(&[&token_flag, "--enable_http_metadata_server=true"]);
    let _node = StoreNode::start(
        &master.rpc.to_string(),
        "64MiB",
        &["--auth_token_file", &scratch.token_file()],
    );
    let rt = runtime();
    let member = rt.block_on(client(master.rpc, Some(token()))).unwrap();
    for i in 0..3 {
        rt.block_on(member.put(
            &format!("k{i}"),
            &[i as u8; 1000],
            &ReplicateConfig::default(),
        ))
        .unwrap();
    }
    let present = || -> usize {
        (0..3)
            .filter(|i| rt.block_on(member.is_exist(&format!("k{i}"))).unwrap())
            .count()
    };
    assert_eq!(present(), 3);

    let remove_all = "/api/v1/remove_all?force=true";
    let bearer = format!("Bearer {SECRET}");
    let (status, body) = http("POST", master.metrics, remove_all, b"");
    assert_eq!(status, 401, "{body}");
    assert!(
        body.contains("-601") && body.contains("authentication required"),
        "{body}"
    );
    assert_eq!(present(), 3, "remove_all without a token removed objects");
    let wrong = [("Authorization", "Bearer 5f0c8a6e1d2b4c3a9e8f7d6c5b4a3929")];
    let (status, body) = http_with_headers("POST", master.metrics, remove_all, &wrong, b"");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("wrong token"), "{body}");
    let basic = [("Authorization", "Basic dXNlcjpwYXNz")];
    let (status, _) = http_with_headers("POST", master.metrics, remove_all, &basic, b"");
    assert_eq!(status, 401);
    assert_eq!(
        present(),
        3,
        "remove_all with a wrong token removed objects"
    );
    let right = [("Authorization", bearer.as_str())];
    let (status, body) = http_with_headers("POST", master.metrics, remove_all, &right, b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"removed_count\":3"), "{body}");
    assert_eq!(present(), 0);

    // Monitoring stays open; keys, descriptors and the metadata store need the token.
    for path in ["/metrics", "/metrics/summary", "/health", "/role"] {
        assert_eq!(http("GET", master.metrics, path, b"").0, 200, "{path}");
    }
    let (_, metrics) = http("GET", master.metrics, "/metrics", b"");
    assert!(
        metrics.contains("master_rpc_auth_failures_total"),
        "{metrics}"
    );
    for path in ["/get_all_keys", "/query_key?key=k0", "/get_segments_detail"] {
        assert_eq!(http("GET", master.metrics, path, b"").0, 401, "{path}");
        let (status, _) = http_with_headers("GET", master.metrics, path, &right, b"");
        assert_ne!(status, 401, "{path} with the token");
    }
    let (status, _) = http(
        "PUT",
        master.metrics,
        "/api/v1/tenant_quotas?tenant_id=t&quota_bytes=1",
        b"",
    );
    assert_eq!(status, 401);
    let metadata = master.metadata.unwrap();
    assert_eq!(http("PUT", metadata, "/metadata?key=a", b"v").0, 401);
    assert_eq!(http("GET", metadata, "/health", b"").0, 200);
    let (status, _) = http_with_headers("PUT", metadata, "/metadata?key=a", &right, b"v");
    assert_eq!(status, 200);
    rt.block_on(member.close()).unwrap();
}

#[test]
fn a_cluster_with_a_token_serves_members_and_refuses_strangers() {
    let scratch = Scratch::new("cluster");
    let token_flag = format!("--auth_token_file={}", scratch.token_file());
    let master = MasterProcess::start(&[&token_flag]);
    let node = StoreNode::start(
        &master.rpc.to_string(),
        "64MiB",
        &["--auth_token_file", &scratch.token_file()],
    );
    let master_addr = master.rpc.to_string();
    let value: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let file = scratch.file("value", &value);

    // The verbs with the token (the variable, then the file) put and get over TCP and shm.
    let with_env = [("MC_AUTH_TOKEN", SECRET)];
    let out = verb(&["put", "key", &file, "--master", &master_addr], &with_env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let with_file = [("MC_AUTH_TOKEN_FILE", scratch.token_file())];
    let with_file: Vec<(&str, &str)> = with_file.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for transport in ["tcp", "shm"] {
        let out = verb(
            &[
                "get",
                "key",
                "--master",
                &master_addr,
                "--transport",
                transport,
            ],
            &with_file,
        );
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == value, "{transport}: the bytes differ");
    }

    // Without the token, or with a wrong one, the master refuses the client.
    for env in [vec![], vec![("MC_AUTH_TOKEN", "0123456789abcdef-wrong")]] {
        let out = verb(&["get", "key", "--master", &master_addr], &env);
        assert!(!out.status.success(), "{env:?}: a stranger read the key");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("ILLEGAL_CLIENT"), "{env:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    let rt = runtime();
    let refused = rt.block_on(client(master.rpc, None)).unwrap_err();
    assert!(refused.contains("ILLEGAL_CLIENT"), "{refused}");

    // A member sees the node's endpoint with the segment's capability in the descriptor.
    let member = rt.block_on(client(master.rpc, Some(token()))).unwrap();
    assert_eq!(rt.block_on(member.get("key")).unwrap(), value);
    let replicas = rt.block_on(member.get_replica_desc("key")).unwrap();
    let endpoint = match &replicas[0].kind {
        ReplicaKind::Memory(memory) => memory.transport_endpoint.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(endpoint.contains("&cap="), "{endpoint}");
    rt.block_on(member.close()).unwrap();

    // A stranger on the node's data port guessing segment ids gets ILLEGAL_CLIENT, no byte.
    let data_port = Endpoint::parse(&node.endpoint).unwrap().resolve().unwrap()[0];
    let mut stream = TcpStream::connect(data_port).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    for guess in 1..=8u64 {
        let read = Header::request(Kind::ReadRequest, guess, guess, 0, 4096);
        stream.write_all(&read.encode()).unwrap();
        let mut raw = [0u8; HEADER_BYTES];
        stream.read_exact(&mut raw).unwrap();
        let answer = Header::decode(&raw).unwrap();
        assert_eq!(answer.status, ErrorCode::ILLEGAL_CLIENT, "segment {guess}");
        assert_eq!(answer.payload_bytes(), 0);
    }
}

/// Starts `mooncake ARGS` and returns its stderr once it exited (or after 20 s, killed).
fn stderr_of(args: &[&str]) -> String {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("MC_AUTH_TOKEN")
        .env_remove("MC_AUTH_TOKEN_FILE")
        .env("MOONCAKE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut text = String::new();
    let _ = err.read_to_string(&mut text);
    text
}

/// 192.0.2.1 (TEST-NET-1) is on no interface: the bind fails, after the warning, so nothing
/// ever listens on a public address during the test.
#[test]
fn a_non_loopback_bind_without_a_token_prints_one_warning_line() {
    let scratch = Scratch::new("warning");
    let master = [
        "master",
        "--rpc_address=192.0.2.1",
        "--port=0",
        "--metrics_port=0",
    ];
    let stderr = stderr_of(&master);
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("without --auth_token_file"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("rpc 192.0.2.1:0"), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");

    let token_flag = format!("--auth_token_file={}", scratch.token_file());
    let mut with_token = master.to_vec();
    with_token.push(&token_flag);
    let stderr = stderr_of(&with_token);
    assert!(!stderr.contains("without --auth_token_file"), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");

    // The default binds are loopback: no warning.
    let loopback = MasterProcess::start_with_stderr(&[], Stdio::piped());
    let mut loopback = loopback;
    let mut err = loopback.child.stderr.take().unwrap();
    assert!(loopback.terminate(Duration::from_secs(20)).is_some());
    let mut text = String::new();
    let _ = err.read_to_string(&mut text);
    assert!(!text.contains("without --auth_token_file"), "{text}");

    // A store node asked to serve its memory on a public address without a token warns too.
    let stderr = stderr_of(&[
        "store",
        "--master",
        "127.0.0.1:1",
        "--segment-size",
        "16MiB",
        "--host",
        "192.0.2.1",
    ]);
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("data port binds 192.0.2.1 without a token"))
        .count();
    assert_eq!(warnings, 1, "{stderr}");
}
