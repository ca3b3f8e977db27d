//! Behaviour specific to the log backend beyond the shared conformance suite: space recycling
//! through checkpoints, a full data file, eviction driven by allocation failure, eviction
//! listener ordering against space reuse, concurrent overwrites and recovery agreeing with them.
#![allow(clippy::unwrap_used)]

use mooncake_common::ErrorCode;
use mooncake_storage::log::{LogBackend, LogOptions, DATA_FILE};
use mooncake_storage::{
    BackendConfig, Durability, EvictionConfig, EvictionPolicy, StorageBackend, StorageError,
};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "mooncake-logb-test-{}-{tag}-{n}",
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

/// A data file with almost no headroom beyond the capacity, so tests reach "file full" quickly.
fn tight() -> LogOptions {
    LogOptions {
        min_headroom_bytes: 0,
        headroom_ratio: 0.125,
        ..LogOptions::default()
    }
}

fn config(dir: &Path, capacity_bytes: u64, eviction: bool) -> BackendConfig {
    let mut c = BackendConfig::new(dir, capacity_bytes);
    c.durability = Durability::Batch;
    c.eviction = EvictionConfig {
        policy: EvictionPolicy::Fifo,
        enabled: eviction,
        high_watermark_ratio: 0.95,
        low_watermark_ratio: 0.8,
    };
    c
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Reads `key` whole. A concurrent overwrite may grow the value between `size_of` and the read;
/// the backend then answers `BufferTooSmall` (the right answer), and the helper asks again.
fn get(b: &LogBackend, key: &str) -> Result<Vec<u8>, StorageError> {
    let mut attempts = 0;
    loop {
        let size = b.size_of(key).ok_or(StorageError::NotFound)?;
        let mut buf = vec![0u8; size as usize];
        match b.get_batch(&[key], &mut [&mut buf[..]]).pop().unwrap() {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            Err(StorageError::BufferTooSmall { .. }) if attempts < 100 => attempts += 1,
            Err(e) => return Err(e),
        }
    }
}

fn put(b: &LogBackend, key: &str, v: &[u8]) -> Result<(), StorageError> {
    b.put_batch(&[(key, v)]).pop().unwrap()
}

#[test]
fn quarantined_space_is_recycled_by_a_checkpoint_when_the_file_fills() {
    let dir = TempDir::new("recycle");
    // 1 MiB of capacity, 288 blocks of file: a 512 KiB record takes 129 blocks, so the third
    // overwrite already needs the space the first one freed.
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    let mut last = Vec::new();
    for i in 0..30u64 {
        last = value(i, 512 << 10);
        put(&b, "hot", &last).unwrap_or_else(|e| panic!("overwrite {i}: {e}"));
    }
    assert_eq!(get(&b, "hot").unwrap(), last);
    let stats = b.stats();
    assert!(
        stats.checkpoints >= 10,
        "space came back through checkpoints: {stats:?}"
    );
    assert_eq!(b.usage().used_bytes, 512 << 10);
    b.abandon();
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    assert_eq!(get(&b, "hot").unwrap(), last);
    assert_eq!(b.scan().len(), 1);
}

#[test]
fn full_data_file_is_no_space_and_the_store_stays_readable() {
    let dir = TempDir::new("fullfile");
    // Tiny values: every record takes two blocks (8 KiB) although it holds 10 bytes, so the
    // file fills long before the value capacity does.
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    let mut stored = BTreeMap::new();
    let mut failure = None;
    for i in 0..1000u64 {
        let key = format!("tiny-{i:04}");
        let v = value(i, 10);
        match put(&b, &key, &v) {
            Ok(()) => {
                stored.insert(key, v);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let err = failure.expect("a 288-block file cannot hold 1000 two-block records");
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err:?}");
    assert_eq!(err.code(), ErrorCode::FILE_WRITE_FAIL);
    assert_eq!(stored.len(), 144, "288 blocks / 2 blocks per record");
    assert!(b.usage().used_bytes < b.usage().capacity_bytes);
    for (k, v) in &stored {
        assert_eq!(&get(&b, k).unwrap(), v, "{k} readable after NoSpace");
    }
    // A failed batch stores none of its entries and leaves the accounting alone.
    let before = b.usage();
    let r = b.put_batch(&[("x1", &[1u8; 10][..]), ("x2", &[2u8; 10][..])]);
    assert!(r.iter().all(|r| r.is_err()), "{r:?}");
    assert_eq!(b.usage(), before);
    // Removing one object makes room for exactly one more.
    assert!(b.remove("tiny-0000").unwrap());
    put(&b, "again", b"fits now").unwrap();
    assert_eq!(get(&b, "again").unwrap(), b"fits now");
}

#[test]
fn full_data_file_with_eviction_evicts_oldest_objects_to_make_room() {
    let dir = TempDir::new("fullevict");
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, true), tight()).unwrap();
    let evicted = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = evicted.clone();
    b.set_eviction_listener(Box::new(move |keys: &[String]| {
        sink.lock().unwrap().extend(keys.iter().cloned())
    }));
    let keys: Vec<String> = (0..400).map(|i| format!("small-{i:04}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&b, k, &value(i as u64, 10)).unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    let ev = evicted.lock().unwrap().clone();
    assert!(ev.len() >= 400 - 144, "evicted {} of 400", ev.len());
    assert_eq!(&ev[..], &keys[..ev.len()], "oldest first, each once");
    for (i, k) in keys.iter().enumerate() {
        let gone = ev.contains(k);
        assert_eq!(b.exists(k), !gone, "{k}");
        if !gone {
            assert_eq!(get(&b, k).unwrap(), value(i as u64, 10));
        }
    }
    // Evicted keys stay gone after a crash.
    let survivors: Vec<String> = keys.iter().filter(|k| !ev.contains(k)).cloned().collect();
    b.abandon();
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, true), tight()).unwrap();
    let mut listed: Vec<String> = b.scan().into_iter().map(|o| o.key).collect();
    listed.sort();
    assert_eq!(listed, survivors);
}

#[test]
fn eviction_listener_runs_before_the_evicted_bytes_are_overwritten() {
    let dir = TempDir::new("listener");
    let unit = 64 << 10;
    let mut cfg = config(&dir.0, 8 * unit as u64, true);
    cfg.eviction.high_watermark_ratio = 1.0;
    cfg.eviction.low_watermark_ratio = 0.5;
    let b = Arc::new(LogBackend::open_with(cfg, tight()).unwrap());
    // key -> (record offset, value) of every object written.
    let old = Arc::new(Mutex::new(BTreeMap::new()));
    let write = |i: u64| {
        let k = format!("u{i}");
        let v = value(i, unit);
        put(&b, &k, &v).unwrap();
        let (offset, _) = b.record_location(&k).unwrap();
        old.lock().unwrap().insert(k, (offset, v));
    };
    for i in 0..8u64 {
        write(i);
    }
    // In the listener, the evicted record's value bytes must still be on disk untouched.
    let data = dir.0.join(DATA_FILE);
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::new(Mutex::new(0usize));
    let (p, s, o) = (problems.clone(), seen.clone(), old.clone());
    let weak = Arc::downgrade(&b);
    b.set_eviction_listener(Box::new(move |keys: &[String]| {
        let file = std::fs::File::open(&data).unwrap();
        let old = o.lock().unwrap();
        for k in keys {
            let (offset, v) = &old[k];
            let mut buf = vec![0u8; v.len()];
            file.read_exact_at(&mut buf, offset + 4096).unwrap();
            if &buf != v {
                p.lock()
                    .unwrap()
                    .push(format!("{k}: bytes reused before the listener ran"));
            }
            if weak.upgrade().is_some_and(|b| b.exists(k)) {
                p.lock()
                    .unwrap()
                    .push(format!("{k}: still indexed in the listener"));
            }
        }
        *s.lock().unwrap() += keys.len();
    }));
    for i in 8..30u64 {
        write(i);
    }
    assert!(*seen.lock().unwrap() >= 22, "evictions happened");
    assert!(
        problems.lock().unwrap().is_empty(),
        "{:?}",
        problems.lock().unwrap()
    );
}

#[test]
fn concurrent_overwrites_of_one_key_agree_with_recovery() {
    let dir = TempDir::new("race");
    let b = Arc::new(LogBackend::open_with(config(&dir.0, 64 << 20, false), tight()).unwrap());
    let mut handles = Vec::new();
    for t in 0..4u64 {
        let b = b.clone();
        handles.push(std::thread::spawn(move || {
            for i in 0..40u64 {
                let v = value(t * 1000 + i, 1000 + (i as usize * 37) % 9000);
                b.put_batch(&[("contended", &v[..]), (&format!("own-{t}"), &v[..])])
                    .into_iter()
                    .for_each(|r| r.unwrap());
                if i % 7 == 0 {
                    let _ = get(&b, "contended").unwrap();
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let winner = get(&b, "contended").unwrap();
    let owns: Vec<Vec<u8>> = (0..4)
        .map(|t| get(&b, &format!("own-{t}")).unwrap())
        .collect();
    assert_eq!(b.usage().object_count, 5);
    let b = Arc::try_unwrap(b).unwrap();
    b.abandon();
    let b = LogBackend::open_with(config(&dir.0, 64 << 20, false), tight()).unwrap();
    assert_eq!(
        get(&b, "contended").unwrap(),
        winner,
        "recovery picks the same winner"
    );
    for (t, v) in owns.iter().enumerate() {
        assert_eq!(&get(&b, &format!("own-{t}")).unwrap(), v);
    }
    assert_eq!(b.usage().object_count, 5);
    assert_eq!(b.recovery_report().dropped_corrupt, 0);
}

#[test]
fn checkpoints_are_taken_periodically() {
    let dir = TempDir::new("periodic");
    let options = LogOptions {
        checkpoint_interval_ms: 0,
        ..tight()
    };
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), options).unwrap();
    let before = b.stats().checkpoints;
    for i in 0..3u64 {
        put(&b, &format!("k{i}"), b"v").unwrap();
    }
    assert_eq!(b.stats().checkpoints, before + 3);
    b.abandon();
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    let report = b.recovery_report();
    assert_eq!(
        (report.from_checkpoint, report.from_scan),
        (3, 0),
        "{report:?}"
    );
}

#[test]
fn reopening_with_a_larger_capacity_grows_the_file_and_keeps_the_data() {
    let dir = TempDir::new("grow");
    {
        let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
        put(&b, "k", &value(1, 300_000)).unwrap();
        b.close().unwrap();
    }
    let small_len = std::fs::metadata(dir.0.join(DATA_FILE)).unwrap().len();
    let b = LogBackend::open_with(config(&dir.0, 4 << 20, false), tight()).unwrap();
    assert!(std::fs::metadata(dir.0.join(DATA_FILE)).unwrap().len() > small_len);
    assert_eq!(get(&b, "k").unwrap(), value(1, 300_000));
    put(&b, "big", &value(2, 3 << 20)).unwrap();
    assert_eq!(get(&b, "big").unwrap(), value(2, 3 << 20));
}

#[test]
fn durability_policies_all_round_trip_through_a_crash_image() {
    for durability in [Durability::None, Durability::Batch, Durability::Always] {
        let dir = TempDir::new("policy");
        let mut cfg = config(&dir.0, 4 << 20, false);
        cfg.durability = durability;
        let b = LogBackend::open_with(cfg.clone(), tight()).unwrap();
        let vs: Vec<Vec<u8>> = (0..5).map(|i| value(i, 20_000 + i as usize)).collect();
        let keys: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
        let entries: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&vs)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        assert!(b.put_batch(&entries).iter().all(|r| r.is_ok()));
        assert!(b.remove("p0").unwrap());
        b.abandon();
        let b = LogBackend::open_with(cfg, tight()).unwrap();
        assert!(!b.exists("p0"), "{durability:?}");
        for i in 1..5 {
            assert_eq!(
                get(&b, &keys[i]).unwrap(),
                vs[i],
                "{durability:?} {}",
                keys[i]
            );
        }
    }
}

#[test]
fn keys_that_spill_into_a_second_head_block_round_trip_and_recover() {
    let dir = TempDir::new("longkey");
    let long = "x".repeat(4096); // 48 + 4096 bytes: the head takes two blocks
    let tenant_key = "tenant\0user-key".to_string();
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    put(&b, &long, &value(1, 5000)).unwrap();
    put(&b, &tenant_key, &value(2, 100)).unwrap();
    put(&b, "empty", b"").unwrap();
    assert_eq!(b.record_location(&long).unwrap().1, 2 + 2);
    assert_eq!(b.record_location("empty").unwrap().1, 1);
    assert_eq!(get(&b, &long).unwrap(), value(1, 5000));
    let too_long = "x".repeat(4097);
    assert!(matches!(
        put(&b, &too_long, b"v"),
        Err(StorageError::KeyTooLong {
            len: 4097,
            max: 4096
        })
    ));
    b.abandon();
    let b = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    assert_eq!(get(&b, &long).unwrap(), value(1, 5000));
    assert_eq!(get(&b, &tenant_key).unwrap(), value(2, 100));
    assert_eq!(get(&b, "empty").unwrap(), b"");
    assert_eq!(b.recovery_report().from_scan, 3);
}

#[test]
fn invalid_configuration_is_refused_at_open() {
    let dir = TempDir::new("badcfg");
    let err = LogBackend::open_with(config(&dir.0, 0, false), tight()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::INVALID_PARAMS, "{err}");
    let mut cfg = config(&dir.0, 1 << 20, true);
    cfg.eviction.low_watermark_ratio = 0.99;
    cfg.eviction.high_watermark_ratio = 0.5;
    assert!(LogBackend::open_with(cfg, tight()).is_err());
    let bad = LogOptions {
        headroom_ratio: f64::NAN,
        ..tight()
    };
    assert!(LogBackend::open_with(config(&dir.0, 1 << 20, false), bad).is_err());
    assert!(
        !dir.0.join(DATA_FILE).exists(),
        "nothing created by a refused open"
    );
}

#[test]
fn a_second_open_of_the_same_root_is_refused_until_the_first_closes() {
    let dir = TempDir::new("lock");
    let first = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    put(&first, "k", b"v").unwrap();
    let err = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    assert_eq!(
        get(&first, "k").unwrap(),
        b"v",
        "the refused open changed nothing"
    );
    first.close().unwrap();
    let second = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    assert_eq!(get(&second, "k").unwrap(), b"v");
    drop(first);
    drop(second);
    // Dropping releases the lock too.
    let third = LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap();
    assert!(third.exists("k"));
}

#[test]
fn checkpoints_make_progress_under_a_stream_of_reads() {
    let dir = TempDir::new("starve");
    let b = Arc::new(LogBackend::open_with(config(&dir.0, 1 << 20, false), tight()).unwrap());
    put(&b, "read-me", &value(0, 64 << 10)).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(get(&b, "read-me").unwrap(), value(0, 64 << 10));
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    // Every third overwrite needs space only a checkpoint gives back.
    let started = std::time::Instant::now();
    for i in 0..20u64 {
        put(&b, "hot", &value(i, 400 << 10)).unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "writer starved after {i} overwrites"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(reads > 0);
    assert!(b.stats().checkpoints >= 5, "{:?}", b.stats());
    assert_eq!(get(&b, "hot").unwrap(), value(19, 400 << 10));
}
