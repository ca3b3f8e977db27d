//! One conformance suite over [`StorageBackend`], instantiated per backend with
//! `conformance_suite!(module_name, |config: BackendConfig| -> Result<Box<dyn StorageBackend>, _>)`
//! (see `tests/conformance_file.rs`). Each `pub fn` below is one test; the macro turns every one
//! of them into a `#[test]` for the backend. The opener receives a complete config (root,
//! capacity, durability, eviction, limits) and must open — or reopen — the backend there.
#![allow(clippy::unwrap_used, dead_code)]

use mooncake_common::ErrorCode;
use mooncake_storage::testkit::{value_for, Rng};
use mooncake_storage::{
    BackendConfig, Durability, EvictionConfig, EvictionPolicy, Limits, ObjectInfo, StorageBackend,
    StorageError,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Opens or reopens a backend from a config.
pub type Opener = dyn Fn(BackendConfig) -> Result<Box<dyn StorageBackend>, StorageError>;

/// Expands to one `#[test]` per conformance check, in a module named `$name`.
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, $open:expr) => {
        $crate::conformance_suite!(@tests $name, $open,
            round_trip_value_sizes,
            batch_results_are_per_entry_and_in_order,
            overwrite_replaces_value_and_accounting,
            remove_and_missing_keys,
            small_buffer_is_buffer_overflow_and_changes_nothing,
            limits_are_errors_not_panics,
            capacity_accounting_tracks_every_change,
            eviction_fifo_evicts_oldest_writes_first,
            eviction_lru_keeps_recently_read_objects,
            eviction_order_survives_restart,
            eviction_listener_sees_keys_already_unindexed,
            full_store_without_eviction_is_file_write_fail_and_stays_readable,
            full_disk_needs_root_is_file_write_fail_and_stays_readable,
            concurrent_readers_and_writers_see_only_whole_values,
            restart_finds_exactly_the_acknowledged_objects,
            closed_backend_refuses_operations,
            flipped_bytes_are_detected_never_returned,
            truncated_files_lose_only_damaged_records,
            random_operations_match_a_model
        );
    };
    (@tests $name:ident, $open:expr, $($test:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $test() {
                    let open = $open;
                    $crate::conformance::$test(&open);
                }
            )*
        }
    };
}

// ------------------------------------------------------------------------------------------------
// helpers

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

pub fn config(dir: &Path, capacity_bytes: u64) -> BackendConfig {
    BackendConfig::new(dir, capacity_bytes)
}

fn open_ok(open: &Opener, cfg: &BackendConfig) -> Box<dyn StorageBackend> {
    match open(cfg.clone()) {
        Ok(b) => b,
        Err(e) => panic!("open {:?} failed: {e}", cfg.root),
    }
}

pub fn put(b: &dyn StorageBackend, key: &str, value: &[u8]) -> Result<(), StorageError> {
    b.put_batch(&[(key, value)]).pop().unwrap()
}

pub fn get(b: &dyn StorageBackend, key: &str) -> Result<Vec<u8>, StorageError> {
    let size = b.size_of(key).ok_or(StorageError::NotFound)?;
    let mut buf = vec![0u8; size as usize];
    let n = b.get_batch(&[key], &mut [&mut buf[..]]).pop().unwrap()?;
    assert_eq!(
        n, size,
        "get of {key:?} reported {n} bytes, size_of said {size}"
    );
    buf.truncate(n as usize);
    Ok(buf)
}

fn sorted_scan(b: &dyn StorageBackend) -> Vec<ObjectInfo> {
    let mut s = b.scan();
    s.sort();
    s
}

fn model_scan(model: &BTreeMap<String, Vec<u8>>) -> Vec<ObjectInfo> {
    model
        .iter()
        .map(|(k, v)| ObjectInfo {
            key: k.clone(),
            size_bytes: v.len() as u64,
        })
        .collect()
}

/// Asserts the backend holds exactly `model`, byte for byte, and accounts for it.
fn assert_holds_exactly(b: &dyn StorageBackend, model: &BTreeMap<String, Vec<u8>>) {
    assert_eq!(
        sorted_scan(b),
        model_scan(model),
        "scan differs from the acknowledged set"
    );
    for (k, v) in model {
        let got = get(b, k).unwrap_or_else(|e| panic!("get {k:?}: {e}"));
        assert!(
            got == *v,
            "value of {k:?} differs ({} vs {} bytes)",
            got.len(),
            v.len()
        );
    }
    let usage = b.usage();
    assert_eq!(usage.object_count, model.len() as u64);
    assert_eq!(
        usage.used_bytes,
        model.values().map(|v| v.len() as u64).sum::<u64>()
    );
}

