//! File-per-key layout checks: foreign, misplaced (colliding) and leftover files are never
//! indexed or returned; a file that holds another key is caught by the key check on read.
#![allow(clippy::unwrap_used)]

use mooncake_common::ErrorCode;
use mooncake_storage::file::key_hash;
use mooncake_storage::{BackendConfig, FileBackend, StorageBackend};
use std::path::{Path, PathBuf};

fn path_for(root: &Path, key: &str, slot: u16) -> PathBuf {
    let h = key_hash(key);
    root.join(format!("{:02x}", h >> 56))
        .join(format!("{:02x}", (h >> 48) & 0xff))
        .join(format!("{h:016x}-{slot}"))
}

fn open(dir: &Path) -> FileBackend {
    FileBackend::open(BackendConfig::new(dir, 1 << 30)).unwrap()
}

fn get(b: &dyn StorageBackend, key: &str) -> Result<Vec<u8>, mooncake_storage::StorageError> {
    let mut buf = vec![0u8; 1024];
    let n = b.get_batch(&[key], &mut [&mut buf[..]]).pop().unwrap()?;
    buf.truncate(n as usize);
    Ok(buf)
}

#[test]
fn files_live_at_their_documented_paths() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.put_batch(&[("alpha", b"1"), ("beta", b"22")]);
    let bytes = std::fs::read(path_for(dir.path(), "alpha", 0)).unwrap();
    assert_eq!(&bytes[..4], b"MCFK");
    assert_eq!(bytes.len(), 40 + 5 + 1);
    assert_eq!(&bytes[40..45], b"alpha");
    assert!(path_for(dir.path(), "beta", 0).exists());
}

#[test]
fn foreign_misplaced_and_leftover_files_are_not_indexed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = open(dir.path());
        b.put_batch(&[("alpha", b"A"), ("beta", b"B")]);
        b.close().unwrap();
    }
    let alpha = path_for(dir.path(), "alpha", 0);
    // A valid record of "alpha" sitting at the path of another key (as a hash collision or a
    // misplaced copy would): its name does not match its key, so it is dropped.
    let gamma = path_for(dir.path(), "gamma", 0);
    std::fs::create_dir_all(gamma.parent().unwrap()).unwrap();
    std::fs::copy(&alpha, &gamma).unwrap();
    // A file named like ours with foreign content, a leftover temp file, and an unrelated file.
    let delta = path_for(dir.path(), "delta", 0);
    std::fs::create_dir_all(delta.parent().unwrap()).unwrap();
    std::fs::write(
        &delta,
        b"not a record at all, but long enough to hold a header......",
    )
    .unwrap();
    let tmp = alpha.with_extension("99.tmp");
    std::fs::write(&tmp, b"half-written").unwrap();
    let unrelated = alpha.parent().unwrap().join("README");
    std::fs::write(&unrelated, b"keep me").unwrap();

    let b = open(dir.path());
    let mut keys: Vec<String> = b.scan().into_iter().map(|o| o.key).collect();
    keys.sort();
    assert_eq!(keys, vec!["alpha", "beta"]);
    assert_eq!(get(&b, "alpha").unwrap(), b"A");
    assert!(
        !gamma.exists() && !delta.exists() && !tmp.exists(),
        "bad files are removed"
    );
    assert!(
        unrelated.exists(),
        "files with foreign names are left alone"
    );
}

#[test]
fn a_file_holding_another_key_is_caught_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.put_batch(&[("alpha", b"A"), ("beta", b"B")]);
    // Swap in beta's record under alpha's name while the backend is running.
    std::fs::copy(
        path_for(dir.path(), "beta", 0),
        path_for(dir.path(), "alpha", 0),
    )
    .unwrap();
    let err = get(&b, "alpha").unwrap_err();
    assert_eq!(err.code(), ErrorCode::FILE_READ_FAIL, "{err}");
    assert!(!b.exists("alpha"), "the bad record is dropped");
    assert_eq!(get(&b, "beta").unwrap(), b"B");
    drop(b);
    let b = open(dir.path());
    assert!(!b.exists("alpha"), "and stays dropped after a restart");
}
