//! The real `mooncake master` binary on 127.0.0.1 with free ports, driven by `MasterClient` over
//! TCP, by raw sockets sending malformed input, and by HTTP; stopped with SIGTERM.
#![allow(clippy::unwrap_used)]

mod common;

use common::{http, MasterProcess};
use mooncake_client::{MasterClient, MasterError};
use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaKind, ReplicateConfig, Segment, SegmentId,
    SegmentStatus,
};
use mooncake_proto::methods as m;
use mooncake_proto::{FrameHeader, FrameKind, Method, HEADER_BYTES};
use mooncake_rpc::ClientConfig;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn segment(name: &str, base: u64, size: u64) -> Segment {
    Segment {
        id: SegmentId::random(),
        name: name.to_string(),
        base,
        size,
        te_endpoint: format!("tcp://{name}"),
        protocol: "tcp".to_string(),
        host_id: "host-a".to_string(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn client_of(master: &MasterProcess) -> MasterClient {
    MasterClient::new(
        master.rpc,
        ClientConfig {
            call_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        },
    )
}

#[test]
fn lifecycle_over_tcp_then_clean_sigterm() {
    let master = MasterProcess::start(&[]);
    let rt = runtime();
    let mc = client_of(&master);
    let me = ClientId::random();
    rt.block_on(async {
        assert!(mc.service_ready().await.unwrap().starts_with("mooncake-rs"));
        let seg_a = segment("127.0.0.1:7001", 0x1000_0000, 64 << 20);
        let seg_b = segment("127.0.0.1:7002", 0x2000_0000, 64 << 20);
        mc.mount_segment(seg_a.clone(), me).await.unwrap();
        mc.mount_segment(seg_b.clone(), me).await.unwrap();
        // Idempotent mount.
        mc.mount_segment(seg_a.clone(), me).await.unwrap();

        let config = ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        };
        let replicas = mc.put_start(me, "k1", 4096, &config, "").await.unwrap();
        assert_eq!(replicas.len(), 2);
        // Not readable before PutEnd.
        assert!(!mc.exist_key("k1", "").await.unwrap());
        let err = mc.get_replica_list("k1", "").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::REPLICA_IS_NOT_READY);
        mc.put_end(me, ObjectMeta::new("k1"), "").await.unwrap();
        assert!(mc.exist_key("k1", "").await.unwrap());
        let got = mc.get_replica_list("k1", "").await.unwrap();
        assert_eq!(got.replicas.len(), 2);
        assert_eq!(got.lease_ttl_ms, 10_000);
        for r in &got.replicas {
            let ReplicaKind::Memory(mem) = &r.kind else {
                panic!("not memory: {r:?}")
            };
            assert_eq!(mem.size, 4096);
        }
        // Second put of a live key.
        let again = mc.put_start(me, "k1", 4096, &config, "").await.unwrap_err();
        assert!(matches!(
            again,
            MasterError::Master(ErrorCode::OBJECT_ALREADY_EXISTS)
        ));

        // Batches, in input order.
        let keys: Vec<String> = (0..50).map(|i| format!("b{i}")).collect();
        let lens = vec![1024u64; keys.len()];
        let started = mc
            .call(&m::BatchPutStart {
                client: me,
                keys: keys.clone(),
                value_lens: lens,
                config: ReplicateConfig::default(),
                tenant: String::new(),
            })
            .await
            .unwrap();
        assert!(started.iter().all(|r| r.is_ok()));
        let metas: Vec<ObjectMeta> = keys
            .iter()
            .take(40)
            .map(|k| ObjectMeta::new(k.clone()))
            .collect();
        let ended = mc
            .call(&m::BatchPutEnd {
                client: me,
                metas,
                replica_type: mooncake_common::ReplicaType::ALL,
                tenant: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(ended.len(), 40);
        let mut probe = keys.clone();
        probe.push("missing".into());
        let exist = mc.batch_exist_key(probe, "").await.unwrap();
        assert_eq!(exist.len(), 51);
        assert!(exist[..40].iter().all(|r| *r == Ok(true)));
        assert!(exist[40..50].iter().all(|r| *r == Ok(false)), "{exist:?}");
        assert_eq!(exist[50], Ok(false));
        let lists = mc
            .batch_get_replica_list(vec!["b0".into(), "nope".into()], "")
            .await
            .unwrap();
        assert!(lists[0].is_ok());
        assert_eq!(lists[1].as_ref().unwrap_err(), &ErrorCode::OBJECT_NOT_FOUND);

        // Leased objects resist non-force removal; force works.
        let err = mc.remove("k1", false, "").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::OBJECT_HAS_LEASE);
        mc.remove("k1", true, "").await.unwrap();
        assert!(!mc.exist_key("k1", "").await.unwrap());
        let err = mc.remove("k1", true, "").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::OBJECT_NOT_FOUND);

        // Segment status and bad input.
        let status = mc
            .call(&m::QuerySegmentStatus {
                segment_name: seg_a.name.clone(),
            })
            .await
            .unwrap();
        assert_eq!(status, SegmentStatus::OK);
        let err = mc
            .put_start(me, "", 10, &ReplicateConfig::default(), "")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::INVALID_PARAMS);
        let long_key = "x".repeat(5000);
        let err = mc.exist_key(&long_key, "").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::INVALID_KEY);
        let err = mc
            .call(&m::RemoveByRegex {
                regex: "(".into(),
                force: true,
                tenant: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::INVALID_PARAMS);
        let removed = mc
            .call(&m::RemoveByRegex {
                regex: "^b1".into(),
                force: true,
                tenant: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(
            removed, 11,
            "b1 and b10..b19 minus the unfinished ones? got {removed}"
        );
    });
    let status = master
        .terminate(Duration::from_secs(10))
        .expect("master did not exit on SIGTERM");
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn malformed_input_closes_one_connection_and_memory_stays_bounded() {
    let master = MasterProcess::start(&["--rpc_max_connections=1024"]);
    let rt = runtime();
    let mc = client_of(&master);
    rt.block_on(async { mc.service_ready().await.unwrap() });
    let rss_before = master.rss_kib();

    let read_some = |stream: &mut TcpStream| {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    };
    // Oversized length prefix: an error frame (BUFFER_OVERFLOW), then the connection closes.
    let mut raw = TcpStream::connect(master.rpc).unwrap();
    raw.write_all(&[0xff, 0xff, 0xff, 0xff]).unwrap();
    let got = read_some(&mut raw);
    assert!(
        got.len() >= 20 && got[5] == 2,
        "expected an error frame, got {got:?}"
    );
    assert_eq!(
        i32::from_le_bytes([got[16], got[17], got[18], got[19]]),
        ErrorCode::BUFFER_OVERFLOW.as_i32()
    );

    // Unknown method id and garbage body: an error frame for each (request ids 9 and 10), and
    // the connection stays usable: a valid request after them is answered on the same stream.
    let frame = |method: u16, request_id: u64, body: &[u8]| {
        let mut out = bytes::BytesMut::new();
        let header = FrameHeader {
            kind: FrameKind::Request,
            method,
            request_id,
        };
        mooncake_proto::encode_frame(&mut out, header, body);
        out.to_vec()
    };
    let exist = mooncake_proto::encode(&m::ExistKey {
        key: "nobody".into(),
        tenant: String::new(),
    })
    .unwrap();
    let mut raw = TcpStream::connect(master.rpc).unwrap();
    raw.write_all(&frame(999, 9, &[])).unwrap();
    raw.write_all(&frame(m::ExistKey::ID, 10, &[0xff, 0xff, 0xff]))
        .unwrap();
    raw.write_all(&frame(m::ExistKey::ID, 11, &exist)).unwrap();
    raw.shutdown(std::net::Shutdown::Write).unwrap();
    let got = read_some(&mut raw);
    let frames = split_frames(&got);
    let seen: Vec<(FrameKind, u64)> = frames.iter().map(|f| (f.0.kind, f.0.request_id)).collect();
    assert_eq!(
        seen,
        [
            (FrameKind::Error, 9),
            (FrameKind::Error, 10),
            (FrameKind::Response, 11)
        ],
        "two error frames, then the answer to the valid request"
    );
    assert_ne!(
        mooncake_proto::decode_error_body(&frames[1].1).0,
        ErrorCode::OK,
        "the garbage body is refused"
    );

    // Truncated frame, then disconnect mid-frame.
    let mut raw = TcpStream::connect(master.rpc).unwrap();
    let whole = frame(m::ExistKey::ID, 12, &[0u8; 184]);
    raw.write_all(&whole[..9]).unwrap();
    drop(raw);

    // 2,000 idle connections against a limit of 1,024 (256 per address): each one over the
    // limits pushes out an older idle one (docs/security.md), the master keeps serving, and its
    // memory stays bounded.
    let mut idle = Vec::new();
    for _ in 0..2000 {
        match TcpStream::connect(master.rpc) {
            Ok(stream) => idle.push(stream),
            Err(error) => panic!("connect failed: {error}"),
        }
    }
    // The accept loop works through the backlog at its own pace: poll /metrics (bounded) until
    // the evictions are counted, instead of assuming a fixed delay is enough.
    let metric = |body: &str, name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (evicted, open) = loop {
        let (status, body) = http("GET", master.metrics, "/metrics", b"");
        assert_eq!(status, 200);
        let evicted = metric(&body, "master_rpc_connections_evicted_total ");
        let open = metric(&body, "master_rpc_connections_open ");
        if evicted >= 900.0 || std::time::Instant::now() >= deadline {
            break (evicted, open);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(evicted >= 900.0, "evicted only {evicted} after 60 s");
    assert!(open <= 1024.0, "{open} connections open");
    drop(idle);
    rt.block_on(async {
        let fresh = client_of(&master);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match fresh.service_ready().await {
                Ok(_) => break,
                Err(e) => assert!(
                    std::time::Instant::now() < deadline,
                    "master stopped serving: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(mc.exist_key("whatever", "").await.is_ok());
    });
    let rss_after = master.rss_kib();
    assert!(
        rss_after < rss_before + 64 * 1024,
        "rss grew from {rss_before} KiB to {rss_after} KiB"
    );
}

#[test]
fn http_endpoints_answer_with_upstreams_shapes_and_codes() {
    let master = MasterProcess::start(&["--enable_http_metadata_server"]);
    let rt = runtime();
    let mc = client_of(&master);
    let me = ClientId::random();
    let seg = segment("127.0.0.1:7100", 0x4000_0000, 32 << 20);
    rt.block_on(async {
        mc.mount_segment(seg.clone(), me).await.unwrap();
        mc.put_start(me, "probe/key1", 4096, &ReplicateConfig::default(), "")
            .await
            .unwrap();
        mc.put_end(me, ObjectMeta::new("probe/key1"), "")
            .await
            .unwrap();
        mc.put_start(me, "probe/pending", 4096, &ReplicateConfig::default(), "")
            .await
            .unwrap();
    });
    let addr = master.metrics;

    let (status, body) = http("GET", addr, "/health", b"");
    assert_eq!(status, 200);
    assert!(
        body.contains("\"status\":\"ok\"") && body.contains("\"role\":\"leader\""),
        "{body}"
    );
    assert_eq!(http("GET", addr, "/role", b"").1, "leader");

    let (status, body) = http("GET", addr, "/metrics", b"");
    assert_eq!(status, 200);
    assert!(body.contains("master_key_count 2"), "{body}");
    assert!(body.contains(&format!("master_total_capacity_bytes {}", 32u64 << 20)));
    assert!(body.contains("master_put_start_requests_total 2"));
    assert!(body.contains("master_put_end_requests_total 1"));

    let (status, body) = http("GET", addr, "/metrics/summary", b"");
    assert_eq!(status, 200);
    assert!(body.contains("Keys: 2"), "{body}");

    let (status, body) = http("GET", addr, "/query_key?key=probe/key1", b"");
    assert_eq!(status, 200);
    assert!(
        body.contains("\"size_\":4096") && body.contains("\"success\":true"),
        "{body}"
    );
    let (status, body) = http("GET", addr, "/query_key?key=nokey", b"");
    assert_eq!(status, 404);
    assert!(body.contains("-704"), "{body}");
    // /query_key grants no lease: a plain remove still works.
    rt.block_on(async { mc.remove("probe/key1", false, "").await.unwrap() });
    rt.block_on(async {
        mc.put_start(me, "probe/key1", 4096, &ReplicateConfig::default(), "")
            .await
            .unwrap();
        mc.put_end(me, ObjectMeta::new("probe/key1"), "")
            .await
            .unwrap();
    });

    let (status, body) = http("GET", addr, "/batch_query_keys?keys=probe/key1,nokey", b"");
    assert_eq!(status, 200);
    assert!(
        body.contains("\"ok\":true") && body.contains("OBJECT_NOT_FOUND"),
        "{body}"
    );

    let (status, body) = http("GET", addr, "/get_all_keys", b"");
    assert_eq!(status, 200);
    assert_eq!(
        body.lines().collect::<Vec<_>>(),
        vec!["probe/key1"],
        "pending keys are not listed"
    );

    let (status, body) = http("GET", addr, "/get_all_segments", b"");
    assert_eq!((status, body.trim()), (200, "127.0.0.1:7100"));

    let (status, body) = http("GET", addr, "/get_segments_detail", b"");
    assert_eq!(status, 200);
    assert!(
        body.contains("\"total_segments\":1") && body.contains("\"allocator_used_bytes\":8192"),
        "{body}"
    );

    let (status, body) = http("GET", addr, "/query_segment?segment=127.0.0.1:7100", b"");
    assert_eq!(status, 200);
    assert!(body.contains("Used(bytes): 8192"), "{body}");
    assert_eq!(http("GET", addr, "/query_segment?segment=nope", b"").0, 404);

    let (status, body) = http(
        "GET",
        addr,
        "/api/v1/segments/status?segment=127.0.0.1:7100",
        b"",
    );
    assert_eq!(status, 200);
    assert!(body.contains("\"status_name\":\"OK\""), "{body}");
    assert_eq!(http("GET", addr, "/api/v1/segments/status", b"").0, 400);

    let (status, body) = http("GET", addr, "/api/v1/tenant_quotas", b"");
    assert_eq!(status, 409, "multi-tenancy is off: {body}");
    assert!(body.contains("-1011"));

    let (status, body) = http("POST", addr, "/api/v1/remove_all?force=true", b"");
    assert_eq!(status, 200);
    assert!(body.contains("\"removed_count\":1"), "{body}");
    assert_eq!(
        http("POST", addr, "/api/v1/remove_all?force=maybe", b"").0,
        400
    );
    assert_eq!(http("GET", addr, "/no_such_page", b"").0, 404);

    // The metadata store.
    let meta = master.metadata.expect("metadata server address");
    assert_eq!(http("GET", meta, "/metadata?key=a", b"").0, 404);
    assert_eq!(http("PUT", meta, "/metadata?key=a", b"{\"x\":1}").0, 200);
    assert_eq!(
        http("GET", meta, "/metadata?key=a", b""),
        (200, "{\"x\":1}".to_string())
    );
    assert_eq!(http("DELETE", meta, "/metadata?key=a", b"").0, 200);
    assert_eq!(http("GET", meta, "/metadata?key=a", b"").0, 404);
    assert_eq!(http("GET", meta, "/metadata", b"").0, 400);
}

#[test]
fn invalid_flags_are_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mooncake"))
        .args(["master", "--eviction-ratio=1.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("eviction_ratio"), "{stderr}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mooncake"))
        .args(["master", "--no_such_flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_silent_client_expires_then_remounts_after_need_remount() {
    let master = MasterProcess::start(&["--client_ttl=1"]);
    let rt = runtime();
    let mc = client_of(&master);
    let dead = ClientId::random();
    let alive = ClientId::random();
    let seg_dead = segment("127.0.0.1:7201", 0x1000_0000, 8 << 20);
    let seg_alive = segment("127.0.0.1:7202", 0x2000_0000, 8 << 20);
    rt.block_on(async {
        mc.mount_segment(seg_dead.clone(), dead).await.unwrap();
        mc.mount_segment(seg_alive.clone(), alive).await.unwrap();
        // ReMount makes a client OK (upstream: mount alone does not).
        mc.remount_segments(vec![seg_alive.clone()], alive)
            .await
            .unwrap();
        let prefer = |name: &str| ReplicateConfig {
            preferred_segments: vec![name.to_string()],
            ..ReplicateConfig::default()
        };
        for (key, seg) in [("on-dead", &seg_dead), ("on-alive", &seg_alive)] {
            mc.put_start(alive, key, 4096, &prefer(&seg.name), "")
                .await
                .unwrap();
            mc.put_end(alive, ObjectMeta::new(key), "").await.unwrap();
        }
        // `alive` keeps pinging, `dead` is silent: after the TTL its segment and objects go.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            assert_eq!(
                mc.ping(alive).await.unwrap().client_status,
                mooncake_common::ClientStatus::OK
            );
            if !mc.exist_key("on-dead", "").await.unwrap() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "dead client never expired"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            mc.get_replica_list("on-dead", "").await.unwrap_err().code(),
            ErrorCode::OBJECT_NOT_FOUND
        );
        assert!(
            mc.exist_key("on-alive", "").await.unwrap(),
            "other clients are unaffected"
        );
        // The dead client comes back: NEED_REMOUNT, then ReMount makes it OK again.
        let status = mc.ping(dead).await.unwrap().client_status;
        assert_eq!(status, mooncake_common::ClientStatus::NEED_REMOUNT);
        mc.remount_segments(vec![seg_dead.clone()], dead)
            .await
            .unwrap();
        assert_eq!(
            mc.ping(dead).await.unwrap().client_status,
            mooncake_common::ClientStatus::OK
        );
        let status = mc
            .call(&m::QuerySegmentStatus {
                segment_name: seg_dead.name.clone(),
            })
            .await
            .unwrap();
        assert_eq!(status, SegmentStatus::OK);
    });
}

#[test]
fn eviction_makes_room_in_a_full_store() {
    // The background cycle is off (it triggers only above a watermark of 1.0, or when flagged
    // with a ratio above 0), so every eviction here is a PutStart's own: the counts below do not
    // depend on how fast this writer runs against the 10 ms cycle. The writer sends no
    // heartbeat: a client TTL of 10 minutes keeps a slow run (a loaded machine) from expiring it
    // and unmounting its segment mid-test.
    let master = MasterProcess::start(&[
        "--eviction_high_watermark_ratio=1.0",
        "--eviction_ratio=0",
        "--client_ttl=600",
    ]);
    let rt = runtime();
    let mc = client_of(&master);
    let me = ClientId::random();
    rt.block_on(async {
        mc.mount_segment(segment("127.0.0.1:7301", 0x1000_0000, 1 << 20), me)
            .await
            .unwrap();
        mc.remount_segments(vec![], me).await.unwrap();
        // 8 MiB of 4 KiB objects into a 1 MiB store.
        // A put that finds the store full evicts inline the oldest idle object and gets in
        // (with --put_start_evict_budget=0 it would be refused with NO_AVAILABLE_HANDLE, and
        // with the background cycle off here, stay refused). Every key must get in.
        let mut refused = 0;
        for i in 0..2048 {
            let key = format!("evict-{i}");
            let mut attempts = 0;
            loop {
                match mc
                    .put_start(me, &key, 4096, &ReplicateConfig::default(), "")
                    .await
                {
                    Ok(_) => {
                        mc.put_end(me, ObjectMeta::new(key.clone()), "")
                            .await
                            .unwrap();
                        break;
                    }
                    Err(e) => {
                        assert_eq!(e.code(), ErrorCode::NO_AVAILABLE_HANDLE);
                        refused += 1;
                        attempts += 1;
                        assert!(attempts < 200, "{key}: the store stayed full for 2 s");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
        // Every object is idle once written: inline eviction always finds room.
        assert_eq!(refused, 0, "{refused} refusals for 2048 puts");
        // The newest objects are there, the oldest were evicted first.
        assert!(mc.exist_key("evict-2047", "").await.unwrap());
        assert!(!mc.exist_key("evict-0", "").await.unwrap());
    });
    let (status, body) = http("GET", master.metrics, "/metrics", b"");
    assert_eq!(status, 200);
    let count: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("master_key_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(count <= 256.0, "{count} keys of 4 KiB in a 1 MiB store");
    let evicted: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("master_evicted_key_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    let inline: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("master_put_start_inline_evictions_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(inline > 0.0, "no inline eviction counted");
    assert!(
        evicted >= 1500.0,
        "only {evicted} evictions counted: {}",
        body.lines()
            .filter(|l| l.contains("evict"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn tenant_quotas_over_http_with_a_policy_file() {
    let dir = std::env::temp_dir().join(format!("mc-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("tenants.yaml");
    std::fs::write(
        &policy,
        "version: 1\ntenants:\n  - name: alpha\n    quota: 1MiB\n",
    )
    .unwrap();
    let uri = format!("--tenant_quota_connector_uri={}", policy.display());
    let master = MasterProcess::start(&["--enable_multi_tenants", &uri]);
    let rt = runtime();
    let mc = client_of(&master);
    let me = ClientId::random();
    rt.block_on(async {
        mc.mount_segment(segment("127.0.0.1:7401", 0x1000_0000, 8 << 20), me)
            .await
            .unwrap();
        mc.put_start(me, "k", 4096, &ReplicateConfig::default(), "alpha")
            .await
            .unwrap();
        mc.put_end(me, ObjectMeta::new("k"), "alpha").await.unwrap();
        let err = mc
            .put_start(me, "k", 4096, &ReplicateConfig::default(), "nobody")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::TENANT_NOT_REGISTERED);
        // A read lease keeps "k" out of the tenant-scoped eviction the over-quota put triggers.
        assert!(mc.exist_key("k", "alpha").await.unwrap());
        let err = mc
            .put_start(me, "big", 2 << 20, &ReplicateConfig::default(), "alpha")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::TENANT_QUOTA_EXCEEDED);
        // 4 KiB + 512 KiB + 768 KiB is over the 1 MiB quota: the tenant-scoped eviction takes
        // "m1" (the leased "k" stays) and the put goes through.
        for (key, len) in [("m1", 512u64 << 10), ("m2", 768 << 10)] {
            mc.put_start(me, key, len, &ReplicateConfig::default(), "alpha")
                .await
                .unwrap();
            mc.put_end(me, ObjectMeta::new(key), "alpha").await.unwrap();
        }
    });
    let addr = master.metrics;
    // Upstream's family counts the refusal under the tenant's name.
    let (status, body) = http("GET", addr, "/metrics", b"");
    assert_eq!(status, 200);
    assert!(
        body.contains("\n# TYPE mooncake_tenant_quota_reject_total counter\n")
            && body.contains(
                "\nmooncake_tenant_quota_reject_total{tenant_id=\"alpha\",reason=\"quota_exceeded\"} 1\n"
            ),
        "{body}"
    );
    assert!(
        body.contains("\nmooncake_tenant_evict_bytes_total{tenant_id=\"alpha\"} 524288\n"),
        "{body}"
    );
    let (status, body) = http("GET", addr, "/api/v1/tenant_quotas", b"");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"tenant_id\":\"alpha\"")
            && body.contains(&format!("\"charged_bytes\":{}", 4096 + (768 << 10))),
        "{body}"
    );
    let (status, body) = http(
        "PUT",
        addr,
        "/api/v1/tenant_quotas?tenant_id=beta&quota_bytes=2MiB",
        b"",
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"requested_quota_bytes\":2097152"), "{body}");
    assert!(
        std::fs::read_to_string(&policy).unwrap().contains("beta"),
        "persisted to the policy file"
    );
    assert_eq!(
        http("PUT", addr, "/api/v1/tenant_quotas?tenant_id=beta", b"").0,
        400
    );
    assert_eq!(
        http("GET", addr, "/api/v1/tenant_quotas?tenant_id=ghost", b"").0,
        404
    );
    let (status, body) = http("DELETE", addr, "/api/v1/tenant_quotas?tenant_id=alpha", b"");
    assert_eq!(status, 409, "alpha still holds an object: {body}");
    assert_eq!(
        http("DELETE", addr, "/api/v1/tenant_quotas?tenant_id=beta", b"").0,
        200
    );
    drop(master);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The frames in `bytes` (a whole response stream): each header with its body.
fn split_frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    let decoder = mooncake_proto::FrameDecoder::default();
    let mut frames = Vec::new();
    while let Some((header, total)) = decoder.peek_header(bytes).expect("a well-formed frame") {
        assert!(bytes.len() >= total, "truncated frame in {bytes:?}");
        frames.push((header, bytes[HEADER_BYTES..total].to_vec()));
        bytes = &bytes[total..];
    }
    assert!(bytes.is_empty(), "trailing bytes {bytes:?}");
    frames
}