fn eviction(policy: EvictionPolicy, high: f64, low: f64) -> EvictionConfig {
    EvictionConfig {
        policy,
        enabled: true,
        high_watermark_ratio: high,
        low_watermark_ratio: low,
    }
}

fn recording_listener(b: &dyn StorageBackend) -> Arc<Mutex<Vec<String>>> {
    let evicted = Arc::new(Mutex::new(Vec::new()));
    let sink = evicted.clone();
    b.set_eviction_listener(Box::new(move |keys: &[String]| {
        sink.lock().unwrap().extend(keys.iter().cloned())
    }));
    evicted
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

// ------------------------------------------------------------------------------------------------
// round trips, overwrite, remove

pub fn round_trip_value_sizes(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 512 * MIB));
    let sizes = [0, 1, 7, 4095, 4096, 4097, 64 * KIB, MIB + 3, 64 * MIB];
    let mut model = BTreeMap::new();
    for (i, size) in sizes.iter().enumerate() {
        let key = format!("size-{size}");
        let value = value_for(&key, i as u64, *size as usize);
        put(&*b, &key, &value).unwrap_or_else(|e| panic!("put {size} bytes: {e}"));
        assert_eq!(b.size_of(&key), Some(*size));
        assert!(b.exists(&key));
        model.insert(key, value);
    }
    assert_holds_exactly(&*b, &model);
    // A buffer larger than the value is fine; the size returned is the value's.
    let mut big = [0xAAu8; 100];
    let n = b
        .get_batch(&["size-7"], &mut [&mut big[..]])
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(n, 7);
    assert_eq!(&big[..7], &model["size-7"][..]);
}

pub fn batch_results_are_per_entry_and_in_order(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 64 * MIB));
    let values: Vec<Vec<u8>> = (0..8)
        .map(|i| value_for("b", i, 1000 + i as usize * 17))
        .collect();
    let keys: Vec<String> = (0..8).map(|i| format!("batch-{i}")).collect();
    let entries: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let results = b.put_batch(&entries);
    assert_eq!(results.len(), 8);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    // Same key twice in one batch: the later entry wins.
    let dup = b.put_batch(&[("dup", b"first"), ("dup", b"second!")]);
    assert!(dup.iter().all(|r| r.is_ok()));
    assert_eq!(get(&*b, "dup").unwrap(), b"second!");
    // get_batch: mixed present/missing, results in input order.
    let mut bufs: Vec<Vec<u8>> = vec![vec![0; 2000], vec![0; 10], vec![0; 2000]];
    let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|v| v.as_mut_slice()).collect();
    let got = b.get_batch(&["batch-3", "missing", "batch-5"], &mut refs);
    assert_eq!(got.len(), 3);
    assert_eq!(*got[0].as_ref().unwrap(), values[3].len() as u64);
    assert_eq!(
        got[1].as_ref().unwrap_err().code(),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(*got[2].as_ref().unwrap(), values[5].len() as u64);
    assert_eq!(&bufs[0][..values[3].len()], &values[3][..]);
    assert_eq!(&bufs[2][..values[5].len()], &values[5][..]);
}

pub fn overwrite_replaces_value_and_accounting(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 64 * MIB));
    put(&*b, "k", &value_for("k", 1, 100_000)).unwrap();
    put(&*b, "k", &value_for("k", 2, 10)).unwrap();
    assert_eq!(get(&*b, "k").unwrap(), value_for("k", 2, 10));
    let u = b.usage();
    assert_eq!((u.used_bytes, u.object_count), (10, 1));
    put(&*b, "k", &value_for("k", 3, 300_000)).unwrap();
    assert_eq!(get(&*b, "k").unwrap(), value_for("k", 3, 300_000));
    assert_eq!(b.usage().used_bytes, 300_000);
    assert_eq!(
        sorted_scan(&*b),
        vec![ObjectInfo {
            key: "k".into(),
            size_bytes: 300_000
        }]
    );
}

pub fn remove_and_missing_keys(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 64 * MIB));
    put(&*b, "a", b"alpha").unwrap();
    put(&*b, "b", b"beta").unwrap();
    assert!(b.remove("a").unwrap());
    assert!(!b.remove("a").unwrap(), "second remove reports absent");
    assert!(!b.remove("never").unwrap());
    assert!(!b.exists("a"));
    assert_eq!(b.size_of("a"), None);
    assert_eq!(
        get(&*b, "a").unwrap_err().code(),
        ErrorCode::OBJECT_NOT_FOUND
    );
    let mut buf = [0u8; 8];
    let r = b.get_batch(&["a"], &mut [&mut buf[..]]).pop().unwrap();
    assert_eq!(r.unwrap_err().code(), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(get(&*b, "b").unwrap(), b"beta");
    assert_eq!(b.usage().used_bytes, 4);
    // A removed key can be written again.
    put(&*b, "a", b"again").unwrap();
    assert_eq!(get(&*b, "a").unwrap(), b"again");
}

