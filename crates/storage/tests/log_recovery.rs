//! Recovery of the log backend from crash images made in-process: records are written, the
//! backend is abandoned without a checkpoint (what SIGKILL leaves: everything written is in the
//! page cache), then the data file is optionally truncated or has bytes flipped, and the backend
//! is reopened. After reopen the index must equal exactly the set of intact latest records, and
//! nothing damaged may ever be returned.
#![allow(clippy::unwrap_used)]

use mooncake_storage::log::{LogBackend, LogOptions, CHECKPOINT_FILE, DATA_FILE};
use mooncake_storage::{BackendConfig, Durability, EvictionConfig, StorageBackend, StorageError};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "mooncake-log-test-{}-{tag}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn options() -> LogOptions {
    LogOptions {
        min_headroom_bytes: 1 << 20,
        ..LogOptions::default()
    }
}

fn config(dir: &Path, capacity_bytes: u64) -> BackendConfig {
    let mut c = BackendConfig::new(dir, capacity_bytes);
    c.durability = Durability::Batch;
    c.eviction = EvictionConfig {
        enabled: false,
        ..EvictionConfig::default()
    };
    c
}

fn open(dir: &Path) -> LogBackend {
    LogBackend::open_with(config(dir, 8 << 20), options()).unwrap()
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    (0..len).map(|_| rng.next() as u8).collect()
}

fn put(b: &LogBackend, key: &str, v: &[u8]) {
    let r = b.put_batch(&[(key, v)]);
    assert!(r[0].is_ok(), "put {key}: {:?}", r[0]);
}

fn get(b: &LogBackend, key: &str) -> Result<Vec<u8>, StorageError> {
    let size = b.size_of(key).ok_or(StorageError::NotFound)?;
    let mut buf = vec![0u8; size as usize];
    let r = b.get_batch(&[key], &mut [&mut buf[..]]);
    r.into_iter().next().unwrap().map(|n| {
        buf.truncate(n as usize);
        buf
    })
}

/// Asserts the backend holds exactly `model`, byte for byte.
fn assert_holds_exactly(b: &LogBackend, model: &BTreeMap<String, Vec<u8>>, context: &str) {
    let mut scanned: Vec<(String, u64)> = b
        .scan()
        .into_iter()
        .map(|o| (o.key, o.size_bytes))
        .collect();
    scanned.sort();
    let expected: Vec<(String, u64)> = model
        .iter()
        .map(|(k, v)| (k.clone(), v.len() as u64))
        .collect();
    assert_eq!(scanned, expected, "{context}: scan differs from the model");
    for (k, v) in model {
        assert_eq!(&get(b, k).unwrap(), v, "{context}: value of {k}");
    }
    let usage = b.usage();
    assert_eq!(usage.object_count, model.len() as u64, "{context}");
    assert_eq!(
        usage.used_bytes,
        model.values().map(|v| v.len() as u64).sum::<u64>(),
        "{context}"
    );
}

#[test]
fn clean_restart_finds_exactly_the_stored_objects() {
    let dir = TempDir::new("clean");
    let mut model = BTreeMap::new();
    {
        let b = open(&dir.0);
        assert!(b.recovery_report().created);
        for i in 0..20u64 {
            let v = value(i, (i as usize * 997) % 20_000);
            put(&b, &format!("key-{i}"), &v);
            model.insert(format!("key-{i}"), v);
        }
        put(&b, "key-3", b"replaced");
        model.insert("key-3".into(), b"replaced".to_vec());
        assert!(b.remove("key-4").unwrap());
        model.remove("key-4");
        b.close().unwrap();
        assert!(matches!(
            b.put_batch(&[("x", b"y")])[0],
            Err(StorageError::Closed)
        ));
    }
    let b = open(&dir.0);
    let report = b.recovery_report().clone();
    assert!(report.checkpoint_loaded, "{report:?}");
    assert_eq!(report.from_checkpoint, 19, "{report:?}");
    assert_eq!(report.from_scan, 0, "{report:?}");
    assert_eq!(report.dropped_corrupt, 0, "{report:?}");
    assert_holds_exactly(&b, &model, "after clean restart");
}

