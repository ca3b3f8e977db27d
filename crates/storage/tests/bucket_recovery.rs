//! Bucket-specific recovery images: lost metas, torn open buckets, orphan files. Each builds an
//! image with the real backend, damages it the way a crash or a bad disk would, and reopens.
#![allow(clippy::unwrap_used)]

use mooncake_storage::testkit::value_for;
use mooncake_storage::{BackendConfig, BucketBackend, BucketOptions, StorageBackend};
use std::path::{Path, PathBuf};

fn open(dir: &Path) -> BucketBackend {
    let options = BucketOptions {
        bucket_size_limit_bytes: 1 << 20,
        ..BucketOptions::default()
    };
    BucketBackend::open_with(BackendConfig::new(dir, 1 << 30), options).unwrap()
}

fn put(b: &dyn StorageBackend, key: &str, value: &[u8]) {
    b.put_batch(&[(key, value)]).pop().unwrap().unwrap();
}

fn get(b: &dyn StorageBackend, key: &str) -> Option<Vec<u8>> {
    let size = b.size_of(key)?;
    let mut buf = vec![0u8; size as usize];
    b.get_batch(&[key], &mut [&mut buf[..]])
        .pop()
        .unwrap()
        .unwrap();
    Some(buf)
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn removed_key_stays_removed_when_its_bucket_meta_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = open(dir.path());
        put(&b, "gone", b"old value");
        put(&b, "kept", b"kept value");
        b.flush().unwrap(); // seals the bucket holding both
        assert!(b.remove("gone").unwrap());
        b.close().unwrap();
    }
    // Lose every meta: start-up must rebuild from the data files alone.
    for m in files(dir.path(), "meta") {
        std::fs::remove_file(m).unwrap();
    }
    let b = open(dir.path());
    assert_eq!(get(&b, "gone"), None, "a removed key came back from a scan");
    assert_eq!(get(&b, "kept").unwrap(), b"kept value");
}

#[test]
fn overwritten_key_keeps_its_new_value_when_old_bucket_meta_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = open(dir.path());
        put(&b, "k", b"v1");
        put(&b, "other", b"x");
        b.flush().unwrap();
        put(&b, "k", b"v2");
        b.flush().unwrap();
        assert!(b.remove("k").unwrap());
        put(&b, "k", b"v3");
        b.close().unwrap();
    }
    for m in files(dir.path(), "meta") {
        std::fs::remove_file(m).unwrap();
    }
    let b = open(dir.path());
    assert_eq!(get(&b, "k").unwrap(), b"v3");
    assert_eq!(get(&b, "other").unwrap(), b"x");
    assert_eq!(b.usage().object_count, 2);
}

#[test]
fn unsealed_bucket_is_scanned_and_its_torn_tail_cut() {
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<Vec<u8>> = (0..5)
        .map(|i| value_for("t", i, 1000 + i as usize))
        .collect();
    {
        let b = open(dir.path());
        for (i, v) in values.iter().enumerate() {
            put(&b, &format!("t{i}"), v);
        }
        // Dropped without close: the open bucket has no meta, as after a SIGKILL.
    }
    assert!(files(dir.path(), "meta").is_empty());
    let data = files(dir.path(), "bucket").pop().unwrap();
    let len = std::fs::metadata(&data).unwrap().len();
    // Tear the last record (as a crash mid-write would).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let b = open(dir.path());
    for (i, v) in values.iter().enumerate().take(4) {
        assert_eq!(get(&b, &format!("t{i}")).unwrap(), *v);
    }
    assert_eq!(get(&b, "t4"), None, "the torn record must be dropped");
    let cut = std::fs::metadata(&data).unwrap().len();
    assert!(cut < len - 10, "the torn tail is cut off ({cut} vs {len})");
    assert_eq!(
        files(dir.path(), "meta").len(),
        1,
        "the recovered bucket is sealed"
    );
    // Writing after the recovery appends to a new bucket and survives another restart.
    put(&b, "t4", &values[4]);
    b.close().unwrap();
    let b = open(dir.path());
    assert_eq!(get(&b, "t4").unwrap(), values[4]);
}

#[test]
fn meta_length_mismatch_falls_back_to_a_scan_and_orphan_meta_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = open(dir.path());
        put(&b, "a", b"alpha");
        put(&b, "b", b"beta");
        b.close().unwrap();
    }
    let data = files(dir.path(), "bucket").pop().unwrap();
    // Garbage after the last record: the meta's data_len no longer matches.
    let mut bytes = std::fs::read(&data).unwrap();
    bytes.extend_from_slice(&[0xEE; 100]);
    std::fs::write(&data, &bytes).unwrap();
    // And an orphan meta whose data file is gone (crash between the two deletions).
    std::fs::write(dir.path().join("12345.meta"), b"whatever").unwrap();
    let b = open(dir.path());
    assert_eq!(get(&b, "a").unwrap(), b"alpha");
    assert_eq!(get(&b, "b").unwrap(), b"beta");
    assert_eq!(
        std::fs::metadata(&data).unwrap().len(),
        bytes.len() as u64 - 100
    );
    assert!(!dir.path().join("12345.meta").exists());
}
