//! The local disk tier through the real binaries: a `mooncake master --enable_offload`, a
//! `mooncake store --disk-dir …` node, and this test process as the client. Shown: objects put
//! beyond memory are offloaded, evicted from memory and read back byte-exact from the node's
//! disk; every offload task ends in one answer and the pins go back to zero; a record whose bytes
//! were flipped on disk is a clean miss, never wrong bytes; a node SIGKILLed and restarted on the
//! same directory serves its disk objects again; a second process is refused the directory; bad
//! disk flags are refused. Every wait is a bounded poll.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pattern, MasterOptions, MasterProcess, StoreNode};
use mooncake_client::{RangeRead, StoreClient, StoreConfig};
use mooncake_common::{ReplicaKind, ReplicateConfig};
use mooncake_proto::methods as m;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mooncake");
const VALUE_BYTES: usize = 1 << 20;
/// Memory of the node: a third of what the tests put.
const SEGMENT: &str = "8MiB";
const OBJECTS: usize = 24;

async fn client(master: &MasterProcess) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: master.rpc.to_string(),
        global_segment_size: 0,
        auto_port_range: None,
        ..StoreConfig::default()
    })
    .await
    .expect("connect")
}

fn disk_node(master: &MasterProcess, dir: &Path) -> StoreNode {
    StoreNode::start(
        &master.rpc.to_string(),
        SEGMENT,
        &[
            "--disk-dir",
            dir.to_str().unwrap(),
            "--disk-capacity",
            "256MiB",
        ],
    )
}

async fn offload_stats(c: &StoreClient) -> m::OffloadStatsReply {
    c.master().call(&m::GetOffloadStats {}).await.unwrap()
}