pub fn small_buffer_is_buffer_overflow_and_changes_nothing(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 64 * MIB));
    put(&*b, "k", &value_for("k", 0, 5000)).unwrap();
    let mut small = vec![0u8; 4999];
    let r = b.get_batch(&["k"], &mut [&mut small[..]]).pop().unwrap();
    assert_eq!(r.unwrap_err().code(), ErrorCode::BUFFER_OVERFLOW);
    assert_eq!(get(&*b, "k").unwrap(), value_for("k", 0, 5000));
}

pub fn limits_are_errors_not_panics(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_key_bytes: 16,
        max_value_bytes: 1024,
        max_batch_entries: 4,
        max_open_files: 4,
    };
    let b = open_ok(open, &config(dir.path(), 64 * MIB).with_limits(limits));
    let long_key = "k".repeat(17);
    assert_eq!(
        put(&*b, &long_key, b"v").unwrap_err().code(),
        ErrorCode::INVALID_KEY
    );
    assert_eq!(
        put(&*b, "", b"v").unwrap_err().code(),
        ErrorCode::INVALID_KEY
    );
    assert_eq!(
        put(&*b, "big", &[0u8; 1025]).unwrap_err().code(),
        ErrorCode::INVALID_PARAMS
    );
    put(&*b, &"k".repeat(16), &[7u8; 1024]).unwrap();
    // A batch over the limit fails whole, one error per entry, and stores nothing.
    let five: Vec<(&str, &[u8])> = vec![
        ("a", b"1"),
        ("b", b"2"),
        ("c", b"3"),
        ("d", b"4"),
        ("e", b"5"),
    ];
    let r = b.put_batch(&five);
    assert_eq!(r.len(), 5);
    assert!(r
        .iter()
        .all(|x| x.as_ref().unwrap_err().code() == ErrorCode::INVALID_PARAMS));
    assert!(!b.exists("a"));
    // Bad entries fail alone; good ones in the same batch are stored.
    let mixed = b.put_batch(&[("ok1", b"x"), (&long_key, b"y"), ("ok2", b"z")]);
    assert!(mixed[0].is_ok() && mixed[2].is_ok());
    assert_eq!(
        mixed[1].as_ref().unwrap_err().code(),
        ErrorCode::INVALID_KEY
    );
    assert_eq!(get(&*b, "ok2").unwrap(), b"z");
    // Reads with over-long keys or too many keys are errors too.
    let mut bufs: Vec<Vec<u8>> = (0..5).map(|_| vec![0u8; 8]).collect();
    let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|v| v.as_mut_slice()).collect();
    let r = b.get_batch(&["ok1", "ok2", "a", "b", "c"], &mut refs);
    assert_eq!(r.len(), 5);
    assert!(r.iter().all(|x| x.is_err()));
    assert_eq!(b.size_of(&long_key), None);
    assert_eq!(b.usage().object_count, 3);
}

pub fn capacity_accounting_tracks_every_change(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 64 * MIB));
    assert_eq!(b.usage().capacity_bytes, 64 * MIB);
    assert_eq!((b.usage().used_bytes, b.usage().object_count), (0, 0));
    let mut expected = 0u64;
    for i in 0..20u64 {
        let size = 1000 * (i + 1);
        put(&*b, &format!("c{i}"), &value_for("c", i, size as usize)).unwrap();
        expected += size;
        assert_eq!(b.usage().used_bytes, expected);
    }
    assert!(b.remove("c0").unwrap());
    expected -= 1000;
    put(&*b, "c1", &[1u8; 5]).unwrap();
    expected = expected - 2000 + 5;
    let u = b.usage();
    assert_eq!((u.used_bytes, u.object_count), (expected, 19));
    assert_eq!(b.scan().iter().map(|o| o.size_bytes).sum::<u64>(), expected);
}

// ------------------------------------------------------------------------------------------------
// eviction

const UNIT: usize = 64 * 1024;

/// Writes `keys` one batch each with `UNIT`-byte values.
fn write_units(b: &dyn StorageBackend, keys: &[String]) {
    for (i, k) in keys.iter().enumerate() {
        put(b, k, &value_for(k, i as u64, UNIT)).unwrap_or_else(|e| panic!("put {k}: {e}"));
        let u = b.usage();
        assert!(
            u.used_bytes <= u.capacity_bytes,
            "over capacity after {k}: {u:?}"
        );
    }
}

fn keys(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i:03}")).collect()
}

