//! Drop-in for upstream `mooncake_master` users, on the real binary (127.0.0.1, free ports):
//! every flag upstream's `--help` lists (fixtures/upstream_master_flags.tsv) at its default,
//! given in a YAML file, a JSON file and on the command line, and the master serves; files shaped
//! like upstream's shipped configs load; a flag asking for a feature not built stops the start;
//! `/metrics` carries upstream's family names with their types.
#![allow(clippy::unwrap_used)]

mod common;

use common::{http, MasterProcess};
use mooncake_client::MasterClient;
use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaKind, ReplicaType, ReplicateConfig, Segment, SegmentId,
    SoftPinAction,
};
use mooncake_proto::methods as m;
use mooncake_rpc::ClientConfig;
use mooncake_server::config::{find_flag, Origin, FLAGS};
use mooncake_server::metrics::{UpstreamFamily, UPSTREAM_DASHBOARD_FAMILIES, UPSTREAM_FAMILIES};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// One line of the fixture: name, gflags type, default.
struct UpstreamFlag {
    name: String,
    ty: String,
    default: String,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn upstream_flags() -> Vec<UpstreamFlag> {
    let text = std::fs::read_to_string(fixture("upstream_master_flags.tsv")).unwrap();
    let flags: Vec<UpstreamFlag> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut cols = l.splitn(3, '\t');
            let mut next = || cols.next().unwrap_or_default().to_string();
            UpstreamFlag {
                name: next(),
                ty: next(),
                default: next(),
            }
        })
        .collect();
    assert_eq!(flags.len(), 134, "the fixture lists upstream's 134 flags");
    flags
}

/// The loopback flags every test master gets, last on the command line so they win.
const LOOPBACK: &[&str] = &[
    "--rpc_address=127.0.0.1",
    "--port=0",
    "--metrics_host=127.0.0.1",
    "--metrics_port=0",
    "--http_metadata_server_host=127.0.0.1",
    "--http_metadata_server_port=0",
];

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mc-dropin-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn is_number(ty: &str) -> bool {
    ty != "string" && ty != "bool"
}

fn yaml_file(flags: &[UpstreamFlag]) -> String {
    let mut out = String::from("# every upstream flag at its default\n");
    for f in flags {
        if is_number(&f.ty) || f.ty == "bool" {
            out.push_str(&format!("{}: {}\n", f.name, f.default));
        } else {
            out.push_str(&format!("{}: {}\n", f.name, serde_json::json!(f.default)));
        }
    }
    out
}

fn json_file(flags: &[UpstreamFlag]) -> String {
    let mut map = serde_json::Map::new();
    for f in flags {
        let value = match f.ty.as_str() {
            "string" => serde_json::json!(f.default),
            "bool" => serde_json::json!(f.default == "true"),
            _ => serde_json::from_str(&f.default).unwrap(),
        };
        map.insert(f.name.clone(), value);
    }
    serde_json::to_string_pretty(&serde_json::Value::Object(map)).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

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

fn client_of(master: &MasterProcess) -> MasterClient {
    MasterClient::new(
        master.rpc,
        ClientConfig {
            call_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        },
    )
}

/// `/health` answers and a put can be read back.
fn assert_serves(master: &MasterProcess) {
    let (status, body) = http("GET", master.metrics, "/health", b"");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"cluster_id\":\"mooncake_cluster\""),
        "{body}"
    );
    let rt = runtime();
    let mc = client_of(master);
    let me = ClientId::random();
    rt.block_on(async {
        mc.mount_segment(segment("127.0.0.1:7401", 0x1000_0000, 16 << 20), me)
            .await
            .unwrap();
        let replicas = mc
            .put_start(me, "dropin", 4096, &ReplicateConfig::default(), "")
            .await
            .unwrap();
        assert_eq!(replicas.len(), 1);
        mc.put_end(me, ObjectMeta::new("dropin"), "").await.unwrap();
        let got = mc.get_replica_list("dropin", "").await.unwrap();
        let ReplicaKind::Memory(mem) = &got.replicas[0].kind else {
            panic!("not a memory replica: {got:?}")
        };
        assert_eq!(mem.size, 4096);
    });
}

/// Starts the master with `args`, stderr into `dir`; returns it and its stderr so far.
fn start_logged(dir: &TempDir, args: &[&str]) -> (MasterProcess, String) {
    let log = dir.path("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let master = MasterProcess::start_with_stderr(args, Stdio::from(file));
    // The warning is logged before the "listening" line that start_with_stderr waited for.
    let stderr = std::fs::read_to_string(&log).unwrap();
    (master, stderr)
}

/// The start-up warning names flags of features not built, once, on one line.
fn assert_one_warning_line(stderr: &str) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("flags accepted without effect"))
        .collect();
    assert_eq!(lines.len(), 1, "one warning line expected in:\n{stderr}");
    for name in [
        "enable_kv_events",
        "snapshot_backup_dir",
        "root_fs_dir",
        "logtostderr",
    ] {
        assert!(lines[0].contains(name), "{name} not named in {}", lines[0]);
    }
}