#[test]
fn records_written_after_the_checkpoint_are_found_by_the_scan() {
    let dir = TempDir::new("scan");
    let mut model = BTreeMap::new();
    {
        let b = open(&dir.0);
        for i in 0..5u64 {
            let v = value(i, 5000);
            put(&b, &format!("old-{i}"), &v);
            model.insert(format!("old-{i}"), v);
        }
        b.flush().unwrap();
        // After the checkpoint: new keys, an overwrite, a removal.
        for i in 0..5u64 {
            let v = value(100 + i, 3000 + i as usize);
            put(&b, &format!("new-{i}"), &v);
            model.insert(format!("new-{i}"), v);
        }
        put(&b, "old-1", b"newer value");
        model.insert("old-1".into(), b"newer value".to_vec());
        assert!(b.remove("old-2").unwrap());
        model.remove("old-2");
        b.abandon();
    }
    let b = open(&dir.0);
    let report = b.recovery_report().clone();
    assert!(report.checkpoint_loaded, "{report:?}");
    assert_eq!(
        report.from_checkpoint, 3,
        "old-0, old-3, old-4 ({report:?})"
    );
    assert_eq!(report.from_scan, 6, "new-0..4 and old-1 ({report:?})");
    assert_eq!(
        report.retired, 2,
        "old-1 replaced, old-2 removed ({report:?})"
    );
    assert_eq!(report.dropped_corrupt, 0, "{report:?}");
    assert_holds_exactly(&b, &model, "stale checkpoint + newer records");
}

#[test]
fn removed_key_does_not_come_back_after_a_crash() {
    let dir = TempDir::new("removed");
    {
        let b = open(&dir.0);
        put(&b, "checkpointed", b"v1");
        b.flush().unwrap();
        put(&b, "checkpointed", b"v2");
        put(&b, "fresh", b"a");
        put(&b, "fresh", b"b");
        assert!(b.remove("checkpointed").unwrap());
        assert!(b.remove("fresh").unwrap());
        assert!(!b.remove("fresh").unwrap());
        b.abandon();
    }
    let b = open(&dir.0);
    assert_holds_exactly(&b, &BTreeMap::new(), "after removals");
    // And again after a restart that started from a checkpoint taken at recovery.
    b.abandon();
    let b = open(&dir.0);
    assert_holds_exactly(&b, &BTreeMap::new(), "second restart");
}

#[test]
fn without_any_checkpoint_the_whole_file_is_scanned() {
    let dir = TempDir::new("nockpt");
    let mut model = BTreeMap::new();
    {
        let b = open(&dir.0);
        for i in 0..10u64 {
            let v = value(i, 100 * i as usize);
            put(&b, &format!("k{i}"), &v);
            model.insert(format!("k{i}"), v);
        }
        b.flush().unwrap();
        put(&b, "k0", b"later");
        model.insert("k0".into(), b"later".to_vec());
        b.abandon();
    }
    // A damaged checkpoint is ignored, not trusted.
    let ckpt = dir.0.join(CHECKPOINT_FILE);
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&ckpt, &bytes).unwrap();
    let b = open(&dir.0);
    let report = b.recovery_report().clone();
    assert!(!report.checkpoint_loaded, "{report:?}");
    assert!(report.checkpoint_error.is_some(), "{report:?}");
    assert_eq!(report.from_scan, 10, "{report:?}");
    assert_holds_exactly(&b, &model, "recovered by full scan");
}

#[test]
fn truncated_tail_record_is_dropped_and_the_rest_survive() {
    let dir = TempDir::new("trunc");
    let mut model = BTreeMap::new();
    let (offset, _) = {
        let b = open(&dir.0);
        for i in 0..4u64 {
            let v = value(i, 10_000);
            put(&b, &format!("k{i}"), &v);
            model.insert(format!("k{i}"), v);
        }
        b.flush().unwrap();
        let v = value(99, 50_000);
        put(&b, "last", &v);
        let loc = b.record_location("last").unwrap();
        b.abandon();
        loc
    };
    // Cut the file in the middle of the last record's value.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.0.join(DATA_FILE))
        .unwrap();
    file.set_len(offset + 4096 + 20_000).unwrap();
    drop(file);
    let b = open(&dir.0);
    let report = b.recovery_report().clone();
    assert_eq!(report.dropped_corrupt, 1, "{report:?}");
    assert_eq!(report.dropped[0].0, "last", "{report:?}");
    assert!(report.missing_tail_bytes > 0, "{report:?}");
    assert_holds_exactly(&b, &model, "after truncation");
    // The store is fully usable afterwards.
    put(&b, "after", b"ok");
    assert_eq!(get(&b, "after").unwrap(), b"ok");
}