/// Evicted keys must be exactly the first `evicted.len()` of `order`, each once.
fn assert_prefix(evicted: &[String], order: &[String]) {
    assert!(
        evicted.len() <= order.len(),
        "evicted more than expected: {evicted:?}"
    );
    assert_eq!(evicted, &order[..evicted.len()], "eviction order");
}

fn check_survivors(b: &dyn StorageBackend, evicted: &[String], all: &[String]) {
    for k in all {
        let gone = evicted.contains(k);
        assert_eq!(b.exists(k), !gone, "{k}: evicted={gone}");
        if gone {
            assert_eq!(get(b, k).unwrap_err().code(), ErrorCode::OBJECT_NOT_FOUND);
        }
    }
}

pub fn eviction_fifo_evicts_oldest_writes_first(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 10 * UNIT as u64).with_eviction(eviction(
        EvictionPolicy::Fifo,
        1.0,
        0.7,
    ));
    let b = open_ok(open, &cfg);
    let evicted = recording_listener(&*b);
    let all = keys("f", 0..20);
    write_units(&*b, &all[..10]);
    assert!(
        evicted.lock().unwrap().is_empty(),
        "no eviction while under the high watermark"
    );
    // Reads do not change FIFO order.
    get(&*b, &all[0]).unwrap();
    write_units(&*b, &all[10..]);
    let ev = evicted.lock().unwrap().clone();
    assert!(
        ev.len() >= 10,
        "20 units into 10 must evict at least 10, got {ev:?}"
    );
    assert_prefix(&ev, &all);
    check_survivors(&*b, &ev, &all);
    assert_eq!(b.usage().object_count as usize, 20 - ev.len());
}

pub fn eviction_lru_keeps_recently_read_objects(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let cfg =
        config(dir.path(), 10 * UNIT as u64).with_eviction(eviction(EvictionPolicy::Lru, 1.0, 0.7));
    let b = open_ok(open, &cfg);
    let evicted = recording_listener(&*b);
    let all = keys("l", 0..15);
    write_units(&*b, &all[..10]);
    get(&*b, &all[0]).unwrap();
    get(&*b, &all[1]).unwrap();
    write_units(&*b, &all[10..]);
    let ev = evicted.lock().unwrap().clone();
    let mut order: Vec<String> = all[2..10].to_vec();
    order.extend_from_slice(&all[..2]);
    order.extend_from_slice(&all[10..]);
    assert!(
        ev.len() >= 5,
        "15 units into 10 must evict at least 5, got {ev:?}"
    );
    assert_prefix(&ev, &order);
    assert!(
        b.exists(&all[0]) && b.exists(&all[1]),
        "recently read objects survive: {ev:?}"
    );
    check_survivors(&*b, &ev, &all);
}

pub fn eviction_order_survives_restart(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 10 * UNIT as u64).with_eviction(eviction(
        EvictionPolicy::Fifo,
        1.0,
        0.7,
    ));
    let all = keys("r", 0..12);
    {
        let b = open_ok(open, &cfg);
        write_units(&*b, &all[..10]);
        b.close().unwrap();
    }
    let b = open_ok(open, &cfg);
    let evicted = recording_listener(&*b);
    write_units(&*b, &all[10..]);
    let ev = evicted.lock().unwrap().clone();
    assert!(!ev.is_empty());
    assert_prefix(&ev, &all);
    check_survivors(&*b, &ev, &all);
}

pub fn eviction_listener_sees_keys_already_unindexed(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let cfg =
        config(dir.path(), 4 * UNIT as u64).with_eviction(eviction(EvictionPolicy::Fifo, 1.0, 0.5));
    let b: Arc<dyn StorageBackend> = Arc::from(open_ok(open, &cfg));
    let weak: Weak<dyn StorageBackend> = Arc::downgrade(&b);
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let (s, p) = (seen.clone(), problems.clone());
    b.set_eviction_listener(Box::new(move |keys: &[String]| {
        let Some(b) = weak.upgrade() else { return };
        for k in keys {
            // Index first, then listener: the evicted key is no longer visible...
            if b.exists(k) {
                p.lock()
                    .unwrap()
                    .push(format!("{k} still visible in listener"));
            }
        }
        // ...and the write that caused the eviction is not visible yet.
        if b.exists("e004") {
            p.lock()
                .unwrap()
                .push("incoming key visible before its space was freed".into());
        }
        let _ = b.usage();
        let _ = b.scan();
        s.lock().unwrap().extend(keys.iter().cloned());
    }));
    let all = keys("e", 0..5);
    write_units(&*b, &all);
    assert!(
        problems.lock().unwrap().is_empty(),
        "{:?}",
        problems.lock().unwrap()
    );
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the fifth unit must evict");
    assert_prefix(&seen, &all);
    assert!(b.exists("e004"));
}