/// Polls (at most 60 s) until no offload task is in flight.
async fn settle(c: &StoreClient) -> m::OffloadStatsReply {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = offload_stats(c).await;
        if s.in_flight == 0 {
            return s;
        }
        assert!(Instant::now() < deadline, "offload never settled: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Puts `obj/{i}` (`VALUE_BYTES` of pattern `i + 1`), retrying for at most 60 s while memory is
/// full of replicas still pinned by their offload.
async fn put_one(c: &StoreClient, i: usize) {
    let key = format!("obj/{i}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let value = pattern(VALUE_BYTES, i as u64 + 1);
        match c.put(&key, &value, &ReplicateConfig::default()).await {
            Ok(_) => return,
            Err(error) => {
                assert!(Instant::now() < deadline, "put {key} kept failing: {error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Puts `OBJECTS` values of `VALUE_BYTES` (3× the node's memory), letting offload catch up after
/// each.
async fn put_all(c: &StoreClient) {
    for i in 0..OBJECTS {
        put_one(c, i).await;
        settle(c).await;
    }
}

/// The value of the sample `name` at the master's `/metrics`.
fn metric(master: &MasterProcess, name: &str) -> f64 {
    let (status, text) = common::http("GET", master.metrics, "/metrics", b"");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

/// Every offload task ended in exactly one answer (stored, refused, or dropped with its node)
/// and none is in flight.
fn assert_conserved(s: &m::OffloadStatsReply) {
    assert_eq!(s.in_flight, 0, "{s:?}");
    assert_eq!(s.queued, s.stored + s.refused + s.dropped, "{s:?}");
}

/// Keys whose only replicas are on disk.
async fn disk_only(c: &StoreClient) -> Vec<usize> {
    let mut out = Vec::new();
    for i in 0..OBJECTS {
        let request = m::GetReplicaList {
            key: format!("obj/{i}"),
            tenant: String::new(),
        };
        if let Ok(r) = c.master().call(&request).await {
            if r.replicas
                .iter()
                .all(|r| matches!(r.kind, ReplicaKind::LocalDisk(_)))
            {
                out.push(i);
            }
        }
    }
    out
}

/// Polls (at most 60 s) until `n` objects are disk-only.
async fn wait_disk_only(c: &StoreClient, n: usize) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let keys = disk_only(c).await;
        if keys.len() >= n {
            return keys;
        }
        assert!(
            Instant::now() < deadline,
            "only {} disk-only objects",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_beyond_memory_read_back_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let _node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    let on_disk = wait_disk_only(&c, OBJECTS / 2).await;
    let reads_before = c.stats().offload_rpc_reads.load(Ordering::Relaxed);
    for i in 0..OBJECTS {
        let got = c.get(&format!("obj/{i}")).await.expect("read back");
        assert!(got == pattern(VALUE_BYTES, i as u64 + 1), "obj/{i} differs");
    }
    let disk_reads = c.stats().offload_rpc_reads.load(Ordering::Relaxed) - reads_before;
    assert!(
        disk_reads >= on_disk.len() as u64,
        "{disk_reads} disk reads for {} disk-only objects",
        on_disk.len()
    );
    // A batch read of disk-only objects: one request per node.
    let keys: Vec<String> = on_disk.iter().map(|i| format!("obj/{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (i, got) in on_disk.iter().zip(c.get_batch(&refs).await) {
        assert!(got.unwrap() == pattern(VALUE_BYTES, *i as u64 + 1));
    }
    // Every task ended in exactly one answer; no pin is left.
    let s = settle(&c).await;
    assert_conserved(&s);
    assert_eq!(s.stored as usize, OBJECTS, "{s:?}");
    assert_eq!(s.disks, 1);
    // The same at /metrics, with the disk hits of the reads above.
    let value = |name: &str| metric(&master, name);
    assert!(value("master_get_disk_hits_total") >= on_disk.len() as f64);
    assert_eq!(value("master_offload_tasks_in_flight"), 0.0);
    assert_eq!(value("master_offload_tasks_stored_total"), OBJECTS as f64);
    assert_eq!(value("master_local_disks"), 1.0);
    c.close().await.unwrap();
}

/// The byte offset of `needle` in the file at `path`.
fn find_in(path: &Path, needle: &[u8]) -> Option<usize> {
    let bytes = std::fs::read(path).ok()?;
    bytes.windows(needle.len()).position(|w| w == needle)
}

/// Flips one byte in the middle of the value `value` wherever the backend under `dir` stored it.
fn corrupt(dir: &Path, value: &[u8]) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if let Some(at) = find_in(&path, &value[..4096]) {
                use std::io::{Read, Seek, SeekFrom, Write};
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap();
                let target = (at + value.len() / 2) as u64;
                let mut b = [0u8; 1];
                f.seek(SeekFrom::Start(target)).unwrap();
                f.read_exact(&mut b).unwrap();
                f.seek(SeekFrom::Start(target)).unwrap();
                f.write_all(&[b[0] ^ 0x5a]).unwrap();
                f.sync_all().unwrap();
                return true;
            }
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_on_disk_is_a_clean_miss() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let _node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    let on_disk = wait_disk_only(&c, 2).await;
    let victim = on_disk[0];
    let value = pattern(VALUE_BYTES, victim as u64 + 1);
    assert!(corrupt(dir.path(), &value), "value not found on disk");
    for _ in 0..2 {
        match c.get(&format!("obj/{victim}")).await {
            Ok(bytes) => panic!("a corrupt record was served ({} bytes)", bytes.len()),
            Err(error) => eprintln!("corrupt record: {error}"),
        }
    }
    let other = on_disk[1];
    let got = c.get(&format!("obj/{other}")).await.expect("other object");
    assert!(got == pattern(VALUE_BYTES, other as u64 + 1));
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_restarted_on_its_dir_serves_its_disk_objects() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true", "--client_ttl=2"]);
    let node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    wait_disk_only(&c, OBJECTS / 2).await;
    node.kill();
    let _node = disk_node(&master, dir.path());
    // Once the dead node expired, every object lives on the restarted node's disk.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut ok = 0;
        for i in 0..OBJECTS {
            if let Ok(got) = c.get(&format!("obj/{i}")).await {
                assert!(got == pattern(VALUE_BYTES, i as u64 + 1), "obj/{i} differs");
                ok += 1;
            }
        }
        if ok == OBJECTS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ok} of {OBJECTS} readable after restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(offload_stats(&c).await.advertised >= OBJECTS as u64);
    c.close().await.unwrap();
}

/// Whether the master still lists `obj/{i}`.
async fn listed(c: &StoreClient, i: usize) -> bool {
    let request = m::GetReplicaList {
        key: format!("obj/{i}"),
        tenant: String::new(),
    };
    c.master().call(&request).await.is_ok()
}

/// SIGKILLs `node`, restarts it on `dir` and waits (at most 60 s) until every `obj/{i}` of
/// `kept` reads back byte-exact from the restarted node's disk.
async fn restart_and_read(
    c: &StoreClient,
    master: &MasterProcess,
    node: StoreNode,
    dir: &Path,
    kept: std::ops::Range<usize>,
) -> StoreNode {
    node.kill();
    let node = disk_node(master, dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in kept {
        loop {
            match c.get(&format!("obj/{i}")).await {
                Ok(got) => {
                    assert!(got == pattern(VALUE_BYTES, i as u64 + 1), "obj/{i} differs");
                    break;
                }
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "obj/{i} never came back: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    node
}

/// Removing an object drops its disk record too: keys removed while their node ran (it deletes
/// the records) and keys removed while it was dead (its restart's advertisement is refused and
/// it deletes them then) never come back, through two restarts on the same directory; the kept
/// keys do. Every removal succeeds without force on the pins: no offload pin was left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_key_never_comes_back_from_disk() {
    const LIVE_REMOVED: std::ops::Range<usize> = 0..10;
    const DEAD_REMOVED: std::ops::Range<usize> = 10..16;
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true", "--client_ttl=2"]);
    let node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    let s = settle(&c).await;
    assert_conserved(&s);
    assert_eq!(s.stored as usize, OBJECTS, "{s:?}");
    // A pinned replica refuses Remove (OBJECT_HAS_REPLICATION_TASK), forced or not.
    for i in LIVE_REMOVED {
        c.remove(&format!("obj/{i}"), true).await.expect("remove");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&master, "master_disk_dropped_records_total") < LIVE_REMOVED.len() as f64 {
        assert!(
            Instant::now() < deadline,
            "the node never dropped the removed records"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.signal(libc::SIGSTOP);
    for i in DEAD_REMOVED {
        c.remove(&format!("obj/{i}"), true).await.expect("remove");
    }
    let node = restart_and_read(&c, &master, node, dir.path(), DEAD_REMOVED.end..OBJECTS).await;
    let node = restart_and_read(&c, &master, node, dir.path(), DEAD_REMOVED.end..OBJECTS).await;
    for i in LIVE_REMOVED.chain(DEAD_REMOVED) {
        assert!(!listed(&c, i).await, "removed obj/{i} came back");
        assert!(
            c.get(&format!("obj/{i}")).await.is_err(),
            "removed obj/{i} read"
        );
    }
    for i in DEAD_REMOVED.end..OBJECTS {
        c.remove(&format!("obj/{i}"), true)
            .await
            .expect("remove a kept key");
    }
    drop(node);
    c.close().await.unwrap();
}

/// A master restarted without a snapshot knows nothing; the node re-mounts its disk and
/// re-advertises every object on it, so they are readable again (upstream's disk objects stayed
/// unusable after a master restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_objects_are_readable_again_after_a_master_restart() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let port = master.rpc.port();
    let _node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    drop(master);
    let restarted = MasterProcess::spawn(MasterOptions {
        port,
        extra: &["--enable_offload=true"],
        ..MasterOptions::default()
    })
    .unwrap_or_else(|status| panic!("master restart: {status}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut ok = 0;
        for i in 0..OBJECTS {
            if let Ok(got) = c.get(&format!("obj/{i}")).await {
                assert!(got == pattern(VALUE_BYTES, i as u64 + 1), "obj/{i} differs");
                ok += 1;
            }
        }
        if ok == OBJECTS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ok} of {OBJECTS} readable after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(offload_stats(&c).await.advertised >= OBJECTS as u64);
    drop(restarted);
}

/// Promotion on hit: a disk-only object read twice gets a memory replica again, filled by its
/// node from its disk, and reads back byte-exact from memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_only_object_read_twice_is_promoted_to_memory() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true", "--promotion_on_hit=true"]);
    let _node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    let victim = *disk_only(&c).await.first().expect("a disk-only object");
    let key = format!("obj/{victim}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = c.get(&key).await.expect("read");
        assert!(got == pattern(VALUE_BYTES, victim as u64 + 1));
        let request = m::GetReplicaList {
            key: key.clone(),
            tenant: String::new(),
        };
        let replicas = c.master().call(&request).await.unwrap().replicas;
        if replicas
            .iter()
            .any(|r| matches!(r.kind, ReplicaKind::Memory(_)))
        {
            break;
        }
        assert!(Instant::now() < deadline, "never promoted: {replicas:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reads_before = c.stats().offload_rpc_reads.load(Ordering::Relaxed);
    let got = c.get(&key).await.expect("read from memory");
    assert!(got == pattern(VALUE_BYTES, victim as u64 + 1));
    assert_eq!(
        c.stats().offload_rpc_reads.load(Ordering::Relaxed),
        reads_before,
        "a promoted object was read from disk"
    );
    let s = offload_stats(&c).await;
    assert!(s.promoted >= 1, "{s:?}");
    assert_eq!(s.promotion_failures, 0, "{s:?}");
    c.close().await.unwrap();
}

/// A disk smaller than what is offloaded evicts its oldest objects under its watermarks and
/// tells the master first: puts keep working, every read returns the right bytes or a clean
/// miss, and the master counts the disk evictions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_evicts_and_tells_the_master() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let d = dir.path().to_str().unwrap();
    let _node = StoreNode::start(
        &master.rpc.to_string(),
        SEGMENT,
        &["--disk-dir", d, "--disk-capacity", "8MiB"],
    );
    let c = client(&master).await;
    put_all(&c).await;
    let mut served = 0;
    for i in 0..OBJECTS {
        if let Ok(got) = c.get(&format!("obj/{i}")).await {
            assert!(got == pattern(VALUE_BYTES, i as u64 + 1), "obj/{i} differs");
            served += 1;
        }
    }
    let s = settle(&c).await;
    assert!(s.disk_evicted > 0, "{s:?}");
    assert!(
        served > 0 && served < OBJECTS,
        "{served} of {OBJECTS} served"
    );
    assert_conserved(&s);
    c.close().await.unwrap();
}

/// Ranged reads of disk-only objects: several ranges of one object and ranges of two objects in
/// one call come back byte-exact (each object loaded once from its node's disk), and a range past
/// the end fails alone with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranged_reads_of_disk_only_objects() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let _node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    let on_disk = wait_disk_only(&c, 2).await;
    let names: Vec<String> = on_disk[..2].iter().map(|i| format!("obj/{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = on_disk[..2]
        .iter()
        .map(|i| pattern(VALUE_BYTES, *i as u64 + 1))
        .collect();
    // (key index, offset, length); the last runs past the end.
    let asked = [
        (0, 0, 4096),
        (0, 123_457, 65_536),
        (1, VALUE_BYTES - 100, 100),
        (1, 1, 1),
        (0, VALUE_BYTES - 10, 11),
    ];
    let mut buffers: Vec<Vec<u8>> = asked.iter().map(|(_, _, n)| vec![0u8; *n]).collect();
    let loads_before = c.stats().offload_rpc_reads.load(Ordering::Relaxed);
    let mut fragments: Vec<RangeRead<'_>> = asked
        .iter()
        .zip(buffers.iter_mut())
        .map(|((key, offset, _), dst)| RangeRead {
            key: *key,
            offset: *offset as u64,
            dst,
        })
        .collect();
    let results = c.get_ranges(&keys, &mut fragments).await;
    drop(fragments);
    let (last, ranges) = results.split_last().unwrap();
    assert!(last.is_err(), "a range past the end was read: {last:?}");
    for ((result, (key, offset, len)), got) in ranges.iter().zip(&asked).zip(&buffers) {
        assert_eq!(result.as_ref().ok(), Some(&(*len as u64)), "{result:?}");
        assert!(
            got[..] == values[*key][*offset..offset + len],
            "range {offset}+{len} of {} differs",
            keys[*key]
        );
    }
    let loads = c.stats().offload_rpc_reads.load(Ordering::Relaxed) - loads_before;
    assert_eq!(loads, 2, "one disk load per object");
    c.close().await.unwrap();
}

/// `mooncake stat` shows each node's memory and disk: the disk node's line has its segment's
/// capacity, its disk's capacity and the usage the master last heard, and its disk endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_shows_memory_and_disk_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let _node = disk_node(&master, dir.path());
    let c = client(&master).await;
    put_all(&c).await;
    let used = settle(&c).await.disk_used_bytes;
    assert!(used > 0);
    let disks = c.master().call(&m::ListLocalDisks {}).await.unwrap();
    assert_eq!(disks.len(), 1, "{disks:?}");
    let text = common::verb_ok(&["stat", "--master", &master.rpc.to_string()]);
    let header = text
        .lines()
        .find(|l| l.starts_with("node "))
        .unwrap_or_else(|| panic!("no node table in\n{text}"));
    assert!(header.contains("disk used"), "{header}");
    let row = text
        .lines()
        .find(|l| l.starts_with(&disks[0].client.to_string()))
        .unwrap_or_else(|| panic!("no line for the disk node in\n{text}"));
    for expected in [
        "8 MiB".to_string(),
        "256 MiB".to_string(),
        mooncake_common::format_size(disks[0].used_bytes),
        disks[0].endpoint.clone(),
    ] {
        assert!(row.contains(&expected), "{expected:?} not in {row:?}");
    }
    c.close().await.unwrap();
}

/// A disk too small for any object (1 MiB values, 512 KiB of disk: no record fits) refuses every
/// offload: puts of 3× memory keep working in memory (each refusal unpins its source, so memory
/// eviction makes room), every refusal is counted at `/metrics`, and reads return the right bytes
/// or a clean miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_offloads_and_puts_keep_working_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let d = dir.path().to_str().unwrap();
    let _node = StoreNode::start(
        &master.rpc.to_string(),
        SEGMENT,
        &["--disk-dir", d, "--disk-capacity", "512KiB"],
    );
    let c = client(&master).await;
    put_all(&c).await;
    let s = settle(&c).await;
    assert_conserved(&s);
    assert_eq!((s.stored, s.refused), (0, OBJECTS as u64), "{s:?}");
    assert_eq!(
        metric(&master, "master_offload_tasks_refused_total"),
        OBJECTS as f64
    );
    assert_eq!(metric(&master, "master_offload_tasks_stored_total"), 0.0);
    let mut served = 0;
    for i in 0..OBJECTS {
        if let Ok(got) = c.get(&format!("obj/{i}")).await {
            assert!(got == pattern(VALUE_BYTES, i as u64 + 1), "obj/{i} differs");
            served += 1;
        }
    }
    // The newest object is in memory; the oldest were evicted (nothing on disk to read).
    let newest = c
        .get(&format!("obj/{}", OBJECTS - 1))
        .await
        .expect("newest");
    assert!(newest == pattern(VALUE_BYTES, OBJECTS as u64));
    assert!(
        served < OBJECTS,
        "{served} of {OBJECTS} served with no disk"
    );
    c.close().await.unwrap();
}

/// Writers push objects through a disk of 8 MiB (the node evicts its oldest records again and
/// again) while a second client reads the oldest keys still listed: every read is the right
/// bytes or a clean miss, never another object's or torn bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_eviction_racing_reads_of_the_same_keys_gives_right_bytes_or_misses() {
    const PUTS: usize = 48;
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let d = dir.path().to_str().unwrap();
    let _node = StoreNode::start(
        &master.rpc.to_string(),
        SEGMENT,
        &["--disk-dir", d, "--disk-capacity", "8MiB"],
    );
    let writer = client(&master).await;
    let reader = client(&master).await;
    let written = Arc::new(AtomicUsize::new(0));
    let progress = written.clone();
    let writing = tokio::spawn(async move {
        for i in 0..PUTS {
            put_one(&writer, i).await;
            progress.store(i + 1, Ordering::Release);
        }
        writer
    });
    let (mut right, mut misses) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(300);
    while written.load(Ordering::Acquire) < PUTS {
        assert!(Instant::now() < deadline, "the writer never finished");
        let n = written.load(Ordering::Acquire);
        // The oldest keys still on disk are the ones its eviction picks.
        for i in n.saturating_sub(20)..n.saturating_sub(6) {
            match reader.get(&format!("obj/{i}")).await {
                Ok(got) => {
                    assert!(
                        got == pattern(VALUE_BYTES, i as u64 + 1),
                        "obj/{i}: wrong bytes"
                    );
                    right += 1;
                }
                Err(_) => misses += 1,
            }
        }
        tokio::task::yield_now().await;
    }
    let writer = writing.await.unwrap();
    let s = settle(&reader).await;
    assert_conserved(&s);
    assert!(s.disk_evicted > 0, "the disk never evicted: {s:?}");
    let disk_reads = reader.stats().offload_rpc_reads.load(Ordering::Relaxed);
    assert!(
        right > 0 && disk_reads > 0,
        "{right} right reads ({misses} misses), {disk_reads} disk loads"
    );
    eprintln!("{right} right reads, {misses} clean misses, {disk_reads} disk loads, {s:?}");
    writer.close().await.unwrap();
    reader.close().await.unwrap();
}

/// Runs `mooncake store` with `extra` and returns (exit code, stderr) once it exits (at most
/// 30 s).
fn store_refused(master: &MasterProcess, extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args([
            "store",
            "--master",
            &master.rpc.to_string(),
            "--segment-size",
            SEGMENT,
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = out.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut child = out;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = child.wait();
            panic!("mooncake store {extra:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_disk_dir_has_one_owner_and_bad_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterProcess::start(&["--enable_offload=true"]);
    let _owner = disk_node(&master, dir.path());
    let d = dir.path().to_str().unwrap();
    let (code, err) = store_refused(&master, &["--disk-dir", d, "--disk-capacity", "64MiB"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("in use by another process"), "{err}");
    let (code, err) = store_refused(&master, &["--disk-dir", d, "--disk-capacity", "0"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("capacity"), "{err}");
    let (code, err) = store_refused(&master, &["--disk-dir", d]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--disk-capacity"), "{err}");
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let (code, err) = store_refused(
        &master,
        &[
            "--disk-dir",
            file.to_str().unwrap(),
            "--disk-capacity",
            "64MiB",
        ],
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("not a directory"), "{err}");
    // A master without --enable_offload refuses the disk.
    let plain = MasterProcess::start(&[]);
    let other = tempfile::tempdir().unwrap();
    let (code, err) = store_refused(
        &plain,
        &[
            "--disk-dir",
            other.path().to_str().unwrap(),
            "--disk-capacity",
            "64MiB",
        ],
    );
    assert_ne!(code, Some(0));
    assert!(
        err.contains("UNABLE_OFFLOAD") || err.contains("offload"),
        "{err}"
    );
}