#[test]
fn flipped_value_byte_is_detected_at_open_and_never_returned() {
    let dir = TempDir::new("flip");
    let mut model = BTreeMap::new();
    let (ck_loc, scan_loc) = {
        let b = open(&dir.0);
        for i in 0..6u64 {
            let v = value(i, 9000);
            put(&b, &format!("k{i}"), &v);
            model.insert(format!("k{i}"), v);
        }
        b.flush().unwrap();
        let v = value(50, 7000);
        put(&b, "post", &v);
        let locs = (
            b.record_location("k2").unwrap(),
            b.record_location("post").unwrap(),
        );
        b.abandon();
        locs
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.0.join(DATA_FILE))
        .unwrap();
    for (offset, _) in [ck_loc, scan_loc] {
        let at = offset + 4096 + 1234;
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ 0x20], at).unwrap();
    }
    drop(file);
    model.remove("k2");
    let b = open(&dir.0);
    let report = b.recovery_report().clone();
    assert_eq!(report.dropped_corrupt, 2, "{report:?}");
    let mut dropped: Vec<&str> = report.dropped.iter().map(|(k, _)| k.as_str()).collect();
    dropped.sort();
    assert_eq!(dropped, ["k2", "post"], "{report:?}");
    assert_holds_exactly(&b, &model, "after flips");
}