pub fn full_store_without_eviction_is_file_write_fail_and_stays_readable(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let ev = EvictionConfig {
        enabled: false,
        ..EvictionConfig::default()
    };
    let cfg = config(dir.path(), 4 * UNIT as u64).with_eviction(ev);
    let b = open_ok(open, &cfg);
    let evicted = recording_listener(&*b);
    let all = keys("n", 0..5);
    write_units(&*b, &all[..4]);
    let err = put(&*b, &all[4], &value_for(&all[4], 4, UNIT)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FILE_WRITE_FAIL, "{err}");
    assert!(evicted.lock().unwrap().is_empty(), "eviction disabled");
    for (i, k) in all[..4].iter().enumerate() {
        assert_eq!(get(&*b, k).unwrap(), value_for(k, i as u64, UNIT));
    }
    assert!(!b.exists(&all[4]));
    // After a remove there is room again.
    assert!(b.remove(&all[0]).unwrap());
    put(&*b, &all[4], &value_for(&all[4], 4, UNIT)).unwrap();
}

/// Set to `1` where the root-only checks cannot run, to skip them with a loud line instead of
/// failing (`scripts/test` lists what was skipped).
pub const SKIP_ROOT_TESTS_ENV: &str = "MC_SKIP_ROOT_TESTS";
/// File that skipped checks append `name: reason` lines to (`scripts/test` sets it).
pub const SKIPPED_TESTS_FILE_ENV: &str = "MC_SKIPPED_TESTS_FILE";
/// Set in the child that reruns a check inside a new user and mount namespace.
const IN_USER_NAMESPACE_ENV: &str = "MC_TEST_IN_USER_NAMESPACE";

/// Mounts a small tmpfs (needs root, CAP_SYS_ADMIN, or a user namespace); unmounted on drop.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_bytes: u64) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).map_err(|e| format!("mkdir {path:?}: {e}"))?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_bytes}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs: {} {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs { path, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// Reruns the current test alone in a child process inside a new user and mount namespace
/// (`unshare --user --map-root-user --mount`), where an unprivileged user may mount a tmpfs.
/// `Ok(())` once the child passed that one test; `Err` says why no namespace could be had; a
/// child that ran and failed fails the caller.
fn rerun_in_user_namespace() -> Result<(), String> {
    // libtest runs each test on a thread named after it; that name selects it again.
    let name = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .map(str::to_string)
        .ok_or("the test thread has no test name to rerun")?;
    let probe = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .output()
        .map_err(|e| format!("running unshare: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "unshare --user --mount: {} {}",
            probe.status,
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let output = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount"])
        .arg(exe)
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(IN_USER_NAMESPACE_ENV, "1")
        .output()
        .map_err(|e| format!("running the child: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "child in a user namespace ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} failed in its user-namespace child ({})",
        output.status
    );
    Ok(())
}

/// Reports a check that cannot run here: fails, unless `MC_SKIP_ROOT_TESTS=1`, which turns it
/// into a loud `SKIPPED` line (also appended to `$MC_SKIPPED_TESTS_FILE`).
fn cannot_run(reason: &str) {
    let name = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    if std::env::var(SKIP_ROOT_TESTS_ENV).as_deref() != Ok("1") {
        panic!(
            "{name} cannot run here: {reason}. Run it as root (or with CAP_SYS_ADMIN, or where \
             unprivileged user namespaces are allowed), or set {SKIP_ROOT_TESTS_ENV}=1 to skip it"
        );
    }
    eprintln!("SKIPPED (needs root): {name}: {reason}");
    if let Some(path) = std::env::var_os(SKIPPED_TESTS_FILE_ENV) {
        use std::io::Write;
        let line = format!("{name}: {reason}\n");
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            panic!("{name} skipped, and recording that in {path:?} failed: {e}");
        }
    }
}

/// A real ENOSPC: the backend lives on a small tmpfs that a filler file has almost filled. The
/// tmpfs is mounted here when the process may (root, CAP_SYS_ADMIN), else in a child process
/// inside a user namespace; where neither works the test fails, or is skipped loudly with
/// `MC_SKIP_ROOT_TESTS=1`. Never passes without running.
pub fn full_disk_needs_root_is_file_write_fail_and_stays_readable(open: &Opener) {
    let fs = match Tmpfs::mount(40 * MIB) {
        Ok(fs) => fs,
        Err(why) if std::env::var_os(IN_USER_NAMESPACE_ENV).is_some() => {
            panic!("inside the user namespace the tmpfs must mount: {why}")
        }
        Err(mount_error) => {
            if let Err(namespace_error) = rerun_in_user_namespace() {
                cannot_run(&format!(
                    "mounting a tmpfs failed ({mount_error}) and so did a user namespace \
                     ({namespace_error})"
                ));
            }
            return;
        }
    };
    let root = fs.path.join("store");
    let ev = EvictionConfig {
        enabled: false,
        ..EvictionConfig::default()
    };
    let cfg = config(&root, 16 * MIB).with_eviction(ev);
    let b = match open(cfg.clone()) {
        Ok(b) => b,
        Err(e) => panic!("open on tmpfs: {e}"),
    };
    // Fill the file system, then give back 1 MiB.
    let filler = fs.path.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; MIB as usize];
        while f.write_all(&chunk).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(MIB)).unwrap();
    }
    let mut acked = BTreeMap::new();
    let mut failure = None;
    for i in 0..200u64 {
        let k = format!("full{i:03}");
        let v = value_for(&k, i, 256 * KIB as usize);
        match put(&*b, &k, &v) {
            Ok(()) => {
                acked.insert(k, v);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let err = failure.expect("a full disk must fail a write within 200 puts");
    assert_eq!(err.code(), ErrorCode::FILE_WRITE_FAIL, "{err}");
    assert_holds_exactly(&*b, &acked);
    b.close().unwrap();
    drop(b);
    std::fs::remove_file(&filler).unwrap();
    let b = open_ok(open, &cfg);
    assert_holds_exactly(&*b, &acked);
    b.close().unwrap();
}

// ------------------------------------------------------------------------------------------------
// concurrency

/// Values carry their own seed in the first 8 bytes so any reader can check a whole value.
fn self_describing(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(8)];
    v[..8].copy_from_slice(&seed.to_le_bytes());
    mooncake_storage::testkit::fill_pattern(seed, &mut v[8..]);
    v
}

fn is_whole(v: &[u8]) -> bool {
    if v.len() < 8 {
        return false;
    }
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&v[..8]);
    self_describing(u64::from_le_bytes(seed), v.len()) == v
}