/// Upstream flags whose default we change on purpose: every listener binds loopback unless
/// told otherwise (docs/security.md); upstream binds 0.0.0.0.
const DELIBERATE_DEFAULTS: &[(&str, &str, &str)] = &[
    ("rpc_address", "0.0.0.0", "127.0.0.1"),
    ("metrics_host", "0.0.0.0", "127.0.0.1"),
    ("http_metadata_server_host", "0.0.0.0", "127.0.0.1"),
];

#[test]
fn the_flag_table_has_every_upstream_flag_with_its_type_and_default() {
    for f in upstream_flags() {
        let spec = find_flag(&f.name).unwrap_or_else(|| panic!("--{} is not in the table", f.name));
        assert_eq!(spec.name, f.name);
        assert_eq!(spec.ty.name(), f.ty, "type of --{}", f.name);
        assert_ne!(spec.origin, Origin::Ours, "--{} is upstream's", f.name);
        if let Some((_, theirs, ours)) = DELIBERATE_DEFAULTS.iter().find(|d| d.0 == f.name) {
            assert_eq!(f.default, *theirs, "upstream's default of --{}", f.name);
            assert_eq!(spec.default_text(), *ours, "our default of --{}", f.name);
            continue;
        }
        let same_default = match f.ty.as_str() {
            "double" => spec.default_text().parse::<f64>().ok() == f.default.parse::<f64>().ok(),
            _ => spec.default_text() == f.default,
        };
        assert!(
            same_default,
            "default of --{}: ours {:?}, upstream {:?}",
            f.name,
            spec.default_text(),
            f.default
        );
    }
    let upstream: std::collections::BTreeSet<String> =
        upstream_flags().into_iter().map(|f| f.name).collect();
    for spec in FLAGS.iter().filter(|s| s.origin != Origin::Ours) {
        assert!(
            upstream.contains(spec.name),
            "--{} is not upstream's",
            spec.name
        );
    }
}

#[test]
fn master_serves_with_every_upstream_flag_at_its_default_in_a_yaml_file() {
    let dir = TempDir::new("yaml");
    let path = dir.path("master.yaml");
    std::fs::write(&path, yaml_file(&upstream_flags())).unwrap();
    let config = format!("--config_path={}", path.display());
    let (master, stderr) = start_logged(&dir, &[&config]);
    assert_serves(&master);
    assert_one_warning_line(&stderr);
}

#[test]
fn master_serves_with_every_upstream_flag_at_its_default_in_a_json_file() {
    let dir = TempDir::new("json");
    let path = dir.path("master.json");
    std::fs::write(&path, json_file(&upstream_flags())).unwrap();
    let config = format!("--config_path={}", path.display());
    let (master, stderr) = start_logged(&dir, &[&config]);
    assert_serves(&master);
    assert_one_warning_line(&stderr);
}

#[test]
fn master_serves_with_every_upstream_flag_at_its_default_on_the_command_line() {
    let dir = TempDir::new("cmdline");
    let mut args: Vec<String> = upstream_flags()
        .iter()
        .map(|f| format!("--{}={}", f.name, f.default))
        .collect();
    args.extend(LOOPBACK.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (master, stderr) = start_logged(&dir, &args);
    assert_serves(&master);
    assert_one_warning_line(&stderr);
}

#[test]
fn files_shaped_like_upstreams_shipped_configs_load() {
    for name in ["shipped_shape_master.yaml", "shipped_shape_master.json"] {
        let path = fixture(name);
        let args = [
            "mooncake master".to_string(),
            format!("--config_path={}", path.display()),
        ];
        let (config, resolved) =
            mooncake_server::MasterConfig::load(args).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The shipped files' overrides of the code defaults.
        assert_eq!(config.eviction_ratio, 0.1, "{name}");
        assert_eq!(config.eviction_high_watermark_ratio, 1.0, "{name}");
        assert_eq!(config.client_ttl, 60, "{name} (client_live_ttl_sec)");
        assert_eq!(config.rpc_thread_num, 16, "{name}");
        assert_eq!(resolved.rpc_threads, 16, "{name}");
        let notice = resolved.notice.unwrap();
        // etcd_endpoints and enable_ha are honoured (the op-log's etcd, the election), so they
        // are loaded, not listed as inert.
        assert_eq!(config.etcd_endpoints, "http://localhost:2379", "{name}");
        assert!(!config.enable_ha, "{name}");
        assert!(!notice.contains("enable_ha"), "{notice}");
        assert!(!notice.contains("etcd_endpoints"), "{notice}");
        assert!(notice.contains("not flags, ignored: "), "{notice}");
        assert!(notice.contains("client_active_ttl_sec"), "{notice}");
    }
}

#[test]
fn a_flag_asking_for_a_feature_not_built_stops_the_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mooncake"))
        .args(["master", "--enable_kv_events=true"])
        .args(LOOPBACK)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--enable_kv_events=true: not supported by mooncake-rs (KV cache events)"),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mooncake"))
        .args(["master", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for f in upstream_flags() {
        assert!(
            help.contains(&format!("--{} ", f.name)),
            "--help lacks --{}",
            f.name
        );
    }
}

/// Every upstream family in the table that applies is exported with upstream's TYPE; the
/// families of features not built are absent.
fn check_upstream_families(body: &str) {
    let listed = UPSTREAM_FAMILIES.iter().chain(UPSTREAM_DASHBOARD_FAMILIES);
    for (name, kind, status) in listed {
        let exported = body.contains(&format!("\n# TYPE {name} "));
        match status {
            UpstreamFamily::Exported(feature) => assert!(
                body.contains(&format!("\n# TYPE {name} {kind}\n")),
                "{name} ({feature}) is missing or not a {kind}"
            ),
            UpstreamFamily::NotBuilt(why) => assert!(!exported, "{name} is exported ({why})"),
        }
    }
}

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample of {name}"))
}