#[test]
fn corruption_found_on_read_is_reported_and_the_record_dropped() {
    let dir = TempDir::new("readflip");
    let b = LogBackend::open_with(
        config(&dir.0, 8 << 20),
        LogOptions {
            verify_on_open: false,
            ..options()
        },
    )
    .unwrap();
    let v = value(1, 20_000);
    put(&b, "victim", &v);
    put(&b, "other", b"fine");
    let (offset, _) = b.record_location("victim").unwrap();
    // Damage the bytes under the running backend (as a failing disk would).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.0.join(DATA_FILE))
        .unwrap();
    file.write_all_at(&[0xAA; 16], offset + 4096 + 100).unwrap();
    let used_before = b.usage().used_bytes;
    let mut buf = vec![0u8; v.len()];
    let r = b.get_batch(&["victim"], &mut [&mut buf[..]]);
    match &r[0] {
        Err(e @ StorageError::Corrupt { key, .. }) => {
            assert_eq!(key, "victim");
            assert_eq!(e.code(), mooncake_common::ErrorCode::FILE_READ_FAIL);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(!b.exists("victim"), "dropped from the index");
    assert_eq!(b.usage().used_bytes, used_before - v.len() as u64);
    assert!(matches!(get(&b, "victim"), Err(StorageError::NotFound)));
    assert_eq!(get(&b, "other").unwrap(), b"fine");
    assert_eq!(b.stats().corrupt_reads, 1);
    b.close().unwrap();
    drop(b);
    let b = open(&dir.0);
    assert!(!b.exists("victim"), "not resurrected by recovery");
    assert_eq!(get(&b, "other").unwrap(), b"fine");
}

#[test]
fn unreadable_file_header_refuses_to_open_without_destroying_data() {
    let dir = TempDir::new("header");
    {
        let b = open(&dir.0);
        put(&b, "k", b"v");
        b.close().unwrap();
    }
    let path = dir.0.join(DATA_FILE);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // One damaged copy is repaired from the other.
    file.write_all_at(&[0xFF; 8], 0).unwrap();
    {
        let b = open(&dir.0);
        assert_eq!(get(&b, "k").unwrap(), b"v");
    }
    // Both damaged: refuse, leave the file alone.
    file.write_all_at(&[0xFF; 8], 0).unwrap();
    file.write_all_at(&[0xFF; 8], 2048).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let err = LogBackend::open_with(config(&dir.0, 8 << 20), options()).unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err:?}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
}

/// The model of what a crash image must recover to: the latest value of every live key, and
/// where its record lies, so damage can be mapped to the keys it destroys.
#[derive(Default)]
struct Model {
    values: BTreeMap<String, Vec<u8>>,
}

fn random_workload(b: &LogBackend, rng: &mut Lcg, model: &mut Model, ops: usize) {
    for _ in 0..ops {
        let key = format!("key-{}", rng.below(40));
        match rng.below(10) {
            0..=5 => {
                let len = match rng.below(4) {
                    0 => 0,
                    1 => rng.below(100) as usize,
                    2 => rng.below(8192) as usize,
                    _ => rng.below(40_000) as usize,
                };
                let v = value(rng.next(), len);
                put(b, &key, &v);
                model.values.insert(key, v);
            }
            6 => {
                // A batch with a duplicate key: the later entry wins.
                let v1 = value(rng.next(), 300);
                let v2 = value(rng.next(), 5000);
                let other = format!("key-{}", rng.below(40));
                let r = b.put_batch(&[(&key, &v1), (&other, &v2), (&key, &v2)]);
                assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
                model.values.insert(other, v2.clone());
                model.values.insert(key, v2);
            }
            7 | 8 => {
                let was = b.remove(&key).unwrap();
                assert_eq!(was, model.values.remove(&key).is_some(), "remove {key}");
            }
            _ => b.flush().unwrap(),
        }
    }
}

#[test]
fn random_crash_images_recover_exactly_the_intact_latest_records() {
    // More rounds: LOG_RECOVERY_ROUNDS=500 (and LOG_RECOVERY_SEED to vary the images).
    let rounds = std::env::var("LOG_RECOVERY_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let seed = std::env::var("LOG_RECOVERY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2024);
    let mut rng = Lcg(seed);
    for round in 0..rounds {
        let dir = TempDir::new("random");
        let mut model = Model::default();
        let damage = round % 4; // 0 none, 1 truncate, 2 flip data byte, 3 flip checkpoint byte
        let (locations, file_len) = {
            let b = open(&dir.0);
            random_workload(&b, &mut rng, &mut model, 60 + (round * 7) % 50);
            // Reopen mid-way once in a while, to chain epochs.
            let b = if round % 3 == 0 {
                b.abandon();
                let b = open(&dir.0);
                assert_holds_exactly(&b, &model.values, &format!("round {round} mid-way"));
                random_workload(&b, &mut rng, &mut model, 40);
                b
            } else {
                b
            };
            let locations: BTreeMap<String, (u64, u64)> = model
                .values
                .keys()
                .map(|k| (k.clone(), b.record_location(k).unwrap()))
                .collect();
            b.abandon();
            let len = std::fs::metadata(dir.0.join(DATA_FILE)).unwrap().len();
            (locations, len)
        };
        // Byte range of a record that recovery reads: header + key, and value.
        let significant = |key: &str, offset: u64| {
            let head_end = offset + 48 + key.len() as u64;
            let value_start = offset + 4096 * (48 + key.len() as u64).div_ceil(4096);
            let value_len = model.values[key].len() as u64;
            // An empty value needs no byte past the key.
            let value_end = if value_len == 0 {
                head_end
            } else {
                value_start + value_len
            };
            (head_end, value_start, value_end)
        };
        let mut expected = model.values.clone();
        // Whether every destroyed record must show up in the report: a record whose header
        // no longer decodes cannot be told from free space unless the checkpoint names it.
        let mut exact_report = true;
        let data = dir.0.join(DATA_FILE);
        match damage {
            1 => {
                let max_end = locations
                    .iter()
                    .map(|(k, &(o, _))| significant(k, o).2.max(significant(k, o).0))
                    .max()
                    .unwrap_or(8192);
                let cut = 4096 + rng.below(max_end.saturating_sub(4096).max(1));
                let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
                f.set_len(cut).unwrap();
                // Checkpointed records past the cut are reported; a post-checkpoint record whose
                // header is gone cannot be told from free space.
                exact_report = false;
                expected.retain(|k, _| {
                    let (head_end, _, value_end) = significant(k, locations[k].0);
                    head_end <= cut && value_end <= cut
                });
            }
            2 if !locations.is_empty() => {
                let keys: Vec<&String> = locations.keys().collect();
                let victim = keys[rng.below(keys.len() as u64) as usize].clone();
                let (offset, _) = locations[&victim];
                let (head_end, value_start, value_end) = significant(&victim, offset);
                // Flip inside the header/key or inside the value.
                let at = if value_end > value_start && rng.below(2) == 0 {
                    value_start + rng.below(value_end - value_start)
                } else {
                    exact_report = false;
                    offset + rng.below(head_end - offset)
                };
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&data)
                    .unwrap();
                let mut byte = [0u8; 1];
                f.read_exact_at(&mut byte, at).unwrap();
                f.write_all_at(&[byte[0] ^ (1 << rng.below(8))], at)
                    .unwrap();
                expected.remove(&victim);
            }
            3 => {
                let ckpt = dir.0.join(CHECKPOINT_FILE);
                let mut bytes = std::fs::read(&ckpt).unwrap();
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] ^= 0x10;
                std::fs::write(&ckpt, &bytes).unwrap();
            }
            _ => {}
        }
        let b = open(&dir.0);
        let context = format!(
            "round {round}, damage {damage}, file {file_len} B, report {:?}",
            b.recovery_report()
        );
        assert_holds_exactly(&b, &expected, &context);
        let lost = model.values.len() - expected.len();
        let reported = b.recovery_report().dropped_corrupt as usize;
        if exact_report {
            assert_eq!(
                reported, lost,
                "{context}: every destroyed record is reported"
            );
        } else {
            assert!(
                reported <= lost,
                "{context}: more drops reported than records lost"
            );
        }
        drop(b);
        // A second reopen (from the checkpoint recovery wrote) gives the same set.
        let b = open(&dir.0);
        assert_holds_exactly(&b, &expected, &format!("{context}, second reopen"));
    }
}