pub fn concurrent_readers_and_writers_see_only_whole_values(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b: Arc<dyn StorageBackend> = Arc::from(open_ok(open, &config(dir.path(), 256 * MIB)));
    let deadline = Instant::now() + Duration::from_secs(60);
    let writers = 4u64;
    let per_writer = 60u64;
    let writers_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for w in 0..writers {
        let b = b.clone();
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng::new(w);
            let mut last = BTreeMap::new();
            for i in 0..per_writer {
                let own = format!("w{w}-{}", i % 8);
                let shared = format!("shared-{}", i % 4);
                let v1 = self_describing(rng.next_u64(), 8 + rng.below(40_000) as usize);
                let v2 = self_describing(rng.next_u64(), 8 + rng.below(40_000) as usize);
                let r = b.put_batch(&[(&own, &v1), (&shared, &v2)]);
                assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
                last.insert(own, v1);
                if i % 10 == 9 {
                    let victim = format!("w{w}-{}", rng.below(8));
                    if b.remove(&victim).unwrap() {
                        last.remove(&victim);
                    }
                }
                assert!(Instant::now() < deadline, "writer too slow");
            }
            last
        }));
    }
    let mut readers = Vec::new();
    for r in 0..4u64 {
        let b = b.clone();
        let done = writers_done.clone();
        readers.push(std::thread::spawn(move || {
            let mut rng = Rng::new(100 + r);
            let mut buf = vec![0u8; 50_000];
            let mut whole = 0u64;
            // Read until the writers are done (and at least 100 times).
            for i in 0.. {
                if i >= 100 && done.load(std::sync::atomic::Ordering::Acquire) {
                    break;
                }
                let key = if rng.below(2) == 0 {
                    format!("shared-{}", rng.below(4))
                } else {
                    format!("w{}-{}", rng.below(writers), rng.below(8))
                };
                match b.get_batch(&[&key], &mut [&mut buf[..]]).pop().unwrap() {
                    Ok(n) => {
                        assert!(
                            is_whole(&buf[..n as usize]),
                            "torn or foreign value for {key}"
                        );
                        whole += 1;
                    }
                    Err(StorageError::NotFound) => {}
                    Err(e) => panic!("read {key}: {e}"),
                }
                let _ = b.scan();
                if Instant::now() > deadline {
                    break;
                }
            }
            whole
        }));
    }
    let mut model = BTreeMap::new();
    for h in handles {
        model.extend(h.join().unwrap());
    }
    writers_done.store(true, std::sync::atomic::Ordering::Release);
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(reads > 0, "readers never saw a value");
    for (k, v) in &model {
        assert!(get(&*b, k).unwrap() == *v, "last write of {k} lost");
    }
    for i in 0..4 {
        assert!(is_whole(&get(&*b, &format!("shared-{i}")).unwrap()));
    }
    let expect_count = model.len() as u64 + 4;
    assert_eq!(b.usage().object_count, expect_count);
}