#[test]
fn metrics_carry_upstreams_family_names_and_types() {
    // No eviction: the allocation failure below flags one, and the eviction loop (every 10 ms)
    // would otherwise take the least recently used object ("small") whenever it runs before the
    // checks that count on it.
    let master = MasterProcess::start(&["--eviction_ratio=0"]);
    let rt = runtime();
    let mc = client_of(&master);
    let me = ClientId::random();
    rt.block_on(async {
        mc.mount_segment(segment("127.0.0.1:7501", 0x1000_0000, 8 << 20), me)
            .await
            .unwrap();
        for (key, len) in [("small", 4096u64), ("large", 1 << 20)] {
            mc.put_start(me, key, len, &ReplicateConfig::default(), "")
                .await
                .unwrap();
            mc.put_end(me, ObjectMeta::new(key), "").await.unwrap();
        }
        let pinned = ReplicateConfig {
            soft_pin_action: SoftPinAction::Enable,
            soft_pin_ttl_ms: Some(600_000),
            ..ReplicateConfig::default()
        };
        mc.put_start(me, "pinned", 4096, &pinned, "").await.unwrap();
        mc.put_end(me, ObjectMeta::new("pinned"), "").await.unwrap();
        // Two replicas asked, one segment: a partial allocation.
        mc.put_start(me, "partial", 4096, &ReplicateConfig::with_replicas(2), "")
            .await
            .unwrap();
        // Larger than the store: an allocation failure.
        let err = mc
            .put_start(me, "huge", 64 << 20, &ReplicateConfig::default(), "")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NO_AVAILABLE_HANDLE);
        let err = mc
            .put_start(me, "small", 4096, &ReplicateConfig::default(), "")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::OBJECT_ALREADY_EXISTS);
        mc.get_replica_list("small", "").await.unwrap();
        mc.get_replica_list("missing", "").await.unwrap_err();
        // One new key, one existing: a partially successful batch.
        let started = mc
            .call(&m::BatchPutStart {
                client: me,
                keys: vec!["b1".into(), "small".into()],
                value_lens: vec![4096, 4096],
                config: ReplicateConfig::default(),
                tenant: String::new(),
            })
            .await
            .unwrap();
        assert!(started[0].is_ok() && started[1].is_err());
        mc.call(&m::BatchPutEnd {
            client: me,
            metas: vec![ObjectMeta::new("b1")],
            replica_type: ReplicaType::ALL,
            tenant: String::new(),
        })
        .await
        .unwrap();
        mc.batch_get_replica_list(vec!["b1".into(), "large".into(), "nope".into()], "")
            .await
            .unwrap();
    });
    let (status, body) = http("GET", master.metrics, "/metrics", b"");
    assert_eq!(status, 200);
    check_upstream_families(&body);
    // Upstream's labels: the per-segment gauges carry the segment's name.
    assert_eq!(
        metric(
            &body,
            "segment_total_capacity_bytes{segment=\"127.0.0.1:7501\"}"
        ),
        (8 << 20) as f64
    );
    assert!(metric(&body, "segment_allocated_bytes{segment=\"127.0.0.1:7501\"}") > 0.0);
    // The values follow the traffic above.
    assert_eq!(metric(&body, "master_soft_pin_key_count"), 1.0);
    assert_eq!(metric(&body, "master_key_count"), 5.0);
    assert_eq!(
        metric(&body, "mem_cache_nums_"),
        4.0,
        "the partial put is unfinished"
    );
    assert_eq!(metric(&body, "master_put_start_alloc_failures_total"), 1.0);
    assert_eq!(
        metric(&body, "master_put_start_partial_allocations_total"),
        1.0
    );
    assert_eq!(
        metric(&body, "master_put_start_object_already_exists_total"),
        1.0
    );
    assert_eq!(
        metric(&body, "master_batch_put_start_object_already_exists_total"),
        1.0
    );
    assert_eq!(
        metric(&body, "master_batch_put_start_partial_successes_total"),
        1.0
    );
    assert_eq!(metric(&body, "master_batch_put_start_items_total"), 2.0);
    assert_eq!(
        metric(&body, "master_batch_put_start_failed_items_total"),
        1.0
    );
    assert_eq!(
        metric(
            &body,
            "master_batch_get_replica_list_partial_successes_total"
        ),
        1.0
    );
    assert_eq!(metric(&body, "total_get_nums_"), 5.0);
    assert_eq!(metric(&body, "valid_get_nums_"), 3.0);
    assert_eq!(metric(&body, "mem_cache_hit_nums_"), 3.0);
    assert_eq!(
        metric(&body, "mem_cache_hit_bytes_total"),
        (4096 + 4096 + (1 << 20)) as f64
    );
    // Allocated puts: small, large, pinned, partial, b1.
    assert_eq!(metric(&body, "master_value_size_bytes_count"), 5.0);
    assert_eq!(
        metric(&body, "master_value_size_bytes_bucket{le=\"4096.000000\"}"),
        4.0
    );
    assert_eq!(
        metric(&body, "master_value_size_bytes_bucket{le=\"+Inf\"}"),
        5.0
    );
}