// ------------------------------------------------------------------------------------------------
// restart and lifecycle

pub fn restart_finds_exactly_the_acknowledged_objects(open: &Opener) {
    for durability in [Durability::None, Durability::Batch, Durability::Always] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), 256 * MIB).with_durability(durability);
        let mut model = BTreeMap::new();
        let mut rng = Rng::new(durability as u64);
        {
            let b = open_ok(open, &cfg);
            for batch in 0..6u64 {
                let ks: Vec<String> = (0..5).map(|i| format!("obj-{batch}-{i}")).collect();
                let vs: Vec<Vec<u8>> = ks
                    .iter()
                    .map(|k| value_for(k, batch, rng.below(200_000) as usize))
                    .collect();
                let entries: Vec<(&str, &[u8])> = ks
                    .iter()
                    .zip(&vs)
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                assert!(b.put_batch(&entries).iter().all(|r| r.is_ok()));
                model.extend(ks.into_iter().zip(vs));
            }
            for i in 0..5 {
                let k = format!("obj-{i}-0");
                let v = value_for(&k, 99, 3000 + i);
                put(&*b, &k, &v).unwrap();
                model.insert(k, v);
                let gone = format!("obj-{i}-1");
                assert!(b.remove(&gone).unwrap());
                model.remove(&gone);
            }
            assert_holds_exactly(&*b, &model);
            b.close().unwrap();
        }
        let b = open_ok(open, &cfg);
        assert_holds_exactly(&*b, &model);
        // Keep writing after a restart, then restart again without an explicit close.
        put(&*b, "after", b"restart").unwrap();
        assert!(b.remove("obj-5-4").unwrap());
        model.insert("after".into(), b"restart".to_vec());
        model.remove("obj-5-4");
        drop(b);
        let b = open_ok(open, &cfg);
        assert_holds_exactly(&*b, &model);
    }
}

pub fn closed_backend_refuses_operations(open: &Opener) {
    let dir = tempfile::tempdir().unwrap();
    let b = open_ok(open, &config(dir.path(), 64 * MIB));
    put(&*b, "k", b"v").unwrap();
    b.close().unwrap();
    let code = ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    assert_eq!(put(&*b, "k2", b"v").unwrap_err().code(), code);
    let mut buf = [0u8; 4];
    assert_eq!(
        b.get_batch(&["k"], &mut [&mut buf[..]])[0]
            .as_ref()
            .unwrap_err()
            .code(),
        code
    );
    assert_eq!(b.remove("k").unwrap_err().code(), code);
    let _ = b.close();
}

// ------------------------------------------------------------------------------------------------
// corruption: flipped bytes and truncated files

/// Writes 24 objects, closes, damages files with `damage`, reopens, and checks that every read
/// returns either the exact acknowledged value or an error (never other bytes), that every record
/// that failed is dropped from the index, and that a second restart agrees.
fn damage_and_check(open: &Opener, seed: u64, damage: &dyn Fn(&Path, &mut Rng)) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 * MIB);
    let mut model = BTreeMap::new();
    let mut rng = Rng::new(seed);
    {
        let b = open_ok(open, &cfg);
        for batch in 0..6u64 {
            let ks: Vec<String> = (0..4).map(|i| format!("dmg-{batch}-{i}")).collect();
            let vs: Vec<Vec<u8>> = ks
                .iter()
                .map(|k| value_for(k, seed, 1 + rng.below(40_000) as usize))
                .collect();
            let entries: Vec<(&str, &[u8])> = ks
                .iter()
                .zip(&vs)
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            assert!(b.put_batch(&entries).iter().all(|r| r.is_ok()));
            model.extend(ks.into_iter().zip(vs));
        }
        b.close().unwrap();
    }
    // Damage a random non-empty subset of the files.
    let files = files_under(dir.path());
    assert!(!files.is_empty(), "the backend wrote no files");
    let forced = rng.below(files.len() as u64) as usize;
    for (i, f) in files.iter().enumerate() {
        if i == forced || rng.below(2) == 0 {
            damage(f, &mut rng);
        }
    }
    let b = match open(cfg.clone()) {
        Ok(b) => b,
        Err(e) => panic!("reopen after damage must recover, not fail: {e}"),
    };
    let keys_listed: BTreeSet<String> = b.scan().into_iter().map(|o| o.key).collect();
    for k in &keys_listed {
        assert!(
            model.contains_key(k),
            "scan lists a key that was never written: {k:?}"
        );
    }
    let mut intact = BTreeMap::new();
    for (k, v) in &model {
        match get(&*b, k) {
            Ok(got) => {
                assert!(got == *v, "damaged bytes returned for {k:?}");
                intact.insert(k.clone(), v.clone());
            }
            Err(e) => {
                let c = e.code();
                assert!(
                    c == ErrorCode::FILE_READ_FAIL || c == ErrorCode::OBJECT_NOT_FOUND,
                    "{k}: unexpected error {e}"
                );
                assert!(
                    !b.exists(k),
                    "{k}: failed record still indexed after the failure"
                );
            }
        }
    }
    assert_holds_exactly(&*b, &intact);
    eprintln!(
        "damage seed {seed}: {} of {} objects intact",
        intact.len(),
        model.len()
    );
    b.close().unwrap();
    drop(b);
    let b = open_ok(open, &cfg);
    assert_holds_exactly(&*b, &intact);
}

/// Offset one past the last non-zero byte: damage aimed below it hits written data even in a
/// preallocated, mostly empty file.
fn written_extent(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)
}

pub fn flipped_bytes_are_detected_never_returned(open: &Opener) {
    for seed in 0..4 {
        damage_and_check(open, seed, &|path, rng| {
            let mut bytes = std::fs::read(path).unwrap();
            let extent = written_extent(&bytes);
            if extent == 0 {
                return;
            }
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(extent as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
            std::fs::write(path, bytes).unwrap();
        });
    }
}

pub fn truncated_files_lose_only_damaged_records(open: &Opener) {
    for seed in 10..14 {
        damage_and_check(open, seed, &|path, rng| {
            let extent = written_extent(&std::fs::read(path).unwrap()) as u64;
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(rng.below(extent.max(1))).unwrap();
        });
    }
}

// ------------------------------------------------------------------------------------------------
// model check

/// Random puts (batches, overwrites, duplicate keys in a batch), removes, reads and restarts,
/// compared after every step with a `BTreeMap` model.
pub fn random_operations_match_a_model(open: &Opener) {
    for seed in 0..3u64 {
        let dir = tempfile::tempdir().unwrap();
        let durability = [Durability::None, Durability::Batch, Durability::Always][seed as usize];
        let cfg = config(dir.path(), 256 * MIB).with_durability(durability);
        let mut b = open_ok(open, &cfg);
        let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut rng = Rng::new(1000 + seed);
        for step in 0..300u64 {
            let key = |rng: &mut Rng| format!("m{}", rng.below(40));
            match rng.below(20) {
                0..=9 => {
                    let n = 1 + rng.below(4) as usize;
                    let ks: Vec<String> = (0..n).map(|_| key(&mut rng)).collect();
                    let vs: Vec<Vec<u8>> = ks
                        .iter()
                        .map(|k| value_for(k, step, rng.below(20_000) as usize))
                        .collect();
                    let entries: Vec<(&str, &[u8])> = ks
                        .iter()
                        .zip(&vs)
                        .map(|(k, v)| (k.as_str(), v.as_slice()))
                        .collect();
                    for (i, r) in b.put_batch(&entries).into_iter().enumerate() {
                        r.unwrap_or_else(|e| panic!("step {step}: put {}: {e}", ks[i]));
                    }
                    model.extend(ks.into_iter().zip(vs));
                }
                10..=12 => {
                    let k = key(&mut rng);
                    let was = b.remove(&k).unwrap();
                    assert_eq!(was, model.remove(&k).is_some(), "step {step}: remove {k}");
                }
                13..=18 => {
                    let k = key(&mut rng);
                    match (get(&*b, &k), model.get(&k)) {
                        (Ok(v), Some(m)) => assert!(v == *m, "step {step}: {k} differs"),
                        (Err(e), None) => {
                            assert_eq!(e.code(), ErrorCode::OBJECT_NOT_FOUND, "step {step}")
                        }
                        (got, want) => panic!(
                            "step {step}: {k}: got {:?}, model has {:?} bytes",
                            got.map(|v| v.len()),
                            want.map(|v| v.len())
                        ),
                    }
                }
                _ => {
                    b.close().unwrap();
                    drop(b);
                    b = open_ok(open, &cfg);
                }
            }
            let u = b.usage();
            assert_eq!(
                u.object_count,
                model.len() as u64,
                "step {step}: object count"
            );
            assert_eq!(
                u.used_bytes,
                model.values().map(|v| v.len() as u64).sum::<u64>(),
                "step {step}: used bytes"
            );
        }
        assert_holds_exactly(&*b, &model);
        b.close().unwrap();
        drop(b);
        let b = open_ok(open, &cfg);
        assert_holds_exactly(&*b, &model);
    }
}