/// Polls `/metrics` (bounded) until `done` holds for the body; returns that body.
fn metrics_until(master: &MasterProcess, what: &str, done: impl Fn(&str) -> bool) -> String {
    for _ in 0..600 {
        let (status, body) = http("GET", master.metrics, "/metrics", b"");
        assert_eq!(status, 200);
        if done(&body) {
            return body;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("/metrics never showed {what}");
}

#[test]
fn upstream_eviction_and_discard_families_follow_the_workload() {
    let master = MasterProcess::start(&[
        "--put_start_discard_timeout_sec=1",
        "--put_start_release_timeout_sec=2",
    ]);
    let rt = runtime();
    let mc = client_of(&master);
    let me = ClientId::random();
    rt.block_on(async {
        mc.mount_segment(segment("127.0.0.1:7502", 0x1000_0000, 8 << 20), me)
            .await
            .unwrap();
        // An unfinished put, taken over by a later PutStart once the discard timeout passed.
        mc.put_start(me, "d", 4096, &ReplicateConfig::default(), "")
            .await
            .unwrap();
        let mut taken_over = false;
        for _ in 0..300 {
            if mc
                .put_start(me, "d", 4096, &ReplicateConfig::default(), "")
                .await
                .is_ok()
            {
                taken_over = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(taken_over, "the unfinished put was never discarded");
        mc.put_end(me, ObjectMeta::new("d"), "").await.unwrap();
        // Twice the segment in 1 MiB objects: eviction has to make room.
        for i in 0..16 {
            let key = format!("e{i}");
            if mc
                .put_start(me, &key, 1 << 20, &ReplicateConfig::default(), "")
                .await
                .is_ok()
            {
                mc.put_end(me, ObjectMeta::new(&key), "").await.unwrap();
            }
            mc.ping(me).await.unwrap();
        }
    });
    let body = metrics_until(&master, "evictions and a released discard", |body| {
        let n = |name: &str| metric(body, name);
        n("master_evicted_key_count") >= 1.0
            && n("master_put_start_release_cnt") >= 1.0
            && n("master_put_start_discarded_staging_size") == 0.0
    });
    check_upstream_families(&body);
    let n = |name: &str| metric(&body, name);
    assert_eq!(n("master_put_start_discard_cnt"), 1.0);
    assert_eq!(n("master_put_start_release_cnt"), 1.0);
    assert!(n("master_attempted_evictions_total") >= 1.0);
    assert!(n("master_successful_evictions_total") >= 1.0);
    assert!(n("master_evicted_size_bytes") >= n("master_evicted_key_count") * 4096.0);
    for (memory, total) in [
        (
            "master_attempted_evictions_mem",
            "master_attempted_evictions_total",
        ),
        (
            "master_successful_evictions_mem",
            "master_successful_evictions_total",
        ),
        ("master_evicted_key_count_mem", "master_evicted_key_count"),
        ("master_evicted_size_bytes_mem", "master_evicted_size_bytes"),
    ] {
        assert_eq!(n(memory), n(total), "{memory}");
    }
    assert!(
        n("master_key_count") <= 9.0,
        "eviction kept the store in bounds"
    );
}
